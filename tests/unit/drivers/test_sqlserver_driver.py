"""SQL Server through the ODBC driver: the dialect's connection options for FreeTDS and ODBC
Driver 18 and its error numbers (bridge.dialects.sqlserver), turned into the bridge's exceptions
and pyodbc result handling by the driver (bridge.drivers.odbc).

pyodbc itself is replaced by a fake here: no SQL Server runs where these tests run.
"""

from __future__ import annotations

from typing import Any

import pyodbc
import pytest

from bridge.config.model import DatabaseConfig
from bridge.dialects import dialect_for
from bridge.dialects.sqlserver import NATIVE_ERRORS, SESSION_SETUP, sqlserver_connection_string
from bridge.drivers.odbc import OdbcConnection, _translate, parse_connection_string
from bridge.exceptions import (
    AlreadyExists,
    ConnectionFailed,
    ConnectionLost,
    DatabaseError,
    DatabaseReadOnly,
    DatabaseUnavailable,
    DuplicateKey,
    LockTimeout,
    PermissionDenied,
    TableNotFound,
    TransientDatabaseError,
)

# --------------------------------------------------------------------------------------------
# Connection strings
# --------------------------------------------------------------------------------------------


def _options(text: str) -> dict[str, str]:
    return {key.lower(): value for key, value in parse_connection_string(text)}


@pytest.mark.parametrize(
    "driver",
    ["{FreeTDS}", "FreeTDS", "/usr/lib/x86_64-linux-gnu/odbc/libtdsodbc.so", "{freetds}"],
)
def test_freetds_gets_utf8_and_a_tds_version_with_datetime2(driver: str) -> None:
    text = f"Driver={driver};Server=db;Port=1433;Database=sender;Uid=bridge;Pwd={{p;w}}"
    options = _options(sqlserver_connection_string(text))
    assert options["clientcharset"] == "UTF-8"
    assert options["tds_version"] == "7.4"
    assert options["pwd"] == "{p;w}"
    assert options["database"] == "sender"


@pytest.mark.parametrize(("given", "kept"), [("7.3", "7.3"), ("7.4", "7.4"), (" 7.4 ", "7.4")])
def test_a_tds_version_of_7_3_or_later_is_kept(given: str, kept: str) -> None:
    text = f"Driver={{FreeTDS}};Server=db;TDS_Version={given};ClientCharset=ISO-8859-1"
    options = _options(sqlserver_connection_string(text))
    assert options["tds_version"].strip() == kept
    assert options["clientcharset"] == "UTF-8"


@pytest.mark.parametrize("given", ["7.2", "7.1", "7.0", "8.0", "5.0", "auto", ""])
def test_an_older_or_unknown_tds_version_is_replaced(given: str) -> None:
    text = f"Driver={{FreeTDS}};Server=db;tds_version={given}"
    result = sqlserver_connection_string(text)
    assert _options(result)["tds_version"] == "7.4"
    assert result.lower().count("tds_version") == 1


@pytest.mark.parametrize(
    "text",
    [
        "Driver={ODBC Driver 18 for SQL Server};Server=db,1433;Database=x;Uid=u;Pwd=p;Encrypt=yes",
        "DSN=nsb;Uid=u;Pwd=p",
    ],
)
def test_microsoft_driver_and_dsn_strings_are_left_alone(text: str) -> None:
    assert sqlserver_connection_string(text) == text


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------

MS = "[Microsoft][ODBC Driver 18 for SQL Server][SQL Server]"
TDS = "[FreeTDS][SQL Server]"


def _error(state: str, text: str, native: int, more: str = "") -> pyodbc.Error:
    return pyodbc.Error(state, f"[{state}] {text} ({native}) (SQLExecDirectW){more}")


