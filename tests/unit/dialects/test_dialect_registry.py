"""The dialect registry (bridge.dialects.registry) and the capabilities the bridge reads from a
dialect instead of comparing its name: one dialect is one module."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyodbc
import pytest

import bridge
import bridge.dialects
from bridge.addressing import TableAddress
from bridge.config.model import BridgeConfig, DatabaseConfig, ForwarderConfig, RouteConfig
from bridge.config.schema import (
    DATABASES,
    DIALECTS,
    FILE_DIALECTS,
    SCHEMA_DIALECTS,
    SERVER_DIALECTS,
)
from bridge.config.validate import validate
from bridge.connections import connect
from bridge.daemon.runtime import worker_count
from bridge.dialects import STATEMENT_NAMES, Dialect
from bridge.dialects.base import OPTIONAL_STATEMENT_NAMES
from bridge.dialects.base.statements import BASE_STATEMENTS
from bridge.dialects.registry import (
    dialect_for,
    dialect_names,
    dialects,
    grammar_for,
)
from bridge.drivers.odbc import OdbcConnection
from bridge.drivers.sqlite import SqliteConnection
from bridge.exceptions import ConnectionFailed

# The dialects this version ships; the generic tests below cover any module added beside them.
KNOWN = ("postgresql", "sqlite", "sqlserver")
PACKAGE = Path(bridge.dialects.__file__).parent
BRIDGE = Path(bridge.__file__).parent

# --------------------------------------------------------------------------------------------
# Discovery
# --------------------------------------------------------------------------------------------


def _dialect_modules() -> dict[str, Any]:
    """Every module of bridge.dialects that defines DIALECT, by module name."""
    found = {}
    for info in pkgutil.iter_modules([str(PACKAGE)]):
        module = importlib.import_module(f"bridge.dialects.{info.name}")
        if hasattr(module, "DIALECT"):
            found[info.name] = module
    return found


def test_every_dialect_module_is_found_and_nothing_else() -> None:
    modules = _dialect_modules()
    assert set(KNOWN) <= set(modules)
    assert dialect_names() == tuple(sorted(modules)) == tuple(dialects())
    for name, module in modules.items():
        assert dialects()[name] is module.DIALECT
        assert dialect_for(name) is module.DIALECT


def test_each_dialect_is_named_like_its_module_and_its_grammar_says_so() -> None:
    for name, module in _dialect_modules().items():
        assert module.DIALECT.name == name
        assert module.DIALECT.grammar is module.GRAMMAR
        assert module.GRAMMAR.dialect == name
        assert grammar_for(name) is module.GRAMMAR


@pytest.mark.parametrize("name", dialect_names())
def test_every_dialect_defines_every_statement_and_a_complete_description(name: str) -> None:
    dialect = dialect_for(name)
    assert set(dialect.statements) - OPTIONAL_STATEMENT_NAMES == STATEMENT_NAMES
    assert dialect.title and dialect.locator in ("connection", "path")
    assert callable(dialect.connect)
    assert dialect.queue_indexed_columns
    assert set(dialect.queue_indexed_columns) <= dialect.queue_columns


# The SQL Server transport's queue shape, which SQLite borrows: it stays beside each dialect's
# queue DDL rather than in the base.
_SHARED_OUTSIDE_THE_BASE = {"send_many"}


def test_a_statement_two_dialects_write_alike_is_written_once_in_the_base() -> None:
    for name in set(STATEMENT_NAMES) - set(BASE_STATEMENTS) - _SHARED_OUTSIDE_THE_BASE:
        texts = [d.statements[name] for d in dialects().values() if name in d.statements]
        assert len(set(texts)) == len(texts), f"{name}: the same text in two dialects"


@pytest.mark.parametrize("name", sorted(BASE_STATEMENTS))
def test_each_base_statement_serves_at_least_two_dialects_unchanged(name: str) -> None:
    users = [d.name for d in dialects().values() if d.statements[name] == BASE_STATEMENTS[name]]
    assert len(users) >= 2, f"{name} is used as written by {users} only: move it to the dialect"


def test_the_registry_is_read_only() -> None:
    with pytest.raises(TypeError):
        dialects()["mysql"] = dialects()["postgresql"]  # type: ignore[index]


@pytest.mark.parametrize("name", ["mysql", "", "PostgreSQL", "sqlite3", "base", "registry"])
def test_an_unknown_dialect_is_a_key_error_listing_every_dialect(name: str) -> None:
    available = ", ".join(dialect_names())
    assert all(known in available for known in KNOWN)
    with pytest.raises(KeyError) as info:
        dialect_for(name)
    assert str(info.value) == f'"no dialect named {name!r} (available: {available})"'
    with pytest.raises(KeyError) as info:
        grammar_for(name)
    assert f"unknown SQL dialect {name!r}; expected one of: {available}" in str(info.value)


@pytest.fixture
def extra_dialects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder searched as part of bridge.dialects: a module written there is a new dialect
    module. The registry forgets what it found before and after."""
    monkeypatch.setattr(bridge.dialects, "__path__", [*bridge.dialects.__path__, str(tmp_path)])
    dialects.cache_clear()
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("bridge.dialects."):
            del sys.modules[name]
            if hasattr(bridge.dialects, name.rpartition(".")[2]):
                delattr(bridge.dialects, name.rpartition(".")[2])
    monkeypatch.undo()
    dialects.cache_clear()


