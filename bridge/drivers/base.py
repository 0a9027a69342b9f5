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
    # Whether `listen` and `notifications` work (psycopg: PostgreSQL's LISTEN/NOTIFY); where
    # they do not, the daemon polls.
    listens: bool

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

    def listen(self, channels: Sequence[str]) -> None:
        """Be told of NOTIFY on `channels` (names the bridge derives: letters, digits, `_`),
        from now on, on this connection; commits. Only where `listens`."""
        ...

    def notifications(self, timeout: float) -> set[str]:
        """The channels notified since the last call (received meanwhile, also during other
        statements), waiting up to `timeout` s for the first when there are none. Outside a
        transaction only. Only where `listens`; raises ConnectionLost when the connection
        broke."""
        ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def close(self) -> None: ...