@pytest.mark.parametrize(
    ("error", "kind", "native", "detail"),
    [
        (
            _error(
                "42S02",
                f"{MS}Invalid object name 'dbo.Samples.Receiver'.",
                208,
                f"; [42000] {MS}Statement(s) could not be prepared. (8180)",
            ),
            TableNotFound,
            208,
            "Invalid object name 'dbo.Samples.Receiver'. (SQLSTATE 42S02, error 208)",
        ),
        (
            _error("42000", f"{TDS}Invalid object name 'q'.", 208),
            TableNotFound,
            208,
            "Invalid object name 'q'. (SQLSTATE 42000, error 208)",
        ),
        (
            _error("08004", f"{MS}Database 'receiver' does not exist.", 911),
            TableNotFound,
            911,
            "Database 'receiver' does not exist. (SQLSTATE 08004, error 911)",
        ),
        (
            _error("23000", f"{MS}Violation of PRIMARY KEY constraint 'PK_x'.", 2627),
            DuplicateKey,
            2627,
            "Violation of PRIMARY KEY constraint 'PK_x'. (SQLSTATE 23000, error 2627)",
        ),
        (
            _error("23000", f"{MS}Cannot insert duplicate key row in object 'x'.", 2601),
            DuplicateKey,
            2601,
            "Cannot insert duplicate key row in object 'x'. (SQLSTATE 23000, error 2601)",
        ),
        (
            _error(
                "23000",
                f"{MS}Cannot insert the value NULL into column 'Recoverable', table 'x'.",
                515,
            ),
            DatabaseError,
            515,
            "Cannot insert the value NULL into column 'Recoverable', table 'x'. "
            "(SQLSTATE 23000, error 515)",
        ),
        (
            _error("42S22", f"{MS}Invalid column name 'Recoverable'.", 207),
            DatabaseError,
            207,
            "Invalid column name 'Recoverable'. (SQLSTATE 42S22, error 207)",
        ),
        (
            _error("40001", f"{MS}Transaction (Process ID 57) was deadlocked.", 1205),
            TransientDatabaseError,
            1205,
            "Transaction (Process ID 57) was deadlocked. (SQLSTATE 40001, error 1205)",
        ),
        (
            _error("HY000", f"{MS}Lock request time out period exceeded.", 1222),
            LockTimeout,
            1222,
            "Lock request time out period exceeded. (SQLSTATE HY000, error 1222)",
        ),
        (
            _error("08S01", f"{MS}TCP Provider: Error code 0x68 (104)", 10054),
            ConnectionLost,
            10054,
            "TCP Provider: Error code 0x68 (104) (SQLSTATE 08S01, error 10054)",
        ),
        (
            _error("08S01", f"{TDS}Write to the server failed", 20006),
            ConnectionLost,
            20006,
            "Write to the server failed (SQLSTATE 08S01, error 20006)",
        ),
        (
            _error("08001", f"{MS}TCP Provider: No such host is known.", 11001),
            ConnectionLost,
            11001,
            "TCP Provider: No such host is known. (SQLSTATE 08001, error 11001)",
        ),
    ],
    ids=[
        "208-invalid-object",
        "208-freetds-42000",
        "911-no-such-catalog",
        "2627-primary-key",
        "2601-unique-index",
        "515-null-not-duplicate",
        "207-invalid-column",
        "1205-deadlock",
        "1222-lock-timeout",
        "08S01-link-failure",
        "08S01-freetds",
        "08001-reconnect-failed",
    ],
)
def test_sqlserver_errors_become_the_bridges_exceptions(
    error: pyodbc.Error, kind: type[DatabaseError], native: int, detail: str
) -> None:
    translated = _translate("receiver", error, NATIVE_ERRORS)
    assert type(translated) is kind
    assert translated.native_error == native
    assert translated.detail == detail
    assert str(translated) == f"database 'receiver': {detail}"


def test_postgresql_errors_carry_no_native_number() -> None:
    error = pyodbc.Error(
        "42P01",
        '[42P01] ERROR: relation "x" does not exist;\nError while executing the query (1) '
        "(SQLExecDirectW)",
    )
    translated = _translate("pg", error)
    assert type(translated) is TableNotFound
    assert translated.native_error is None
    assert translated.detail == 'relation "x" does not exist (SQLSTATE 42P01)'


def test_passwords_never_reach_the_error_text() -> None:
    error = _error("28000", f"{MS}Login failed for user 'bridge'. Pwd=hunter2-Sup3rSecret", 18456)
    assert "hunter2" not in str(_translate("db", error, NATIVE_ERRORS))


def test_the_sqlserver_error_numbers_the_driver_is_given() -> None:
    # Data of the dialect, not knowledge of the driver: the ODBC driver gets this map.
    assert dict(NATIVE_ERRORS) == {
        208: TableNotFound,
        911: TableNotFound,
        2601: DuplicateKey,
        2627: DuplicateKey,
        2714: AlreadyExists,
        1913: AlreadyExists,
        2759: AlreadyExists,
        262: PermissionDenied,
        2760: PermissionDenied,
        1088: PermissionDenied,
        229: PermissionDenied,
        230: PermissionDenied,
        1205: TransientDatabaseError,
        1222: LockTimeout,
        40197: TransientDatabaseError,
        40501: TransientDatabaseError,
        40613: TransientDatabaseError,
        3906: DatabaseReadOnly,
        927: DatabaseReadOnly,
        976: DatabaseReadOnly,
        978: DatabaseReadOnly,
        983: DatabaseReadOnly,
        942: DatabaseUnavailable,
        922: DatabaseUnavailable,
    }


@pytest.mark.parametrize("number", [2714, 262, 40613])
def test_a_mapped_number_decides_even_under_a_generic_sqlstate(number: int) -> None:
    error = _error("42000", f"{TDS}Something went wrong.", number)
    assert type(_translate("receiver", error, NATIVE_ERRORS)) is NATIVE_ERRORS[number]
    # Without the map (PostgreSQL's driver puts a meaningless number there), it is not read.
    translated = _translate("receiver", error)
    assert type(translated) is DatabaseError
    assert translated.native_error is None


