"""Delivery into queues of the forwarding database itself, inside the open source transaction
(in a savepoint), so that one commit makes receive and send atomic and no ledger is needed
(`bridge.forwarding.deliver` has the deliveries into other databases)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from bridge.connections import savepoint
from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.forwarding.isolation import Isolation
from bridge.forwarding.table_failures import (
    busy_tables,
    item_failure,
    note_busy,
    with_busy_items,
)
from bridge.forwarding.transactions import BatchTransactions
from bridge.forwarding.writes import ItemWriteError, NotIsolated, QueueWriter, write_messages
from bridge.messages import DeliveryResult, Failed, Item
from bridge.outages import OutageTracker


class LocalDelivery:
    """Into queues of the forwarding database, inside the open source transaction."""

    independent = False  # it writes through the source connection

    def __init__(
        self,
        connection: Connection,
        dialect: Dialect,
        writer: QueueWriter,
        outages: OutageTracker,
        not_suggested: Collection[str] = frozenset(),
    ) -> None:
        self._connection = connection
        self._dialect = dialect
        self._writer = writer
        self._outages = outages
        self._not_suggested = not_suggested  # see `missing_queue_failure`

    def deliver(
        self, items: Sequence[Item], transactions: BatchTransactions
    ) -> list[DeliveryResult]:
        """Raises the DatabaseError family for failures of the forwarding database itself."""
        database = self._connection.database
        busy = None
        if self._outages.suspect(database):  # a table of it was found locked lately
            busy = busy_tables(self._outages, database, self._dialect, items)
        tried = items if busy is None else [items[o] for o in range(len(items)) if o not in busy]
        isolation = Isolation(tried)
        while (pending := isolation.pending()) is not None:
            try:
                isolation.succeeded(self._attempt(pending, isolation.one_by_one))
            except NotIsolated:
                isolation.not_isolated()
            except ItemWriteError as failure:
                isolation.failed(*self._item_failure(pending, failure))
        return with_busy_items(
            self._outages, database, self._dialect, items, busy, isolation.results()
        )

    def _attempt(self, items: Sequence[Item], one_by_one: bool) -> dict[int, DeliveryResult]:
        with savepoint(self._connection, self._dialect, undo_on=(NotIsolated, ItemWriteError)):
            return write_messages(
                self._connection,
                self._dialect,
                self._writer,
                items,
                ledger=None,
                one_by_one=one_by_one,
            )

    def _item_failure(
        self, items: Sequence[Item], failure: ItemWriteError
    ) -> tuple[list[int], Failed]:
        self._connection.execute(self._dialect.statements["rollback_to_savepoint"])
        settled = item_failure(
            self._connection,
            self._dialect,
            self._connection.database,
            items,
            failure,
            self._not_suggested,
        )
        note_busy(self._outages, self._connection.database, self._dialect, items, failure)
        return settled