NEW_DIALECT = """
import dataclasses

from bridge.dialects.postgresql import DIALECT as POSTGRESQL
from bridge.dialects.postgresql import PostgreSqlGrammar


class Grammar(PostgreSqlGrammar):
    dialect = "{name}"


OPENED = []


def connect(database, *, create=False):
    OPENED.append((database.name, create))
    return "a connection"


DIALECT = dataclasses.replace(
    POSTGRESQL, name="{name}", title="Example DB", grammar=Grammar(), connect=connect,
    single_writer=True,
)
"""


def test_a_new_module_defining_dialect_is_a_new_dialect(extra_dialects: Path) -> None:
    before = dialect_names()
    dialects.cache_clear()
    (extra_dialects / "example_db.py").write_text(NEW_DIALECT.format(name="example_db"))
    assert dialect_names() == tuple(sorted((*before, "example_db")))
    dialect = dialect_for("example_db")
    assert grammar_for("example_db").parse('"s"."t"') == TableAddress("t", "s")
    database = DatabaseConfig("edge", "example_db", connection="Driver=x")
    assert connect(database, create=True) == "a connection"
    assert sys.modules["bridge.dialects.example_db"].OPENED == [("edge", True)]
    config = BridgeConfig(
        databases={"edge": database},
        forwarders=(ForwarderConfig("f", "edge", "q", concurrency=4),),
        routes=(RouteConfig("*", "edge"),),
    )
    assert dialect.single_writer
    assert worker_count(config, config.forwarders[0]) == 1


def test_a_module_without_dialect_is_not_a_dialect(extra_dialects: Path) -> None:
    before = dialect_names()
    dialects.cache_clear()
    (extra_dialects / "helpers.py").write_text("VALUE = 1\n")
    assert dialect_names() == before
    assert "helpers" not in before


def test_a_dialect_that_is_not_a_dialect_object_is_refused(extra_dialects: Path) -> None:
    (extra_dialects / "broken.py").write_text("DIALECT = 'postgresql'\n")
    with pytest.raises(TypeError, match=r"bridge\.dialects\.broken\.DIALECT is a str"):
        dialects()


def test_two_modules_with_the_same_dialect_name_are_refused(extra_dialects: Path) -> None:
    (extra_dialects / "zz_copy.py").write_text(NEW_DIALECT.format(name="sqlite"))
    with pytest.raises(ValueError, match="two modules define the dialect 'sqlite'"):
        dialects()


# --------------------------------------------------------------------------------------------
# The configuration offers what the registry has
# --------------------------------------------------------------------------------------------


