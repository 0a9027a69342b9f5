"""PostgreSQL connection strings for failover: every libpq key passes through the ODBC-style
form to psycopg (directly) and to psqlODBC (in its `pqopt`), or is refused by name; nothing
is dropped without a word, and no message holds the string's values."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config.load import load_config
from bridge.drivers.libpq import (
    connection_problems,
    libpq_parameters,
    odbc_connection_string,
    parse_conninfo,
    render_conninfo,
)
from bridge.drivers.odbc import parse_connection_string
from bridge.exceptions import ConfigError

PAIR = "Driver={PostgreSQL Unicode};Server=10.0.0.1,10.0.0.2;Port=5432,5433;Uid=bridge;Pwd=s3cret;"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("target_session_attrs", "read-write"),
        ("target_session_attrs", "primary"),
        ("load_balance_hosts", "random"),
        ("hostaddr", "10.0.0.1,10.0.0.2"),
        ("keepalives_idle", "7"),
        ("sslmode", "verify-full"),
        ("sslrootcert", "/etc/ssl/root.crt"),
        ("options", "-c search_path=nsb"),
        ("passfile", "/etc/sfbridge/pgpass"),
    ],
)
def test_a_libpq_key_in_the_odbc_form_reaches_psycopg_and_psqlodbc(key: str, value: str) -> None:
    text = f"{PAIR}Database=receiver;{key}={{{value}}};"
    assert connection_problems(text, "psycopg") == []
    assert connection_problems(text, "odbc") == []
    parameters = libpq_parameters(text)
    assert parameters[key] == value
    # Server and Port lists are libpq's host and port lists as they are.
    assert parameters["host"] == "10.0.0.1,10.0.0.2" and parameters["port"] == "5432,5433"
    # psqlODBC ignores a libpq key outside pqopt (but SSLmode, which it reads itself): the
    # bridge moves it in.
    odbc = dict(parse_connection_string(odbc_connection_string(text, {"keepalives": "1"})))
    pqopt = dict(parse_conninfo(odbc["pqopt"][1:-1].replace("}}", "}")))
    if key == "sslmode":
        assert odbc[key] == f"{{{value}}}"
    else:
        assert pqopt[key] == value and key not in {k.lower() for k in odbc}
    # psqlODBC cuts a Port list short (9 characters): lists reach libpq through pqopt.
    assert pqopt["host"] == "10.0.0.1,10.0.0.2" and pqopt["port"] == "5432,5433"
    assert pqopt["keepalives"] == "1" and "Server" not in odbc and "Port" not in odbc
    assert odbc["Pwd"] == "s3cret"


def test_keys_are_read_in_any_case_and_by_their_odbc_names() -> None:
    parameters = libpq_parameters(
        "SERVER=h1,h2;UID=u;DATABASE=d;Target_Session_Attrs=read-write;LOAD_BALANCE_HOSTS=random"
    )
    assert parameters == {
        "host": "h1,h2",
        "user": "u",
        "dbname": "d",
        "target_session_attrs": "read-write",
        "load_balance_hosts": "random",
    }


def test_pqopt_written_for_psqlodbc_reaches_psycopg_too() -> None:
    text = "Server=h1,h2;Database=d;pqopt={target_session_attrs=read-write application_name='a b'}"
    assert libpq_parameters(text) == {
        "host": "h1,h2",
        "dbname": "d",
        "target_session_attrs": "read-write",
        "application_name": "a b",
    }
    assert connection_problems(text, "psycopg") == []


def test_a_single_server_and_port_stay_psqlodbc_keys() -> None:
    text = "Driver={PostgreSQL Unicode};Server=db1;Port=5432;target_session_attrs=primary"
    odbc = dict(parse_connection_string(odbc_connection_string(text, {})))
    assert odbc["Server"] == "db1" and odbc["Port"] == "5432"
    assert odbc["pqopt"] == "{target_session_attrs=primary}"


def test_the_odbc_form_keeps_the_users_pqopt_over_the_bridges_defaults() -> None:
    text = "Server=h;pqopt={keepalives_idle=9};target_session_attrs=read-write;"
    odbc = dict(
        parse_connection_string(odbc_connection_string(text, {"keepalives_idle": "5", "x": "1"}))
    )
    assert odbc["pqopt"] == "{x=1 keepalives_idle=9 target_session_attrs=read-write}"


def test_a_url_passes_as_it_is() -> None:
    url = "postgresql://u@h1:5432,h2:5433/d?target_session_attrs=read-write"
    assert libpq_parameters(url) == {"conninfo": url}
    assert connection_problems(url, "psycopg") == []


@pytest.mark.parametrize(
    ("text", "key", "says"),
    [
        ("Server=h;connect_timeout=3", "connect_timeout", "connect_timeout key instead"),
        ("Server=h;pqopt={connect_timeout=3}", "pqopt: connect_timeout", "connect_timeout key"),
        ("Server=h;replication=database", "replication", "ordinary session"),
        ("Server=h;pqopt={host=x}", "pqopt: host", "outside pqopt too (as Server)"),
        ("Server=h;host=x", "host", "says again what Server says"),
        ("Server=h;pqopt={target_sesion_attrs=x}", "pqopt: target_sesion_attrs", "did you mean"),
        ("Server=h;pqopt={a='unclosed}", "pqopt", "not libpq's key=value form"),
    ],
)
@pytest.mark.parametrize("driver", ["psycopg", "odbc"])
def test_what_the_bridge_refuses_is_named_with_what_to_do(
    text: str, key: str, says: str, driver: str
) -> None:
    [problem] = connection_problems(text, driver)
    assert problem.error and problem.key == key and says in problem.message


@pytest.mark.parametrize("driver", ["psycopg", "odbc"])
def test_an_unknown_key_is_a_warning_with_the_key_it_resembles(driver: str) -> None:
    [problem] = connection_problems("Server=h;target_session_atrs=read-write", driver)
    assert not problem.error
    assert problem.key == "target_session_atrs"
    assert "did you mean 'target_session_attrs'" in problem.message


def test_psqlodbc_options_are_no_problem() -> None:
    text = "Driver={x};Protocol=7.4-0;ByteaAsLongVarBinary=1;CommLog=0;UseDeclareFetch=1;A6=1"
    assert connection_problems(text, "psycopg") == []
    assert libpq_parameters(text) == {}


def test_conninfo_values_round_trip_with_quotes() -> None:
    options = {"a": "plain", "b": "two words", "c": "it's", "d": "back\\slash", "e": ""}
    assert dict(parse_conninfo(render_conninfo(options))) == options


def test_config_load_refuses_a_key_by_name_without_showing_the_string(tmp_path: Path) -> None:
    path = tmp_path / "sfbridge.yaml"
    path.write_text(
        "databases:\n"
        "  sender:\n"
        "    dialect: postgresql\n"
        f"    connection: '{PAIR}connect_timeout=3'\n"
        "forwarders: [{name: f, database: sender, queue: q}]\n"
        "routes: [{match: '*', database: sender}]\n"
    )
    with pytest.raises(ConfigError) as raised:
        load_config(str(path))
    text = str(raised.value)
    assert "databases.sender.connection: connect_timeout is not taken from" in text
    assert "s3cret" not in text and "10.0.0.1" not in text


@pytest.mark.parametrize("driver", ["{ODBC Driver 18 for SQL Server}", "{FreeTDS}"])
def test_sql_server_failover_keys_reach_the_odbc_driver_untouched(driver: str) -> None:
    from bridge.dialects.sqlserver import sqlserver_connection_string

    text = (
        f"Driver={driver};Server=tcp:ag-listener,1433;Database=nsb;MultiSubnetFailover=Yes;"
        "Failover_Partner=mirror;Uid=bridge;Pwd=s3cret;"
    )
    pairs = dict(parse_connection_string(sqlserver_connection_string(text)))
    assert pairs["MultiSubnetFailover"] == "Yes" and pairs["Failover_Partner"] == "mirror"
    assert pairs["Server"] == "tcp:ag-listener,1433"
