"""What a destination table's own failure settles, and tables found locked.

A write that fails for a reason of its table rather than of one message (the table is missing,
or another session kept it locked past the query timeout) fails every item bound for that
table (`item_failure`). A locked table counts as busy for a while (`OutageTracker.record_busy`):
its items fail at once instead of each batch waiting out the lock again
(`busy_tables`, `with_busy_items`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from fnmatch import fnmatchcase

from bridge.addressing import TableAddress
from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.exceptions import (
    DatabaseError,
    LockTimeout,
    PermissionDenied,
    TableNotFound,
)
from bridge.forwarding.writes import ItemWriteError
from bridge.messages import Delivered, DeliveryResult, Failed, Item
from bridge.outages import OutageTracker
from bridge.routing import BRIDGE_TABLE_PREFIX, Destination, nearest_table
from bridge.storage.grants import MissingRight, missing_insert_right


def item_failure(
    connection: Connection,
    dialect: Dialect,
    database: str,
    items: Sequence[Item],
    failure: ItemWriteError,
    not_suggested: Collection[str] = frozenset(),
) -> tuple[list[int], Failed]:
    """What an item-specific failure settles. A missing destination table fails every item
    bound for it (listing the tables for a hint through `connection`, which must be usable,
    never hinting at the bridge's own queues, `not_suggested`), and so does a table someone
    else kept locked past the query timeout; any other failure only the item that caused it."""
    error = failure.error
    denied = None
    if isinstance(error, PermissionDenied):
        address = items[failure.position].forward.destination.address
        denied = missing_insert_right(connection, dialect, address)
    if denied is None and not isinstance(error, (TableNotFound, LockTimeout)):
        return [failure.position], Failed(str(error), retryable=failure.retryable)
    destination = items[failure.position].forward.destination
    offsets = [
        offset
        for offset, (_, decision) in enumerate(items)
        if decision.destination.address == destination.address
    ]
    if denied is not None:
        return offsets, denied_queue_failure(
            dialect, database, destination.address, denied, error.detail
        )
    if isinstance(error, LockTimeout):
        return offsets, locked_table_failure(dialect, database, destination.address, error)
    return offsets, missing_queue_failure(connection, dialect, destination, not_suggested)


def denied_queue_failure(
    dialect: Dialect, database: str, address: TableAddress, lacking: MissingRight, detail: str
) -> Failed:
    """A Failed result for a destination table the bridge's login may not write, for every
    message bound for it (a DBA's decision, undone by the GRANT it names), retried as usual."""
    table = dialect.grammar.render(address)
    advice = f"; have a DBA run {lacking.grant}" if lacking.grant else ""
    return Failed(
        f"the bridge's login may not write rows into destination queue {table} in database "
        f"'{database}' ({detail}){advice}"
    )


def locked_table_failure(
    dialect: Dialect, database: str, address: TableAddress, error: DatabaseError
) -> Failed:
    """A Failed result for a destination table another session held locked: a state of the
    table, like an outage of its database (`retries.during_outage: wait` spends no attempt)."""
    return Failed(
        f"destination queue {dialect.grammar.render(address)} in database '{database}' is "
        f"locked by another session: {error.detail}",
        outage=True,
    )


def busy_tables(
    outages: OutageTracker,
    database: str,
    dialect: Dialect,
    items: Sequence[Item],
    ledger: TableAddress | None = None,
) -> dict[int, Failed]:
    """Items bound for a table that counts as busy (`OutageTracker.record_busy`), by offset,
    each with its Failed result: they are not tried while the lock lasts. Every item when
    `ledger`, written with each of them, counts as busy."""
    if ledger is not None and (lock := outages.busy(database, dialect.grammar.render(ledger))):
        failed = Failed(f"the dedup ledger is locked by another session: {lock}", outage=True)
        return dict.fromkeys(range(len(items)), failed)
    busy: dict[int, Failed] = {}
    known: dict[TableAddress, str | None] = {}
    for offset, (_, decision) in enumerate(items):
        address = decision.destination.address
        if address not in known:
            known[address] = outages.busy(database, dialect.grammar.render(address))
        error = known[address]
        if error is not None:
            busy[offset] = Failed(
                f"destination queue {dialect.grammar.render(address)} in database "
                f"'{database}' is locked by another session: {error}",
                outage=True,
            )
    return busy


def with_busy_items(
    outages: OutageTracker,
    database: str,
    dialect: Dialect,
    items: Sequence[Item],
    busy: dict[int, Failed] | None,
    tried_results: list[DeliveryResult],
) -> list[DeliveryResult]:
    """Every item's result, in order: `tried_results` for the items tried (all but `busy`,
    from `busy_tables`; None when the database was not `suspect`, so none was looked up),
    and the busy ones failed. Tables written to are no longer busy."""
    if busy is None and not outages.suspect(database):
        return tried_results
    busy = busy or {}
    tried = [offset for offset in range(len(items)) if offset not in busy]
    return _free_written(outages, database, dialect, items, tried, busy, tried_results)


def _free_written(
    outages: OutageTracker,
    database: str,
    dialect: Dialect,
    items: Sequence[Item],
    tried: list[int],
    busy: dict[int, Failed],
    tried_results: list[DeliveryResult],
) -> list[DeliveryResult]:
    """Every item's result, in order, after the tables some item was written to are recorded
    as free."""
    results: list[DeliveryResult | None] = [busy.get(offset) for offset in range(len(items))]
    for offset, result in zip(tried, tried_results, strict=True):
        results[offset] = result
    for address in {
        items[offset].forward.destination.address
        for offset, result in enumerate(results)
        if isinstance(result, Delivered)
    }:
        outages.record_free(database, dialect.grammar.render(address))
    return [result for result in results if result is not None]


def missing_queue_failure(
    connection: Connection,
    dialect: Dialect,
    destination: Destination,
    not_suggested: Collection[str] = frozenset(),
) -> Failed:
    """A Failed result for a destination table that does not exist, with a nearest-match hint
    among the tables the route allows (its glob, in the queue's schema, which the route
    allows): a sender who reads the error queue learns nothing of other tables. Never one of
    the bridge's own (its `sfbridge_*` tables, and `not_suggested`: the casefolded names of its
    queues there, a proxy queue among them, which a message meant for an endpoint must never be
    sent to)."""
    hint = ""
    database, address = destination.database, destination.address
    try:
        # The address lets SQL Server list the tables of the queue's catalog.
        listed = connection.query(dialect.sql("list_tables", queue=address))
        candidates = [
            str(row[1])
            for row in listed
            if str(row[1]).casefold() not in not_suggested
            and not str(row[1]).casefold().startswith(BRIDGE_TABLE_PREFIX)
            and (destination.match is None or fnmatchcase(str(row[1]), destination.match))
        ]
        suggestion = nearest_table(address.table, candidates)
        if suggestion and suggestion != address.table:
            hint = f" (did you mean {suggestion!r}?)"
    except DatabaseError:
        pass
    return Failed(
        f"destination queue {dialect.grammar.render(address)} does not exist in database "
        f"'{database}'{hint}; create it (run the receiving endpoint with installers enabled) "
        "or fix the route or the destination header",
        missing_queue=True,
    )


def note_busy(
    outages: OutageTracker,
    database: str,
    dialect: Dialect,
    items: Sequence[Item],
    failure: ItemWriteError,
) -> None:
    """A lock timeout on a destination table makes the table busy for a while."""
    if isinstance(failure.error, LockTimeout):
        address = items[failure.position].forward.destination.address
        outages.record_busy(database, dialect.grammar.render(address), failure.error.detail)
