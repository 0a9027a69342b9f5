"""The connection interface and the bridge's database exception types."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

Row = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A value the driver could not turn into a Python value, in place of that value.

    `raw` is what the driver received, where it can tell (bytes as the server sent them), and
    `reason` says why it could not convert them (e.g. `timestamp too large (after year 10K)`,
    `invalid UTF-8 at byte 12`). Only `Connection.query_columns` (and `query_named`) hand these
    out, so that one bad value fails its own row, not the whole result.
    """

    raw: bytes | None
    reason: str


class DatabaseError(Exception):
    """A database operation failed. The message never contains connection secrets.

    `native_error` is the server's own error number where the driver reports one that means
    something (SQL Server's, e.g. 207 invalid column name), else None.
    """

    native_error: int | None = None

    def __init__(self, database: str, message: str) -> None:
        super().__init__(f"database '{database}': {message}")
        self.database = database
        self.detail = message


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached (it is down, or the network is)."""


class ConnectionFailed(DatabaseUnavailable):
    """Opening a connection failed. Not retried in-process: the database is probably down."""


class ConnectionLost(DatabaseUnavailable):
    """An open connection broke mid-session. Worth one immediate retry on a new connection."""


class TransientDatabaseError(DatabaseError):
    """Deadlock, serialization failure, lock timeout: retrying the transaction will likely work."""


class QueryTimeout(DatabaseUnavailable):
    """The database did not answer within the connection's deadline (`query_timeout`): the
    server is silent (a partition, a frozen host) or too slow. The connection is closed; what it
    was doing is unknown, as after a lost connection, but it is not worth an immediate retry."""


class LockTimeout(DatabaseError):
    """A statement waited longer than the connection's deadline for a lock someone else holds
    on a table (an `ALTER TABLE`, a `VACUUM FULL`, a migration): the table is busy, not the
    database. Not worth an immediate retry either: the wait was already the whole deadline."""


class ValueNotConvertible(DatabaseError):
    """The server could not send a value in the client's encoding (PostgreSQL: text of a
    `SQL_ASCII` database that is not valid UTF-8, read through psqlODBC). The same rows can be
    read as raw bytes (the dialects' `*_raw` claim statements)."""


class QueueNotFound(DatabaseError):
    """A table the statement needs does not exist."""


class UndefinedObject(DatabaseError):
    """A named object other than a table does not exist (e.g. a prepared transaction that was
    committed or rolled back meanwhile)."""


class NotSupported(DatabaseError):
    """The object does not take this kind of statement (PostgreSQL: `COPY` into a view, or into
    a table with row-level security): the same rows go in another way."""


class DuplicateKey(DatabaseError):
    """A unique key or primary key was violated."""


class AlreadyExists(DatabaseError):
    """CREATE found the table, index or schema already there (a racing creator made it)."""


class PermissionDenied(DatabaseError):
    """The login may not do this (e.g. create a table): a DBA's decision, not an outage."""


class Connection(Protocol):
    """One open connection with one transaction at a time.

    `begin` starts a transaction explicitly (SQLite needs `BEGIN IMMEDIATE`; ODBC connections
    are always in a transaction, so it is a no-op there). Every method raises the exception
    types above, never a driver exception.
    """

    database: str
    # Whether the driver binds a Python list as one SQL array parameter (psycopg does): the
    # dialects then write many rows with one `*_arrays` statement of fixed text.
    binds_arrays: bool
    # Whether `copy_rows` works (psycopg: PostgreSQL's binary COPY); where it does not, the
    # dialects' multi-row statements write the rows.
    copies_rows: bool

    def begin(self) -> None: ...

    def begin_read(self) -> None:
        """Start a transaction that only reads (SQLite: without taking the write lock, which
        the forwarding database's open batch may hold)."""
        ...

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...

    def query_named(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Like `query_columns`, each row as a dict keyed by lower-cased column name."""
        ...

    def query_columns(self, sql: str, params: Sequence[Any] = ()) -> tuple[list[str], list[Row]]:
        """Like `query`, with the result's column names (lower case) first. A value the driver
        cannot convert comes back as `Unreadable` instead of failing the result: these read
        message rows, which hold whatever a sender wrote."""
        ...

    def execute_outside_transaction(self, sql: str) -> int:
        """Run a statement that may not run inside a transaction block (`COMMIT PREPARED`),
        without parameters. Any open transaction is rolled back first; none is left open."""
        ...

    def copy_rows(self, sql: str, types: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        """Stream `rows` with the `COPY ... FROM STDIN` statement `sql`, each column dumped as
        the type named in `types`, inside the open transaction. Only where `copies_rows`."""
        ...

    def column_types(self, sql: str) -> list[str]:
        """The type names (the server's, e.g. `uuid`, `varchar`) of the columns the query
        `sql` returns, inside the open transaction. Only where `copies_rows`."""
        ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def close(self) -> None: ...