# --------------------------------------------------------------------------------------------
# Results: row-count-only results are skipped, the session is set up once
# --------------------------------------------------------------------------------------------


class FakeCursor:
    """Plays back `results`: each is (rowcount, rows or None for a count-only result)."""

    def __init__(self, connection: FakeConnection) -> None:
        self.connection = connection
        self.results: list[tuple[int, list[tuple[Any, ...]] | None]] = []

    def execute(self, sql: str, *params: Any) -> FakeCursor:
        self.connection.statements.append((sql, params))
        self.results = list(self.connection.script.pop(0)) if self.connection.script else []
        return self

    @property
    def rowcount(self) -> int:
        return self.results[0][0] if self.results else -1

    @property
    def description(self) -> Any:
        return None if not self.results or self.results[0][1] is None else [("c",)]

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows = self.results[0][1]
        assert rows is not None
        return rows

    def nextset(self) -> bool:
        self.connection.nextsets += 1
        if self.results:
            self.results.pop(0)
        return bool(self.results)

    def close(self) -> None:
        pass


class FakeConnection:
    def __init__(self) -> None:
        self.statements: list[tuple[str, tuple[Any, ...]]] = []
        self.script: list[list[tuple[int, list[tuple[Any, ...]] | None]]] = []
        self.nextsets = 0
        self.commits = 0
        self.closed = False

    def cursor(self) -> FakeCursor:
        return FakeCursor(self)

    def execute(self, sql: str, *params: Any) -> FakeCursor:
        return self.cursor().execute(sql, *params)

    def commit(self) -> None:
        self.commits += 1

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_pyodbc(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {"connection": FakeConnection()}

    def connect(text: str, **kwargs: Any) -> FakeConnection:
        seen["string"] = text
        seen["kwargs"] = kwargs
        return seen["connection"]  # type: ignore[no-any-return]

    monkeypatch.setattr(pyodbc, "connect", connect)
    return seen


def _open(dialect: str = "sqlserver") -> OdbcConnection:
    """A connection opened as the dialect opens it (its options, session setup, errors)."""
    database = DatabaseConfig(
        "receiver",
        dialect,
        connection="Driver={FreeTDS};Server=db;Uid=u;Pwd=p",
        connect_timeout=5,
        driver="odbc" if dialect == "postgresql" else None,
    )
    connection = dialect_for(dialect).connect(database)
    assert isinstance(connection, OdbcConnection)
    return connection


def test_a_sqlserver_connection_sets_up_its_session_first(fake_pyodbc: dict[str, Any]) -> None:
    _open()
    fake = fake_pyodbc["connection"]
    assert [sql for sql, _ in fake.statements] == [*SESSION_SETUP, "SET LOCK_TIMEOUT 15000"]
    # The driver's own query timeout, a second above the lock timeout (query_timeout 15 s).
    assert fake.timeout == 16
    assert fake.commits == 1
    assert "ClientCharset=UTF-8" in fake_pyodbc["string"]
    assert fake_pyodbc["kwargs"] == {"autocommit": False, "timeout": 5}


def test_a_failing_session_setup_is_a_failed_connection(
    fake_pyodbc: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_pyodbc["connection"]

    def refuse(sql: str, *params: Any) -> Any:
        raise _error("42000", f"{MS}Incorrect syntax near 'SET'.", 102)

    monkeypatch.setattr(fake, "execute", refuse)
    with pytest.raises(ConnectionFailed, match="cannot set up the session: Incorrect syntax"):
        _open()
    assert fake.closed


def test_a_query_skips_row_count_results_in_front_of_its_result_set(
    fake_pyodbc: dict[str, Any],
) -> None:
    connection = _open()
    fake = fake_pyodbc["connection"]
    fake.script = [[(-1, None), (3, [(1,), (2,), (3,)]), (3, None)]]
    assert connection.query("DECLARE @x int = ?; SELECT ...", (1,)) == [(1,), (2,), (3,)]
    # ... and consumes what follows, so the connection is free for the next statement.
    fake.script = [[(0, None)]]
    assert connection.query("DELETE ... OUTPUT ...") == []


def test_execute_returns_the_first_row_count_and_drains_the_rest(
    fake_pyodbc: dict[str, Any],
) -> None:
    connection = _open()
    fake = fake_pyodbc["connection"]
    fake.script = [[(1, None), (-1, None)], [(0, None)]]
    before = fake.nextsets
    assert connection.execute("INSERT ... WHERE NOT EXISTS ...", ("m", "d")) == 1
    assert connection.execute("INSERT ... WHERE NOT EXISTS ...", ("m", "d")) == 0
    assert fake.nextsets - before == 3


def test_postgresql_connections_do_not_look_for_more_results(fake_pyodbc: dict[str, Any]) -> None:
    connection = _open("postgresql")
    fake = fake_pyodbc["connection"]
    fake.script = [[(2, None)]]
    assert connection.execute("UPDATE ...") == 2
    assert fake.nextsets == 0
    assert "Protocol=7.4-0" in fake_pyodbc["string"]
