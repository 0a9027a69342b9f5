"""Reading a table in Spark tasks: planned on the driver, read on the executors.

The driver asks the database for the table's size and the key of every n-th row, and cuts it
into `TableRange`s of about equal rows (`bridge.spark.ranges`); it holds those cuts, a few
thousand values at most, never rows. Each task reads its ranges through the dialect's own
driver, a page at a time in key order, one short read transaction per page, so that neither a
task nor the database holds a long snapshot, and a page's size follows the rows' bytes.

What is read: a queue's (seq, id, headers), retry storage's (seq, destination, attempts, first
failure, last error) for one forwarder, and the dedup ledger's (message id, destination) since a
time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from bridge.addressing import TableAddress
from bridge.connections import Connections
from bridge.dialects import dialect_for
from bridge.dialects.base import Dialect
from bridge.drivers import Connection
from bridge.drivers.base import Row
from bridge.spark.ranges import (
    FIRST_PAGE_ROWS,
    key_ranges,
    next_page_rows,
    rows_per_range,
    seq_ranges,
    task_count,
)
from bridge.spark.shipped import ShippedConfig

Kind = Literal["queue", "retry", "ledger"]
# Below every ledger key: ledger message ids and destinations are never empty (a message
# without an id is recorded under its row id).
LEDGER_START = ("", "")
EPOCH = datetime(1970, 1, 1)


@dataclass(frozen=True)
class TableRange:
    """One task's share of a table: rows whose key is after `after` and up to `up_to`.

    `label` says what the rows are to the caller (a destination, a forwarder); `forwarder`
    narrows retry storage to one forwarder's rows, `since` the ledger to entries since then.
    """

    database: str
    kind: Kind
    table: TableAddress
    after: Any
    up_to: Any
    label: str
    forwarder: str = ""
    since: datetime = EPOCH


# -- planning, on the driver ---------------------------------------------------------------


def plan_queue(
    connection: Connection,
    dialect: Dialect,
    database: str,
    queue: TableAddress,
    parallelism: int,
    label: str,
) -> tuple[int, list[TableRange]]:
    """(rows, ranges) of the queue table `queue`. Raises DatabaseError (TableNotFound)."""
    with _reading(connection):
        [(first, last, rows)] = connection.query(dialect.sql("queue_seq_bounds", queue=queue))
        cuts = _int_cuts(connection, dialect.sql("queue_seq_boundaries", queue=queue), (),
                         int(rows or 0), parallelism)  # fmt: skip
    if not rows:
        return 0, []
    ranges = seq_ranges(int(first), int(last), cuts)
    return int(rows), [
        TableRange(database, "queue", queue, after, up_to, label) for after, up_to in ranges
    ]


def plan_retry(
    connection: Connection,
    dialect: Dialect,
    database: str,
    retry: TableAddress,
    forwarder: str,
    parallelism: int,
) -> tuple[int, list[TableRange]]:
    """(rows, ranges) of `forwarder`'s rows in retry storage. Raises DatabaseError."""
    with _reading(connection):
        [(first, last, rows)] = connection.query(
            dialect.sql("retry_seq_bounds", retry=retry), (forwarder,)
        )
        cuts = _int_cuts(connection, dialect.sql("retry_seq_boundaries", retry=retry),
                         (forwarder,), int(rows or 0), parallelism)  # fmt: skip
    if not rows:
        return 0, []
    return int(rows), [
        TableRange(database, "retry", retry, after, up_to, forwarder, forwarder=forwarder)
        for after, up_to in seq_ranges(int(first), int(last), cuts)
    ]


def plan_ledger(
    connection: Connection,
    dialect: Dialect,
    database: str,
    ledger: TableAddress,
    since: datetime | None,
    parallelism: int,
) -> tuple[dict[str, int], list[TableRange]]:
    """(entries per destination, ranges) of the ledger since `since` (all without).
    Raises DatabaseError."""
    cutoff = since or EPOCH
    bound = dialect.encode_timestamp(cutoff)
    with _reading(connection):
        destinations = {
            str(destination): int(count)
            for destination, count in connection.query(
                dialect.sql("ledger_destinations_since", ledger=ledger), (bound,)
            )
        }
        rows = sum(destinations.values())
        if not rows:
            return {}, []
        [(last_id, last_destination)] = connection.query(
            dialect.sql("ledger_last_since", ledger=ledger), (bound,)
        )
        step = rows_per_range(rows, task_count(rows, parallelism))
        cuts = [
            (str(message_id), str(destination))
            for message_id, destination in connection.query(
                dialect.sql("ledger_boundaries_since", ledger=ledger), (bound, step)
            )
        ]
    last = (str(last_id), str(last_destination))
    return destinations, [
        TableRange(database, "ledger", ledger, after, up_to, database, since=cutoff)
        for after, up_to in key_ranges(LEDGER_START, last, cuts)
    ]


@contextmanager
def _reading(connection: Connection) -> Iterator[None]:
    """One read transaction: committed when the block ends, rolled back when it raises."""
    connection.begin_read()
    try:
        yield
    except BaseException:
        connection.rollback()
        raise
    connection.commit()


def _int_cuts(
    connection: Connection, sql: str, params: Sequence[Any], rows: int, parallelism: int
) -> list[int]:
    if rows <= 0:
        return []
    step = rows_per_range(rows, task_count(rows, parallelism))
    return [int(value) for (value,) in connection.query(sql, (*params, step))]


# -- reading, on the executors -------------------------------------------------------------


def read_ranges(
    shipped: ShippedConfig, ranges: Iterable[TableRange]
) -> Iterator[tuple[TableRange, Row]]:
    """Every row of each range, with its range, read page by page. Runs in a Spark task;
    one connection per database for the task. Raises DatabaseError."""
    config = shipped.load()
    connections = Connections(config.databases)
    try:
        for table_range in ranges:
            dialect = dialect_for(config.databases[table_range.database].dialect)
            connection = connections.get(table_range.database)
            for row in _pages(connection, dialect, table_range):
                yield table_range, row
    finally:
        connections.close()


def _pages(connection: Connection, dialect: Dialect, table_range: TableRange) -> Iterator[Row]:
    sql, params = _page_statement(dialect, table_range)
    after, size = table_range.after, FIRST_PAGE_ROWS
    while True:
        with _reading(connection):
            rows = connection.query(sql, params(after, size))
        yield from rows
        if len(rows) < size:
            return
        after = (rows[-1][0], rows[-1][1]) if table_range.kind == "ledger" else rows[-1][0]
        size = next_page_rows(len(rows), sum(_row_bytes(row) for row in rows))


def _page_statement(dialect: Dialect, table_range: TableRange) -> tuple[str, Any]:
    """The page query of the range's table and a function (after, page size) -> parameters."""
    up_to = table_range.up_to
    if table_range.kind == "queue":
        sql = dialect.sql("queue_page", queue=table_range.table)
        return sql, lambda after, size: (after, up_to, size)
    if table_range.kind == "retry":
        sql = dialect.sql("retry_page", retry=table_range.table)
        forwarder = table_range.forwarder
        return sql, lambda after, size: (forwarder, after, up_to, size)
    sql = dialect.sql("ledger_page_since", ledger=table_range.table)
    since = dialect.encode_timestamp(table_range.since)
    last_id, last_destination = up_to
    # The after key's and the last key's message id twice each: see `ledger_page_since`.
    return sql, lambda after, size: (
        (since, after[0], after[0], after[1], last_id, last_id, last_destination, size)
    )


def _row_bytes(row: Row) -> int:
    return sum(len(value) for value in row if isinstance(value, (str, bytes))) + 16
