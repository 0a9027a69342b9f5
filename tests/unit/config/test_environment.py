"""`${VAR}` resolved where it is used: a variable that is not set leaves its value
`Unresolved`, an error only for what needs it, and no secret, expanded or written in the file,
reaches a repr or an error's text."""

from __future__ import annotations

import pickle
import re
from typing import Any

import pytest
from support import REPO

from bridge.config import BridgeConfig, validate
from bridge.config.catalogs import database_catalog
from bridge.config.environment import ENVIRONMENT_FILE, Unresolved, expand_references
from bridge.connections import Connections, connect
from bridge.exceptions import UnsetVariable, UnsetVariables

REPO = REPO

EXPANDED = "expanded-Sup3rSecret"  # a password from the environment
WRITTEN = "written-Sup3rSecret"  # a password written in the file
DSN_KEY = "dsnsecret0123456789abcdef01234567"
SECRETS = (EXPANDED, WRITTEN, DSN_KEY)


def config(raw: dict[str, Any], env: dict[str, str]) -> BridgeConfig:
    built, problems = validate(raw, env)
    assert built is not None, [str(p) for p in problems]
    return built


def document(**databases: dict[str, Any]) -> dict[str, Any]:
    return {
        "databases": {
            "sender": {"dialect": "postgresql", "connection": "Server=db1;Uid=bridge"},
            **databases,
        },
        "forwarders": [{"name": "sender", "database": "sender", "queue": "forward"}],
        "routes": [{"match": "*", "database": "sender"}],
    }


def with_every_kind_of_secret() -> BridgeConfig:
    """A receiver whose host variable is unset (its password from the environment is in the
    part that was expanded), an edge whose literal password stays beside an unset variable,
    a billing database fully expanded and a Sentry DSN with its secret key."""
    raw = document(
        receiver={
            "dialect": "postgresql",
            "connection": "Server=${RECEIVER_HOST};Uid=bridge;Pwd=${RECEIVER_PASSWORD}",
        },
        edge={
            "dialect": "postgresql",
            "connection": f"Server=${{EDGE_HOST}};Uid=bridge;Pwd={WRITTEN}",
        },
        billing={
            "dialect": "postgresql",
            "connection": "postgresql://bridge:${RECEIVER_PASSWORD}@db3/billing",
        },
    )
    raw["sentry"] = {"dsn": "${SENTRY_DSN}"}
    return config(
        raw,
        {
            "RECEIVER_PASSWORD": EXPANDED,
            "SENTRY_DSN": f"https://public:{DSN_KEY}@o1.ingest.sentry.io/1",
        },
    )


def test_an_unset_variable_stands_as_a_mark_and_is_named_once() -> None:
    expansion = expand_references("a=${A};b=${B};c=${B:-x};d=$${B}", {"A": "1"})
    assert expansion.unset == ("B",)
    assert expansion.errors == ()
    assert expansion.text == "a=1;b=\x00;c=x;d=${B}"


def test_no_secret_appears_in_a_repr_or_str_of_the_configuration() -> None:
    loaded = with_every_kind_of_secret()
    shown = [repr(loaded), str(loaded), repr(loaded.sentry)]
    for database in loaded.databases.values():
        shown += [repr(database), str(database), repr(database.unresolved)]
    for text in shown:
        for secret in SECRETS:
            assert secret not in text, text
    # The masking hides the value, not the database: the host and the user stay readable.
    assert "Server=db1;Uid=bridge" in repr(loaded.databases["sender"])
    assert "postgresql://bridge:***@db3/billing" in repr(loaded.databases["billing"])


def test_no_secret_appears_in_the_errors_of_unset_variables() -> None:
    loaded = with_every_kind_of_secret()
    raised: list[BaseException] = []
    for name in ("receiver", "edge"):
        with pytest.raises(UnsetVariable) as error:
            connect(loaded.databases[name])
        raised.append(error.value)
    with pytest.raises(UnsetVariables) as every:
        loaded.require_environment("run")
    raised.append(every.value)
    for error in raised:
        texts = [str(error), repr(error), *(str(arg) for arg in error.args)]
        texts += [str(getattr(error, name, "")) for name in ("detail", "advice", "problem")]
        for text in texts:
            for secret in SECRETS:
                assert secret not in text, text


def test_connecting_without_the_variable_names_it_the_database_and_the_environment_file() -> None:
    loaded = with_every_kind_of_secret()
    connections = Connections(loaded.databases)
    with pytest.raises(UnsetVariable) as raised:
        connections.get("receiver")
    error = raised.value
    assert error.database == "receiver"
    assert error.variables == ("RECEIVER_HOST",)
    assert error.problem == (
        "cannot connect: environment variable RECEIVER_HOST is not set "
        "(databases.receiver.connection names it)"
    )
    assert error.advice is not None
    assert (
        f"reads it from {ENVIRONMENT_FILE} (EnvironmentFile=; add it there if missing)"
        in error.advice
    )
    assert f"(set -a; . {ENVIRONMENT_FILE}; set +a; sfbridge ...)" in error.advice
    # Never on a command line, where every local user could read the secrets in `ps`.
    assert "$(cat" not in error.advice


def test_the_daemon_is_told_every_unset_value_at_once() -> None:
    with pytest.raises(UnsetVariables) as raised:
        with_every_kind_of_secret().require_environment("run")
    assert raised.value.unset == (
        ("databases.receiver.connection", ("RECEIVER_HOST",)),
        ("databases.edge.connection", ("EDGE_HOST",)),
    )
    assert f"reads them from {ENVIRONMENT_FILE}" in raised.value.advice


def test_an_unresolved_database_pickles_for_worker_processes() -> None:
    receiver = with_every_kind_of_secret().databases["receiver"]
    assert pickle.loads(pickle.dumps(receiver)) == receiver


def sqlserver(connection: str, **keys: str) -> dict[str, Any]:
    return {"dialect": "sqlserver", "connection": connection, **keys}


def test_a_catalog_the_connection_string_names_is_known_without_the_password() -> None:
    loaded = config(
        document(receiver=sqlserver("Server=sql2;Database=ReceiverDb;Pwd=${RECEIVER_PASSWORD}")),
        {},
    )
    assert database_catalog(loaded.databases["receiver"]) == "ReceiverDb"


def test_a_catalog_inside_an_unset_variable_is_asked_for_only_when_needed() -> None:
    loaded = config(document(receiver=sqlserver("${RECEIVER_ODBC}")), {})
    with pytest.raises(UnsetVariable, match=r"cannot read its catalog .* RECEIVER_ODBC"):
        database_catalog(loaded.databases["receiver"])
    given = config(document(receiver=sqlserver("${RECEIVER_ODBC}", catalog="ReceiverDb")), {})
    assert database_catalog(given.databases["receiver"]) == "ReceiverDb"


def test_the_environment_file_is_the_one_the_shipped_unit_reads() -> None:
    unit = (REPO / "systemd" / "sfbridge.service").read_text()
    assert re.findall(r"^EnvironmentFile=-?(\S+)$", unit, re.M) == [ENVIRONMENT_FILE]
    example = (REPO / "systemd" / "sfbridge.env.example").read_text()
    assert example.startswith(f"# {ENVIRONMENT_FILE}:")


def test_unresolved_shows_where_and_what_but_not_the_rest_of_the_value() -> None:
    value = Unresolved("databases.x.connection", ("P",), f"Pwd={EXPANDED};Server=\x00")
    assert repr(value) == "Unresolved(key_path='databases.x.connection', variables=('P',))"