def test_the_configs_dialect_choices_are_the_registrys_names() -> None:
    key = DATABASES.key("dialect")
    assert key.choices == dialect_names() == DIALECTS
    assert key.unavailable == ()


def test_the_config_keys_of_a_database_follow_the_dialects_capabilities() -> None:
    by_locator = {
        locator: tuple(n for n, d in dialects().items() if d.locator == locator)
        for locator in ("connection", "path")
    }
    assert DATABASES.key("connection").dialects == SERVER_DIALECTS == by_locator["connection"]
    assert DATABASES.key("path").dialects == FILE_DIALECTS == by_locator["path"]
    assert DATABASES.key("schema").dialects == SCHEMA_DIALECTS
    assert tuple(n for n, d in dialects().items() if d.has_schemas) == SCHEMA_DIALECTS
    assert set(SERVER_DIALECTS) | set(FILE_DIALECTS) == set(dialect_names())
    # The hints name the other dialects (their words for today's three: tests/config/test_config).
    for name in FILE_DIALECTS:
        assert name in DATABASES.key("connection").dialect_hint
    for name in SERVER_DIALECTS:
        assert name in DATABASES.key("path").dialect_hint
    for name in set(dialect_names()) - set(SCHEMA_DIALECTS):
        assert name in DATABASES.key("schema").dialect_hint


@pytest.mark.parametrize("name", dialect_names())
def test_every_registered_dialect_is_accepted_by_the_config(name: str) -> None:
    location = (
        {"path": "/tmp/x.db"}
        if dialect_for(name).locator == "path"
        else {"connection": "DSN=x;Database=x"}
    )
    config, problems = validate(
        {
            "databases": {"db": {"dialect": name, **location}},
            "forwarders": [{"name": "f", "database": "db", "queue": "q"}],
            "routes": [{"match": "*", "database": "db"}],
        },
        {},
    )
    assert problems == []
    assert config is not None
    assert config.databases["db"].dialect == name


# --------------------------------------------------------------------------------------------
# Capabilities
# --------------------------------------------------------------------------------------------

CAPABILITIES = {
    # name: (title, locator, has_schemas, single_writer, keep_destination_connections)
    "postgresql": ("PostgreSQL", "connection", True, False, True),
    "sqlite": ("SQLite", "path", False, True, False),
    "sqlserver": ("SQL Server", "connection", True, False, True),
}


@pytest.mark.parametrize("name", KNOWN)
def test_capabilities(name: str) -> None:
    dialect = dialect_for(name)
    assert (
        dialect.title,
        dialect.locator,
        dialect.has_schemas,
        dialect.single_writer,
        dialect.keep_destination_connections,
    ) == CAPABILITIES[name]


@pytest.mark.parametrize("name", dialect_names())
def test_a_dialect_has_schemas_exactly_when_it_can_create_one(name: str) -> None:
    dialect = dialect_for(name)
    assert bool(dialect.statements["create_schema"]) is dialect.has_schemas
    assert (dialect.create_schema_sql("nsb") is not None) is dialect.has_schemas
    resolved = dialect.grammar.resolve(TableAddress("t"), "nsb", None)
    assert (resolved.schema == "nsb") is dialect.has_schemas


def _config(dialect: str, concurrency: int) -> BridgeConfig:
    database = DatabaseConfig("db", dialect, connection="DSN=x", path="/tmp/x.db")
    return BridgeConfig(
        databases={"db": database},
        forwarders=(ForwarderConfig("f", "db", "q", concurrency=concurrency),),
        routes=(RouteConfig("*", "db"),),
    )


@pytest.mark.parametrize("name", dialect_names())
def test_the_daemon_runs_one_worker_per_forwarder_on_a_single_writer_database(name: str) -> None:
    config = _config(name, 3)
    expected = 1 if dialect_for(name).single_writer else 3
    assert worker_count(config, config.forwarders[0]) == expected


