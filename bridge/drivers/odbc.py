"""pyodbc connections, for any database with an ODBC driver.

What differs from database to database is given by the dialect that opens the connection
(`bridge.dialects.<name>.connect`): the options its connection string must carry, statements
that set up each session, which of the server's native error numbers mean which of the
bridge's exception types, and whether its statements yield extra row-count-only results.
SQLSTATEs, which ODBC standardises, are classified here for every database.

pyodbc is imported lazily so that the SQLite-only demo runs on a machine without unixODBC.
"""

from __future__ import annotations

import configparser
import math
import os
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bridge.drivers.base import Row
from bridge.drivers.sqlstates import classify, connect_failure
from bridge.exceptions import (
    ConnectionFailed,
    DatabaseError,
    DatabaseUnavailable,
    ValueNotConvertible,
)
from bridge.secrets import mask_secrets

# A server's native error numbers -> the bridge's exception types, for errors whose number
# says more than their SQLSTATE (see `OdbcConnection`).
NativeErrors = Mapping[int, type[DatabaseError]]

MAX_CACHED_CURSORS = 64

_NATIVE_ERROR = re.compile(r"\((-?\d+)\)\s*\(SQL\w+\)")

_PAIR = re.compile(r"\s*([^=;]+?)\s*=\s*(\{(?:[^}]|\}\})*\}|[^;]*)\s*(?:;|$)")


def parse_connection_string(text: str) -> list[tuple[str, str]]:
    """Split an ODBC connection string into (key, value) pairs; braced values stay braced."""
    return [(key, value) for key, value in _PAIR.findall(text) if key.strip()]


def with_required_options(text: str, required: dict[str, str]) -> str:
    """Return the connection string with `required` options set, replacing any user value."""
    lowered = {key.lower() for key in required}
    pairs = [(k, v) for k, v in parse_connection_string(text) if k.lower() not in lowered]
    pairs.extend(required.items())
    return ";".join(f"{key}={value}" for key, value in pairs) + ";"


def with_default_options(text: str, defaults: dict[str, str]) -> str:
    """Return the connection string with `defaults` added where the user set no value."""
    pairs = parse_connection_string(text)
    given = {key.lower() for key, _ in pairs}
    missing = [(key, value) for key, value in defaults.items() if key.lower() not in given]
    if not missing:
        return text
    return ";".join(f"{key}={value}" for key, value in [*pairs, *missing]) + ";"


def driver_log_switches(connection_string: str) -> tuple[str, str, list[str]] | None:
    """Where unixODBC's driver registry turns the connection's driver's own logging on:
    (odbcinst.ini path, driver section, the switches that are on), or None.

    psqlODBC reads `CommLog` and `Debug` from its odbcinst.ini section when the driver loads,
    before it sees the connection string, and then leaves a log file per process in /tmp even
    when the string turns them off (Debian ships `CommLog=1`). Only the registry can stop that.
    """
    driver = next(
        (
            value
            for key, value in parse_connection_string(connection_string)
            if key.strip().lower() == "driver"
        ),
        None,
    )
    if driver is None:
        return None
    folder = os.environ.get("ODBCSYSINI", "/etc")
    path = os.path.join(folder, os.environ.get("ODBCINSTINI", "odbcinst.ini"))
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError):
        return None
    section = driver.strip().strip("{}")
    if not parser.has_section(section):
        return None
    switches = [
        name
        for name in ("CommLog", "Debug")
        if parser.get(section, name, fallback="0").strip() not in ("", "0")
    ]
    return (path, section, switches) if switches else None


def login_of(connection_string: str) -> str | None:
    """The user name an ODBC connection string logs in with (`Uid`, `User ID`, `User`,
    `Username`), or None."""
    for key, value in parse_connection_string(connection_string):
        if key.lower().replace(" ", "") in ("uid", "userid", "user", "username") and value:
            return value[1:-1] if value.startswith("{") and value.endswith("}") else value
    return None


def _state_and_message(error: Exception) -> tuple[str, str]:
    args: tuple[Any, ...] = tuple(getattr(error, "args", ()))
    if len(args) >= 2 and isinstance(args[0], str):
        return args[0], str(args[1])
    return "", str(error)


