"""pyodbc connections: PostgreSQL through psqlODBC, SQL Server through Microsoft's ODBC Driver
18 or FreeTDS.

pyodbc is imported lazily so that the SQLite-only demo runs on a machine without unixODBC.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from bridge.drivers.base import (
    AlreadyExists,
    ConnectionFailed,
    ConnectionLost,
    DatabaseError,
    DuplicateKey,
    PermissionDenied,
    QueueNotFound,
    Row,
    TransientDatabaseError,
)
from bridge.secrets import mask_secrets

# psqlODBC options the bridge needs for correctness, whatever the user's string or DSN says:
# Protocol=7.4-0 gives native rollback semantics (the default silently wraps every statement
# in a savepoint, 7.4-1 silently drops work); ByteaAsLongVarBinary=0 corrupts bodies over 255
# bytes; BoolsAsChar=0 returns booleans as booleans.
POSTGRESQL_REQUIRED_OPTIONS = {
    "Protocol": "7.4-0",
    "ByteaAsLongVarBinary": "1",
    "BoolsAsChar": "0",
}

# FreeTDS options the bridge needs for correctness: a TDS version of at least 7.3 (below it,
# datetime2 arrives as text and the max types are sent as the old text types) and UTF-8 as
# the client character set (otherwise text outside the client's code page is lost). Microsoft's
# ODBC Driver 18 needs nothing added; its Encrypt / TrustServerCertificate settings are a
# security decision left to the connection string.
FREETDS_REQUIRED_OPTIONS = {"ClientCharset": "UTF-8"}
FREETDS_TDS_VERSION = "7.4"
_FREETDS_GOOD_TDS_VERSION = re.compile(r"^7\.([3-9])$")

MAX_CACHED_CURSORS = 64

# 08001 mid-session: Driver 18's connection resiliency failed to reconnect a broken link.
_CONNECTION_LOST_STATES = {
    "08S01",
    "08001",
    "08003",
    "08007",
    "57P01",
    "57P02",
    "57P03",
    "HYT00",
    "HYT01",
}
_CONNECT_FAILED_STATES = {"08001", "08004", "28000", "28P01", "IM002", "IM003", "3D000"}
_TRANSIENT_STATES = {"40001", "40P01", "55P03", "57014"}
_MISSING_TABLE_STATES = {"42P01", "42S02"}
_DUPLICATE_STATES = {"23505"}
# 42P07 duplicate table (and index), 42P06 duplicate schema, 42710 duplicate object.
_ALREADY_EXISTS_STATES = {"42P07", "42P06", "42710"}
_PERMISSION_DENIED_STATES = {"42501"}

# SQL Server error numbers, where they say more than the SQLSTATE (23000 is every integrity
# violation; FreeTDS reports many errors as 42000). 911: database (catalog) does not exist;
# 1222: lock request timed out; 40197, 40501, 40613: Azure SQL's "try again".
_SQLSERVER_MISSING_TABLE = {208, 911}
_SQLSERVER_DUPLICATE = {2601, 2627}
_SQLSERVER_TRANSIENT = {1205, 1222, 40197, 40501, 40613}
# 2714: there is already an object named ...; 1913: an index with that name exists;
# 2759: CREATE SCHEMA failed because the schema exists.
_SQLSERVER_ALREADY_EXISTS = {2714, 1913, 2759}
# 262: permission denied in database (CREATE TABLE); 2760: schema missing or no permission;
# 1088: cannot find the object or no permission (CREATE INDEX); 229/230: object permission.
_SQLSERVER_PERMISSION_DENIED = {262, 2760, 1088, 229, 230}
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


def sqlserver_connection_string(text: str) -> str:
    """Return the SQL Server connection string with what its driver needs for correctness.

    Only a string that names the FreeTDS driver (`Driver={FreeTDS}` or a path to
    libtdsodbc.so) gets options added; with a DSN, set them in odbc.ini.
    """
    pairs = parse_connection_string(text)
    driver = next((value for key, value in pairs if key.strip().lower() == "driver"), "")
    if not any(name in driver.lower() for name in ("freetds", "tdsodbc")):
        return text
    required = dict(FREETDS_REQUIRED_OPTIONS)
    version = next((v for k, v in pairs if k.strip().lower() == "tds_version"), "")
    if not _FREETDS_GOOD_TDS_VERSION.match(version.strip()):
        required["TDS_Version"] = FREETDS_TDS_VERSION
    return with_required_options(text, required)


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


def _translate(database: str, error: Exception, *, sqlserver: bool = False) -> DatabaseError:
    state, message = _state_and_message(error)
    native = _native_error(message) if sqlserver else None
    message = mask_secrets(_clean(message))
    text = f"{message} (SQLSTATE {state})" if state else message
    if native is not None:
        text = f"{message} (SQLSTATE {state}, error {native})"
    translated = _classify(database, state, native, message, text)
    translated.native_error = native
    return translated


def _classify(
    database: str, state: str, native: int | None, message: str, text: str
) -> DatabaseError:
    if native in _SQLSERVER_MISSING_TABLE or state in _MISSING_TABLE_STATES:
        return QueueNotFound(database, text)
    if native in _SQLSERVER_DUPLICATE or state in _DUPLICATE_STATES:
        return DuplicateKey(database, text)
    if native in _SQLSERVER_ALREADY_EXISTS or state in _ALREADY_EXISTS_STATES:
        return AlreadyExists(database, text)
    if native in _SQLSERVER_PERMISSION_DENIED or state in _PERMISSION_DENIED_STATES:
        return PermissionDenied(database, text)
    if native in _SQLSERVER_TRANSIENT or state in _TRANSIENT_STATES:
        return TransientDatabaseError(database, text)
    if state in _CONNECTION_LOST_STATES or ("connection" in message.lower() and "lost" in message):
        return ConnectionLost(database, text)
    return DatabaseError(database, text)


class OdbcConnection:
    """A pyodbc connection with autocommit off: always inside a transaction."""

    def __init__(
        self,
        database: str,
        connection_string: str,
        *,
        dialect: str,
        timeout: float,
        session_setup: Sequence[str] = (),
    ):
        """Connect; `session_setup` statements run once, before anything else. Raises
        ConnectionFailed."""
        import pyodbc  # lazy: see the module docstring

        self.database = database
        pyodbc.native_uuid = True  # uuid columns as uuid.UUID, not upper-case strings
        if dialect == "postgresql":
            connection_string = with_required_options(
                connection_string, POSTGRESQL_REQUIRED_OPTIONS
            )
        # SQL Server batches can yield row-count-only results around a result set (one per
        # statement); they are skipped, so the connection is free for the next statement.
        self._sqlserver = dialect == "sqlserver"
        if self._sqlserver:
            connection_string = sqlserver_connection_string(connection_string)
        try:
            self._connection = pyodbc.connect(
                connection_string, autocommit=False, timeout=max(1, round(timeout))
            )
        except pyodbc.Error as error:
            state, message = _state_and_message(error)
            raise ConnectionFailed(
                database, f"cannot connect: {mask_secrets(_clean(message))} (SQLSTATE {state})"
            ) from None
        try:
            for statement in session_setup:
                self._connection.execute(statement)
            self._connection.commit()
        except pyodbc.Error as error:
            self._connection.close()
            failure = _translate(database, error, sqlserver=self._sqlserver)
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

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        try:
            cursor = self._cursor_for(sql)
            cursor.execute(sql, *params)
            count = int(cursor.rowcount)
            if self._sqlserver:
                while cursor.nextset():
                    pass
            return count
        except self._pyodbc_error as error:
            raise _translate(self.database, error, sqlserver=self._sqlserver) from None

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        batch = [tuple(row) for row in rows]
        if not batch:
            return
        try:
            self._cursor_for(sql).executemany(sql, batch)
        except self._pyodbc_error as error:
            raise _translate(self.database, error, sqlserver=self._sqlserver) from None

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self._fetch(sql, params)[1]

    def query_named(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        names, rows = self._fetch(sql, params)
        return [dict(zip(names, row, strict=True)) for row in rows]

    def _fetch(self, sql: str, params: Sequence[Any]) -> tuple[list[str], list[Row]]:
        """The column names (lower case) and rows of the statement's result set."""
        try:
            cursor = self._cursor_for(sql)
            cursor.execute(sql, *params)
            if self._sqlserver:
                while cursor.description is None and cursor.nextset():
                    pass
            # psqlODBC gives no result set at all for a RETURNING that matched zero rows.
            if cursor.description is None:
                names, rows = [], []
            else:
                names = [column[0].lower() for column in cursor.description]
                rows = [tuple(row) for row in cursor.fetchall()]
            if self._sqlserver:
                while cursor.nextset():
                    pass
            return names, rows
        except self._pyodbc_error as error:
            raise _translate(self.database, error, sqlserver=self._sqlserver) from None

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

    def commit(self) -> None:
        try:
            self._connection.commit()
        except self._pyodbc_error as error:
            raise _translate(self.database, error, sqlserver=self._sqlserver) from None

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
