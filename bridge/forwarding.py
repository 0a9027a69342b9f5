"""The data path's spine: claim -> classify -> deliver -> settle -> commit.

One call of `BatchForwarder.forward_batch` is one source transaction:

1. claim up to `batch_size` rows (`bridge.claim`: a destructive, uncommitted DELETE with
   row locks that skip what other workers hold);
2. classify each row (`bridge.classify`: poison, expired, rejected, deliverable to a routed
   destination, or a published event, which `bridge.multicast` expands into one unit per
   subscriber copy);
3. deliver the units, grouped per destination database (`bridge.deliver`): the forwarding
   database's own queues inside the source transaction, other databases in their own
   transaction, committed first with the dedup ledger (`transaction: ledger`), prepared
   (`two-phase`) or committed without a ledger (`at-least-once`);
4. settle every unit (`bridge.settle`): count it, or write it to retry storage or the error
   queue, in the same source transaction;
5. commit the source transaction. Only now are the rows gone from where they were; then
   commit what was prepared (`bridge.transactions`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar

from bridge.claim import claim_batch, claim_limit
from bridge.classify import classify
from bridge.config.model import BridgeConfig, ForwarderConfig, TransactionMode
from bridge.connections import Connections
from bridge.deliver import Delivery, LocalDelivery, RemoteDelivery, Target, deliver_units
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import Connection, DatabaseError, PermissionDenied, QueueNotFound
from bridge.ledger import RUNTIME_DDL_OFF_ADVICE, cannot_create_advice, ledger_address
from bridge.messages import ClaimedMessage, Decision, Poison, Publish, Source, Unit
from bridge.multicast import PublishedEvents
from bridge.observers import ForwardingObserver, safe_observer
from bridge.outages import OutageTracker
from bridge.pauses import PauseBoard, PausedDelivery, PauseState, read_pauses
from bridge.proxies import forwarder_router
from bridge.queue_writes import QueueWriter
from bridge.settle import Settlement
from bridge.subscriptions import SubscriberDirectory
from bridge.tables import (
    BridgeTableMissing,
    create_tables,
    forwarder_table_steps,
    forwarder_tables,
    owned_table,
    upgrade_retry_table,
)
from bridge.transactions import BatchTransactions, SourceFailed

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class BatchReport:
    """What one batch did; counts by outcome."""

    claimed: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    # The claim stopped at its row limit or its byte budget rather than at the end of what it
    # could take: there is probably more, so forward again without waiting.
    full: bool = False


class BatchForwarder:
    """Forwards batches for one forwarder. One instance per worker thread.

    A daemon shares one outage tracker (and its prober) and one queue writer across its
    workers; standalone use gets its own, where the first attempt after the probe interval is
    the probe.
    """

    def __init__(
        self,
        config: BridgeConfig,
        forwarder: ForwarderConfig,
        connections: Connections,
        *,
        slot: int = 0,
        outages: OutageTracker | None = None,
        writer: QueueWriter | None = None,
        observer: ForwardingObserver | None = None,
    ) -> None:
        self.config = config
        self.forwarder = forwarder
        self.connections = connections
        self.slot = slot
        source_database = config.databases[forwarder.database]
        self.dialect: Dialect = dialect_for(source_database.dialect)
        self.tables = forwarder_tables(config, forwarder)
        self.router = forwarder_router(config, forwarder)
        self.published = PublishedEvents(
            forwarder.name,
            self.dialect,
            self.tables,
            self.router,
            SubscriberDirectory(config, forwarder.database),
        )
        self._outages = outages or OutageTracker(probe_interval(config))
        self._pauses = PauseBoard(forwarder.slow_poll_interval)
        self._writer = writer or QueueWriter()
        # Rows the next claim locks, per source, from the sizes the last one saw.
        self._claim_limits: dict[Source, int] = {}
        self._observer = safe_observer(observer)
        self._remote: dict[tuple[str, TransactionMode], RemoteDelivery] = {}
        self._batch: BatchTransactions | None = None
        self._store: str | None = None  # the forwarding database's id in two-phase gids
        self._retry_table_checked = False
        self._next_unhealed_log = 0.0

    # -- the data path -------------------------------------------------------------------

    def forward_batch(
        self, source: Source = "queue", *, seq_range: tuple[int, int] | None = None
    ) -> BatchReport:
        """Forward one batch from the forwarding queue or from due retries.

        `seq_range` (first, last) limits a queue batch to rows whose sequence column lies in
        it: a bulk drain's share of the queue.

        A missing table the bridge owns in the forwarding database is created (unless
        `install.at_runtime` is false) and the batch tried once more. Raises DatabaseError
        only for failures of the forwarding database itself (BridgeTableMissing for a table
        that could not be created); the source transaction is then rolled back and every
        claimed row is back where it was.
        """
        self.pause_state()
        self._observer.batch_started(self.forwarder.name)
        started = time.monotonic()
        report: BatchReport | None = None
        try:
            report = self._healing(lambda: self._forward_batch_once(source, seq_range))
        finally:
            self._observer.batch_finished(
                self.forwarder.name,
                source,
                0 if report is None else report.claimed,
                None if report is None else report.counts,
                time.monotonic() - started,
            )
        noted, self.published.missing_table = self.published.missing_table, None
        if noted is not None:
            try:
                self.heal_forwarding_tables(noted)
            except DatabaseError as error:
                # Only what status shows is missing; the batch itself is done.
                self._note_unhealed(error)
        return report

    def pause_state(self) -> PauseState:
        """The forwarder's pauses (`sfbridge pause`), read again once per
        `forwarder.slow_poll_interval`."""
        if self._pauses.stale():
            connection = self.connections.get(self.forwarder.database)
            self._pauses.update(
                self._healing(
                    lambda: read_pauses(connection, self.dialect, self.tables, self.forwarder.name)
                )
            )
        return self._pauses.state

    def queue_estimate(self) -> int:
        """How many rows the forwarding queue holds, roughly (the transport's cheap peek: rows
        other workers hold are counted too). Heals a missing queue like `forward_batch`."""
        return self._healing(self._peek)

    def _peek(self) -> int:
        connection = self.connections.get(self.forwarder.database)
        try:
            with owned_table("forwarding queue", self.tables.queue_canonical):
                estimate = connection.query(self.dialect.sql("peek", queue=self.tables.queue))
            connection.commit()
        except BaseException:
            connection.rollback()
            raise
        return int(estimate[0][0] or 0)

    def _healing(self, attempt: Callable[[], T]) -> T:
        """`attempt()`; when it finds one of the forwarder's tables missing, create what is
        missing and try once more. Raises BridgeTableMissing (with advice) when not allowed."""
        try:
            return attempt()
        except BridgeTableMissing as missing:
            if not missing.healable:
                raise
            created = self.heal_forwarding_tables(missing)
        try:
            return attempt()
        except BridgeTableMissing as again:
            if created or not again.healable:
                raise
            # Nothing was missing when looked for (another worker had just created it), yet
            # the table is still not found: a name that differs only in case, say.
            raise again.with_advice(
                "the bridge found nothing to create: check the table's name and case with "
                "'sfbridge check'"
            ) from None

    def _note_unhealed(self, error: DatabaseError) -> None:
        now = time.monotonic()
        if now >= self._next_unhealed_log:
            log.warning("forwarder '%s': %s", self.forwarder.name, error)
            self._next_unhealed_log = now + 600

    def _forward_batch_once(self, source: Source, seq_range: tuple[int, int] | None) -> BatchReport:
        connection = self.connections.get(self.forwarder.database)
        try:
            if source == "retry" and not self._retry_table_checked:
                self._upgrade_retry_table(connection)
            connection.begin()
            now = _utcnow()
            limit = self._claim_limits.get(source, self.forwarder.batch_size)
            claimed = claim_batch(
                connection,
                self.dialect,
                self.tables,
                self.forwarder,
                source,
                now=now,
                policy=self.config.retries,
                waiting_databases=self._waiting_databases(),
                seq_range=seq_range,
                limit=limit,
            )
            sizes = [m.claimed_size for m in claimed]
            if claimed:
                self._claim_limits[source] = claim_limit(self.forwarder, sizes)
            full = len(claimed) >= limit or sum(sizes) >= self.forwarder.batch_bytes
            report = BatchReport(claimed=len(claimed), full=full)
            claimed_at = time.monotonic()
            committed_locally = 0
            self._batch = BatchTransactions(
                connection,
                self.dialect,
                self.tables.transactions,
                self.forwarder.name,
                self.connections,
                self.forwarder.database,
                store=self._store,
            )
            if claimed:
                units = [unit for message in claimed for unit in self._units(connection, message)]

                def delivered(database: str, count: int) -> None:
                    nonlocal committed_locally
                    if database == self.forwarder.database:
                        committed_locally += count  # committed with the source, below
                    elif count:
                        self._observer.delivered(database, count, time.monotonic() - claimed_at)

                try:
                    results = deliver_units(
                        units,
                        lambda database, mode: self._delivery(connection, database, mode),
                        delivered,
                        self._outages.suspect,
                    )
                except SourceFailed as failed:
                    raise failed.error from None
                settlement = Settlement(
                    connection,
                    self.dialect,
                    self.forwarder,
                    self.tables,
                    slot=self.slot,
                    now=now,
                    writer=self._writer,
                )
                report.counts = settlement.settle(
                    units, results, self.config.retries, self.config.publish.no_subscribers
                )
            connection.commit()
            self._store = self._batch.store
            if self._batch.prepared:
                self._batch.commit_prepared(self._destination_dialects())
            if committed_locally:
                self._observer.delivered(
                    self.forwarder.database, committed_locally, time.monotonic() - claimed_at
                )
            return report
        except BridgeTableMissing:
            connection.rollback()
            raise
        except DatabaseError:
            self.connections.discard(self.forwarder.database)
            raise
        except BaseException:
            connection.rollback()
            raise

    def _units(self, connection: Connection, message: ClaimedMessage) -> list[Unit]:
        """One unit per message, or per subscriber copy of a published event."""
        decision = self._classify(message)
        if isinstance(decision, Publish):
            return self.published.units(connection, message, decision)
        return [Unit(message, decision, message.headers_text or "")]

    def _classify(self, message: ClaimedMessage) -> Decision:
        try:
            return classify(message, self.router)
        except Exception as error:
            # A bug must not turn one message into a queue-blocking loop: the batch would roll
            # back and be claimed again forever. This message goes to the error queue instead.
            log.exception("message %s could not be classified", message.row_id)
            return Poison(f"sfbridge could not process the message: {error!r}")

    def _waiting_databases(self) -> list[str]:
        """Databases whose messages stay in retry storage: paused ones, and with
        `retries.during_outage: wait` those in trouble."""
        waiting = list(self._pauses.state.destinations)
        if self.config.retries.during_outage == "wait":
            waiting += [d for d in self._outages.waiting_databases() if d not in waiting]
        return waiting

    def _destination_dialects(self) -> dict[str, Dialect]:
        return {name: dialect_for(d.dialect) for name, d in self.config.databases.items()}

    def _delivery(self, connection: Connection, database: str, mode: TransactionMode) -> Delivery:
        pause = self._pauses.state.destinations.get(database)
        if pause is not None:
            return PausedDelivery(database, pause)
        if database == self.forwarder.database:
            return LocalDelivery(connection, self.dialect, self._writer, self._outages)
        delivery = self._remote.get((database, mode))
        if delivery is None:
            target = Target(
                name=database,
                dialect=dialect_for(self.config.databases[database].dialect),
                ledger=ledger_address(self.config, database),
                config=self.config,
                create_ledger=self.config.install.at_runtime,
                transaction=mode,
            )
            delivery = RemoteDelivery(
                target,
                self.connections,
                self.config.retries.immediate_attempts,
                self._outages,
                self._writer,
            )
            self._remote[(database, mode)] = delivery
        delivery.batch = self._batch
        return delivery

    # -- healing the forwarding database -------------------------------------------------

    def heal_forwarding_tables(self, missing: BridgeTableMissing) -> bool:
        """Create the forwarder's missing tables in its database; False when none was missing
        any more (another worker created them). Raises BridgeTableMissing saying why they are
        not created (runtime creation off, no permission)."""
        database = self.forwarder.database
        if not self.config.install.at_runtime:
            raise missing.with_advice(RUNTIME_DDL_OFF_ADVICE) from None
        connection = self.connections.get(database)
        steps = forwarder_table_steps(self.config, self.forwarder)
        try:
            created = create_tables(connection, self.dialect, steps, only_missing=True)
        except PermissionDenied as error:
            raise missing.with_advice(cannot_create_advice(error.detail)) from None
        for step in created:
            if step.table is None:
                continue  # a schema: created only if absent, and only with a table
            log.warning(
                "forwarder '%s': created %s in database '%s' (it was missing)",
                self.forwarder.name,
                step.description,
                database,
            )
        self._retry_table_checked = False
        return bool(created)

    def _upgrade_retry_table(self, connection: Connection) -> None:
        """Retry storage made by an earlier sfbridge lacks `destination_database`: add it."""
        try:
            if upgrade_retry_table(
                connection, self.dialect, self.tables.retry, allowed=self.config.install.at_runtime
            ):
                log.warning(
                    "forwarder '%s': added column destination_database to retry storage",
                    self.forwarder.name,
                )
        except QueueNotFound:
            connection.rollback()  # no retry storage yet: the claim heals it
        self._retry_table_checked = True


def probe_interval(config: BridgeConfig) -> float:
    """How often a database in trouble is looked at again.

    Once per retry delay when outages wait (`retries.during_outage: wait`); with `count`, at
    most every 5 s, so that a database that is back is used again soon.
    """
    if config.retries.during_outage == "wait":
        return config.retries.delay
    return min(config.retries.delay, 5.0)


def _utcnow() -> datetime:
    """Naive UTC: the queue tables store UTC wall-clock times without a zone."""
    return datetime.now(UTC).replace(tzinfo=None)