def _clean(message: str) -> str:
    # pyodbc appends driver call details ("Error while executing the query (1)
    # (SQLExecDirectW)") and prefixes "[42P01] ERROR:"; people need the server's sentence.
    # SQL Server's drivers prefix "[Microsoft][ODBC Driver 18 for SQL Server][SQL Server]" and
    # append "(208) (SQLExecDirectW)" and further records on the same line.
    first = message.split(";\n")[0].split("\n")[0]
    first = re.sub(r"^(\[[^\]]*\]\s*)+", "", first)
    first = re.sub(r"^ERROR:\s*", "", first)
    first = _NATIVE_ERROR.split(first, maxsplit=1)[0]
    return first.rstrip(";").strip() or message.strip()


def _native_error(message: str) -> int | None:
    match = _NATIVE_ERROR.search(message)
    return int(match.group(1)) if match else None


def _translate(
    database: str, error: Exception, native_errors: NativeErrors | None = None
) -> DatabaseError:
    """The bridge's exception for a pyodbc error. With `native_errors` (not None), the
    server's error number is read from the message, reported, and classified by that map."""
    state, message = _state_and_message(error)
    native = _native_error(message) if native_errors is not None else None
    message = mask_secrets(_clean(message))
    text = f"{message} (SQLSTATE {state})" if state else message
    if native is not None:
        text = f"{message} (SQLSTATE {state}, error {native})"
    kind = native_errors.get(native) if native_errors is not None and native is not None else None
    translated = classify(database, state, kind, message, text)
    translated.native_error = native
    return translated


def load_driver() -> None:
    """Import pyodbc now rather than inside the first connection of each thread. Raises
    ImportError (also when the system's ODBC driver manager, libodbc, is missing)."""
    import pyodbc  # noqa: F401  lazy: see the module docstring


