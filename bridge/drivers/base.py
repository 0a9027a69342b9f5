"""The connection interface and the bridge's database exception types."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

Row = tuple[Any, ...]


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
        """Like `query`, each row as a dict keyed by lower-cased column name."""
        ...

    def query_columns(self, sql: str, params: Sequence[Any] = ()) -> tuple[list[str], list[Row]]:
        """Like `query`, with the result's column names (lower case) first."""
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
