"""The psycopg driver's pure parts: ODBC-style connection strings read as libpq parameters, and
the dialects' `?` placeholders rewritten for psycopg without touching quoted text."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config.load import load_config
from bridge.drivers.psycopg import libpq_parameters, pyformat_placeholders


def test_an_odbc_string_gives_the_libpq_parameters_and_drops_psqlodbc_options() -> None:
    assert libpq_parameters(
        "Driver={PostgreSQL Unicode};Server=db1;Port=5433;Uid=bridge;Pwd=s3cret;"
        "Database=receiver;SSLmode=require;Protocol=7.4-0;ByteaAsLongVarBinary=1;CommLog=0;"
    ) == {
        "host": "db1",
        "port": "5433",
        "user": "bridge",
        "password": "s3cret",
        "dbname": "receiver",
        "sslmode": "require",
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("SERVER=h;UID=u;DATABASE=d", {"host": "h", "user": "u", "dbname": "d"}),
        ("Servername=h;UserName=u;Password=p", {"host": "h", "user": "u", "password": "p"}),
        ("Server=h;Pwd={a;b=c}", {"host": "h", "password": "a;b=c"}),
        ("Server=h;Pwd={x}}y}", {"host": "h", "password": "x}y"}),
        ("Server = h ; Port = 5432 ;", {"host": "h", "port": "5432"}),
        (
            "postgresql://u@h:5432/d?sslmode=require",
            {"conninfo": "postgresql://u@h:5432/d?sslmode=require"},
        ),
        ("postgres://h/d", {"conninfo": "postgres://h/d"}),
        ("", {}),
    ],
)
def test_connection_string_forms(text: str, expected: dict[str, str]) -> None:
    assert libpq_parameters(text) == expected


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT ? , ?", "SELECT %s , %s"),
        ("SELECT '?' , ?", "SELECT '?' , %s"),
        ('SELECT * FROM "a?b" WHERE x = ?', 'SELECT * FROM "a?b" WHERE x = %s'),
        ("SELECT 'it''s ?', ?", "SELECT 'it''s ?', %s"),
        ('SELECT "say ""?"""', 'SELECT "say ""?"""'),
        ("SELECT ? || '%' FROM \"50%\"", "SELECT %s || '%%' FROM \"50%%\""),
        ("SELECT strpos(?, '|' || x || '|')", "SELECT strpos(%s, '|' || x || '|')"),
        ("no placeholders", "no placeholders"),
        (
            "SELECT * FROM unnest(?::uuid[], ?::timestamp[], ? :: bytea[], ?::text)",
            "SELECT * FROM unnest(%b::uuid[], %b::timestamp[], %s :: bytea[], %s::text)",
        ),
        ("SELECT ?::double precision[]", "SELECT %b::double precision[]"),
    ],
)
def test_placeholders_outside_quotes_become_psycopg_ones(sql: str, expected: str) -> None:
    assert pyformat_placeholders(sql) == expected


def _config(tmp_path: Path, database: str) -> Path:
    path = tmp_path / "sfbridge.yaml"
    path.write_text(
        "databases:\n"
        f"  a: {database}\n"
        "  b: {dialect: sqlite, path: b.db}\n"
        "forwarders: [{name: f, database: a, queue: q}]\n"
        "routes: [{match: '*', database: b}]\n"
    )
    return path


def test_driver_defaults_to_the_dialects_first(tmp_path: Path) -> None:
    config, _ = load_config(_config(tmp_path, "{dialect: postgresql, connection: 'Server=h'}"))
    assert config.databases["a"].driver is None  # the dialect's default: psycopg


@pytest.mark.parametrize(
    ("database", "message"),
    [
        (
            "{dialect: sqlite, path: a.db, driver: odbc}",
            "databases.a.driver: not used by sqlite databases; only postgresql databases have a "
            "choice of driver",
        ),
        (
            "{dialect: postgresql, connection: 'Server=h', driver: psycopg2}",
            "databases.a.driver: 'psycopg2' is not one of psycopg, odbc (did you mean 'psycopg'?)",
        ),
    ],
)
def test_driver_mistakes_are_named_with_their_key_path(
    tmp_path: Path, database: str, message: str
) -> None:
    from bridge.config.problems import ConfigError

    with pytest.raises(ConfigError) as raised:
        load_config(_config(tmp_path, database))
    assert message in str(raised.value)