class OdbcConnection:
    """A pyodbc connection with autocommit off: always inside a transaction."""

    binds_arrays = False
    copies_rows = False
    listens = False

    def __init__(
        self,
        database: str,
        connection_string: str,
        *,
        timeout: float,
        session_setup: Sequence[str] = (),
        native_errors: NativeErrors | None = None,
        drain_extra_results: bool = False,
        query_timeout: float | None = None,
    ):
        """Connect with `connection_string` as given (the dialect has added what it needs).

        `session_setup` statements run once, before anything else. `native_errors`: None when
        the driver's native error numbers mean nothing (psqlODBC reports the query's number
        there); otherwise the server's numbers are reported with each error, kept as
        `DatabaseError.native_error`, and those in the map raise the mapped type.
        `drain_extra_results`: statements may yield row-count-only results around their result
        set (one per statement of a batch); they are skipped, so the connection is free for the
        next statement. `query_timeout`: the driver's own timeout for every statement
        (SQL_ATTR_QUERY_TIMEOUT, whole seconds; SQL Server's drivers enforce it on the client,
        so a silent server cannot hold a call; psqlODBC has none). Raises ConnectionFailed
        (AuthenticationFailed when the server refused the login).
        """
        import pyodbc  # lazy: see the module docstring

        self.database = database
        pyodbc.native_uuid = True  # uuid columns as uuid.UUID, not upper-case strings
        self._native_errors = native_errors
        self._drain = drain_extra_results
        try:
            self._connection = pyodbc.connect(
                connection_string, autocommit=False, timeout=max(1, round(timeout))
            )
        except pyodbc.Error as error:
            state, message = _state_and_message(error)
            text = f"cannot connect: {mask_secrets(_clean(message))} (SQLSTATE {state})"
            raise connect_failure(
                database, state, message, text, login_of(connection_string)
            ) from None
        try:
            if query_timeout is not None:
                self._connection.timeout = max(1, math.ceil(query_timeout))
            for statement in session_setup:
                self._connection.execute(statement)
            self._connection.commit()
        except pyodbc.Error as error:
            self._connection.close()
            failure = _translate(database, error, native_errors)
            raise ConnectionFailed(
                database, f"cannot set up the session: {failure.detail}"
            ) from None
        self._pyodbc_error = pyodbc.Error
        self._broken = False
        # One cursor per SQL text: psqlODBC prepares a statement per cursor, so a new cursor
        # for every execution re-prepares every time (about 8x slower per statement).
        self._cursors: OrderedDict[str, Any] = OrderedDict()

    def begin(self) -> None:
        """ODBC connections with autocommit off are always inside a transaction."""

    def begin_read(self) -> None:
        """As `begin`: always inside a transaction."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        try:
            cursor = self._cursor_for(sql)
            cursor.execute(sql, *params)
            count = int(cursor.rowcount)
            if self._drain:
                while cursor.nextset():
                    pass
            return count
        except self._pyodbc_error as error:
            raise _translate(self.database, error, self._native_errors) from None

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        batch = [tuple(row) for row in rows]
        if not batch:
            return
        try:
            self._cursor_for(sql).executemany(sql, batch)
        except self._pyodbc_error as error:
            raise _translate(self.database, error, self._native_errors) from None

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self._fetch(sql, params)[1]

    def query_named(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        names, rows = self._fetch(sql, params)
        return [dict(zip(names, row, strict=True)) for row in rows]

    def query_columns(self, sql: str, params: Sequence[Any] = ()) -> tuple[list[str], list[Row]]:
        """pyodbc cannot hand back a value it fails to convert (it fails the row, whose values
        are then lost): that raises ValueNotConvertible, and the claim reads the same rows
        again as raw bytes (the dialects' `*_raw` claims)."""
        return self._fetch(sql, params)

    def _fetch(self, sql: str, params: Sequence[Any]) -> tuple[list[str], list[Row]]:
        """The column names (lower case) and rows of the statement's result set. Raises
        ValueNotConvertible when the driver or pyodbc cannot convert a value."""
        try:
            cursor = self._cursor_for(sql)
            cursor.execute(sql, *params)
            if self._drain:
                while cursor.description is None and cursor.nextset():
                    pass
            # psqlODBC gives no result set at all for a RETURNING that matched zero rows.
            if cursor.description is None:
                names, rows = [], []
            else:
                names = [column[0].lower() for column in cursor.description]
                rows = [tuple(row) for row in cursor.fetchall()]
            if self._drain:
                while cursor.nextset():
                    pass
            return names, rows
        except self._pyodbc_error as error:
            raise _translate(self.database, error, self._native_errors) from None
        except (ValueError, OverflowError) as error:  # UnicodeDecodeError is a ValueError
            raise ValueNotConvertible(
                self.database, f"a value of the result cannot be converted: {error}"
            ) from None

    def _cursor_for(self, sql: str) -> Any:
        cursor = self._cursors.get(sql)
        if cursor is None:
            cursor = self._connection.cursor()
            self._cursors[sql] = cursor
            if len(self._cursors) > MAX_CACHED_CURSORS:
                _, oldest = self._cursors.popitem(last=False)
                oldest.close()
        else:
            self._cursors.move_to_end(sql)
        return cursor

    def execute_outside_transaction(self, sql: str) -> int:
        try:
            self._connection.rollback()
            self._connection.autocommit = True
            try:
                cursor = self._connection.cursor()
                try:
                    return int(cursor.execute(sql).rowcount)
                finally:
                    cursor.close()
            finally:
                self._connection.autocommit = False
        except self._pyodbc_error as error:
            raise _translate(self.database, error, self._native_errors) from None

    def copy_rows(self, sql: str, types: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        raise DatabaseError(self.database, "COPY is not available through ODBC")

    def listen(self, channels: Sequence[str]) -> None:
        raise DatabaseError(self.database, "this driver does not listen for notifications")

    def notifications(self, timeout: float) -> set[str]:
        raise DatabaseError(self.database, "this driver does not listen for notifications")

    def column_types(self, sql: str) -> list[str]:
        raise DatabaseError(self.database, "column types are not read through ODBC")

    def commit(self) -> None:
        """Raises the DatabaseError family. A link that fails during the commit is taken as
        `outcome_unknown`: an ODBC driver does not say whether the COMMIT reached the server."""
        try:
            self._connection.commit()
        except self._pyodbc_error as error:
            failure = _translate(self.database, error, self._native_errors)
            if isinstance(failure, DatabaseUnavailable):
                failure.outcome_unknown = True
            raise failure from None

    def rollback(self) -> None:
        try:
            self._connection.rollback()
        except self._pyodbc_error:
            self._broken = True

    def close(self) -> None:
        try:
            self._connection.close()
        except self._pyodbc_error:
            pass