def test_a_single_writer_or_schemaless_dialect_is_named_in_the_configs_messages() -> None:
    # What the config says for SQLite, word for word, comes from the dialect's data.
    config, problems = validate(
        {
            "databases": {"edge": {"dialect": "sqlite", "path": "/tmp/edge.db"}},
            "forwarders": [{"name": "f", "database": "edge", "queue": "q", "concurrency": 4}],
            "routes": [{"match": "*", "database": "edge", "schema": "nsb"}],
        },
        {},
    )
    assert config is None
    assert [str(problem) for problem in problems] == [
        "forwarders[0].concurrency: warning: SQLite serialises writers, so the bridge runs one "
        "worker for a sqlite database; concurrency 4 is ignored",
        "routes[0].schema: sqlite has no schemas (database 'edge' is sqlite)",
    ]


# --------------------------------------------------------------------------------------------
# Connecting is the dialect's job
# --------------------------------------------------------------------------------------------


def test_a_sqlite_database_opens_its_file_through_the_standard_library(tmp_path: Path) -> None:
    database = DatabaseConfig("edge", "sqlite", path=str(tmp_path / "edge.db"))
    with pytest.raises(ConnectionFailed):
        connect(database)
    connection = connect(database, create=True)
    try:
        assert isinstance(connection, SqliteConnection)
        assert connection.query("SELECT 1") == [(1,)]
    finally:
        connection.close()
    assert (tmp_path / "edge.db").exists()


@pytest.fixture
def fake_pyodbc(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    class FakeConnection:
        def execute(self, sql: str, *params: Any) -> None:
            seen.setdefault("setup", []).append(sql)

        def commit(self) -> None:
            pass

    def fake_connect(text: str, **kwargs: Any) -> FakeConnection:
        seen["string"] = text
        seen["kwargs"] = kwargs
        return FakeConnection()

    monkeypatch.setattr(pyodbc, "connect", fake_connect)
    return seen


def test_a_postgresql_database_with_driver_odbc_connects_with_the_psqlodbc_options(
    fake_pyodbc: dict[str, Any],
) -> None:
    database = DatabaseConfig(
        "central",
        "postgresql",
        connection="Driver={PostgreSQL Unicode};Protocol=7.4-1",
        driver="odbc",
    )
    connection = connect(database)
    assert isinstance(connection, OdbcConnection)
    assert fake_pyodbc["string"] == (
        "Driver={PostgreSQL Unicode};CommLog=0;Debug=0;"
        # libpq's keepalives and TCP user timeout, from query_timeout (15 s by default), and
        # the name pg_stat_activity shows.
        "pqopt={keepalives=1 keepalives_idle=5 keepalives_interval=2 keepalives_count=3 "
        "tcp_user_timeout=15000 application_name=sfbridge};"
        "Protocol=7.4-0;ByteaAsLongVarBinary=1;BoolsAsChar=0;"
    )
    assert fake_pyodbc["kwargs"] == {"autocommit": False, "timeout": 5}
    # The server-side halves of query_timeout: a lock wait gives up first, then a statement.
    assert fake_pyodbc["setup"] == [
        "SET lock_timeout = '15000ms'",
        "SET statement_timeout = '16000ms'",
    ]


def test_a_sqlserver_database_connects_through_odbc_with_its_session_setup(
    fake_pyodbc: dict[str, Any],
) -> None:
    from bridge.dialects.sqlserver import SESSION_SETUP

    database = DatabaseConfig("receiver", "sqlserver", connection="DSN=nsb", connect_timeout=2.0)
    connection = connect(database)
    assert isinstance(connection, OdbcConnection)
    assert fake_pyodbc["string"] == "DSN=nsb"
    assert fake_pyodbc["kwargs"] == {"autocommit": False, "timeout": 2}
    assert fake_pyodbc["setup"] == [*SESSION_SETUP, "SET LOCK_TIMEOUT 15000"]


def test_the_dialect_dataclass_has_the_capabilities_the_bridge_reads() -> None:
    fields = {field.name for field in dataclasses.fields(Dialect)}
    assert {"grammar", "connect", "locator", "has_schemas", "single_writer", "title"} <= fields
