"""The data path's spine: claim -> classify -> deliver -> settle -> commit.

One call of `BatchForwarder.forward_batch` is one source transaction, and `_forward` below
reads as these five steps, each handed the `Batch` (`bridge.forwarding.batch`):

1. claim up to `batch_size` rows (`claim`: a destructive, uncommitted DELETE with row locks
   that skip what other workers hold);
2. classify each row (`classify`: poison, expired, rejected, deliverable to a routed
   destination with what it receives there (`outgoing`), or a published event, which
   `fan_out` expands into one unit per subscriber copy);
3. deliver the units, grouped per destination database (`deliver`): the forwarding database's
   own queues inside the source transaction, other databases in their own transaction,
   committed first with the dedup ledger (`transaction: ledger`), prepared (`two-phase`) or
   committed without a ledger (`at-least-once`); it hands back a result per unit;
4. settle every unit (`settle`), given its result: count it, or write it to retry storage or
   the error queue, in the same source transaction;
5. commit the source transaction. Only now are the rows gone from where they were; then commit
   what was prepared (`transactions`).

Tables of the bridge found missing on the way are created and the batch tried once more
(`healing`).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable

from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.connections import Connections
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import Connection
from bridge.exceptions import (
    BridgeTableMissing,
    DatabaseError,
)
from bridge.forwarding.batch import Batch, BatchReport
from bridge.forwarding.catch_up import CatchUpLimits, NoLimits, limited_counts, limited_databases
from bridge.forwarding.claim import claim_batch, claim_limit
from bridge.forwarding.classify import classify
from bridge.forwarding.deliver import Destinations
from bridge.forwarding.fan_out import PublishedEvents
from bridge.forwarding.healing import TableHealer
from bridge.forwarding.hops import CommittedBatch, HopTracer, hops_of
from bridge.forwarding.observers import ForwardingObserver, safe_observer
from bridge.forwarding.outgoing import Outgoing
from bridge.forwarding.proxies import forwarder_router
from bridge.forwarding.repeats import RepeatedLines
from bridge.forwarding.settle import Settlement
from bridge.forwarding.subscriptions import SubscriberDirectory
from bridge.forwarding.transactions import BatchTransactions, SourceFailed
from bridge.forwarding.writes import QueueWriter
from bridge.messages import ClaimedMessage, Decision, Poison, Publish, Source, Unit, utcnow
from bridge.outages import OutageTracker
from bridge.storage.pauses import (
    PauseBoard,
    PauseState,
    read_pauses,
    read_pauses_in_transaction,
)
from bridge.storage.tables import (
    forwarder_tables,
)

log = logging.getLogger(__name__)


class BatchForwarder:
    """Forwards batches for one forwarder. One instance per worker thread; every worker
    forwards both the queue and due retries.

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
        catch_up: CatchUpLimits | None = None,
        repeats: RepeatedLines | None = None,
        tracer: HopTracer | None = None,
    ) -> None:
        """`repeats`: where failures that repeat are held and told (the daemon's, one for all
        its workers); without it, each batch's are told in full. `tracer`: told each committed
        batch's hops (`bridge.forwarding.hops`); None (tracing off): nothing is worked out."""
        self.config = config
        self._repeats = repeats
        self.forwarder = forwarder
        self.connections = connections
        self.slot = slot
        self.dialect: Dialect = dialect_for(config.databases[forwarder.database].dialect)
        self.tables = forwarder_tables(config, forwarder)
        self.router = forwarder_router(config, forwarder)
        self.outgoing = Outgoing.from_config(config, forwarder.database)
        self.healer = TableHealer(config, forwarder, connections, self.dialect)
        self._outages = outages or OutageTracker(probe_interval(config))
        self.published = PublishedEvents(
            forwarder.name,
            self.dialect,
            self.tables,
            self.router,
            self.outgoing,
            SubscriberDirectory(config, forwarder.database, logins=self._outages),
        )
        self._pauses = PauseBoard(forwarder.slow_poll_interval)
        self._writer = writer or QueueWriter()
        # Rows the next claim locks, per source, from the sizes the last one saw.
        self._claim_limits: dict[Source, int] = {}
        self._observer = safe_observer(observer)
        self._destinations = Destinations(
            config, forwarder, connections, self._outages, self._writer, slot=slot
        )
        self._store: str | None = None  # the forwarding database's id in two-phase gids
        self._catch_up = catch_up or NoLimits()
        # Other databases with catch-up limits: those a batch may have to wait for.
        self._limited = limited_databases(config) - {forwarder.database}
        self._tracer = tracer
        self._error_queue = self.dialect.grammar.render(self.tables.error_queue)
        self._next_tracer_log = 0.0

    def forward_batch(
        self,
        source: Source = "queue",
        *,
        seq_range: tuple[int, int] | None = None,
        on_full: Callable[[], None] | None = None,
    ) -> BatchReport:
        """Forward one batch from the forwarding queue or from due retries.

        `seq_range` (first, last) limits a queue batch to rows whose sequence column lies in
        it: a bulk drain's share of the queue. `on_full` is called as soon as the claim came
        back full, before the batch is delivered: more is waiting, and another worker may
        start on the same source now rather than when this batch ends.

        Raises DatabaseError only for failures of the forwarding database itself
        (BridgeTableMissing for a table that could not be created); the source transaction
        is then rolled back and every claimed row is back where it was.
        """
        self.pause_state(source)
        self._observer.batch_started(self.forwarder.name)
        started = time.monotonic()
        batch: Batch | None = None
        try:
            batch = self.healer.healing(lambda: self._forward(source, seq_range, on_full))
        finally:
            self._observer.batch_finished(
                self.forwarder.name,
                source,
                0 if batch is None else batch.report.claimed,
                None if batch is None else batch.report.counts,
                time.monotonic() - started,
            )
        self.healer.heal_after_batch(batch.missing_tables)
        return batch.report

    # -- the spine -------------------------------------------------------------------------

    def _forward(
        self,
        source: Source,
        seq_range: tuple[int, int] | None,
        on_full: Callable[[], None] | None,
    ) -> Batch:
        batch = self._open(source)
        try:
            self._claim(batch, seq_range)
            if on_full is not None and batch.report.full:
                on_full()
            self._classify(batch)
            self._deliver(batch)
            self._settle(batch)
            self._commit(batch)
            return batch
        except BridgeTableMissing:
            batch.connection.rollback()
            batch.transactions.forget_not_committed()
            raise
        except DatabaseError:
            self.connections.discard(self.forwarder.database)
            batch.transactions.forget_not_committed()
            raise
        except BaseException:
            batch.connection.rollback()
            batch.transactions.forget_not_committed()
            raise

    def _open(self, source: Source) -> Batch:
        connection = self.connections.get(self.forwarder.database)
        if source == "retry":
            self.healer.upgrade_retry_table(connection, self.tables.retry)
        connection.begin()
        transactions = BatchTransactions(
            connection,
            self.dialect,
            self.tables.transactions,
            self.forwarder.name,
            self.connections,
            self.forwarder.database,
            store=self._store,
        )
        return Batch(source, connection, utcnow(), transactions)

    def _claim(self, batch: Batch, seq_range: tuple[int, int] | None) -> None:
        limit = self._claim_limits.get(batch.source, self.forwarder.batch_size)
        batch.claimed = claim_batch(
            batch.connection,
            self.dialect,
            self.tables,
            self.forwarder,
            batch.source,
            now=batch.now,
            policy=self.config.retries,
            waiting_databases=self._waiting_databases(),
            seq_range=seq_range,
            limit=limit,
        )
        batch.claimed_at = time.monotonic()
        if batch.claimed:
            self._check_pauses(batch, drain=seq_range is not None)
        sizes = [message.claimed_size for message in batch.claimed]
        if batch.claimed:
            self._claim_limits[batch.source] = claim_limit(self.forwarder, sizes)
        full = len(batch.claimed) >= limit or sum(sizes) >= self.forwarder.batch_bytes
        batch.report = BatchReport(claimed=len(batch.claimed), full=full)

    def _check_pauses(self, batch: Batch, *, drain: bool) -> None:
        """The pauses as of the claim, read in its transaction after it (so a pause committed
        before a claimed row was sent is seen: `bridge.storage.pauses`). A paused forwarder
        puts every row back, unless this is a bulk drain's batch (an operator's explicit
        action, which honours destination pauses only)."""
        state = read_pauses_in_transaction(
            batch.connection, self.dialect, self.tables, self.forwarder.name
        )
        self._pauses.update(state)
        batch.paused = state.destinations
        if state.forwarder is not None and not drain:
            batch.connection.rollback()
            batch.connection.begin()
            batch.claimed = []

    def _classify(self, batch: Batch) -> None:
        batch.units = [
            unit
            for message in batch.claimed
            for unit in self.units_of(batch.connection, message, batch.missing_tables, batch.source)
        ]

    def _deliver(self, batch: Batch) -> None:
        if not batch.units:
            return
        limited: dict[str, int] = {}
        if self._limited:  # else (unless configured) nothing waits, nothing is looked at
            # Nothing is written to these in this batch: they take no place and wait for none.
            skipped = {*batch.paused, *self._outages.waiting_databases()}
            limited = limited_counts(batch.units, self._limited, skipped)
        try:
            if limited:
                with self._catch_up.hold(limited) as batch.held:
                    report = self._destinations.deliver(
                        batch.units, batch.connection, batch.paused, batch.transactions
                    )
            else:
                report = self._destinations.deliver(
                    batch.units, batch.connection, batch.paused, batch.transactions
                )
        except SourceFailed as failed:
            raise failed.error from None
        for database, seconds in batch.held.seconds.items():
            self._observer.held(database, batch.held.messages[database], seconds)
        batch.results = report.results
        since_claim = time.monotonic() - batch.claimed_at
        for database, count in report.delivered.items():
            if database == self.forwarder.database:
                batch.delivered_locally += count  # committed with the source, below
            elif count:
                self._observer.delivered(database, count, since_claim)

    def _settle(self, batch: Batch) -> None:
        if not batch.units:
            return
        settlement = Settlement(
            batch.connection,
            self.dialect,
            self.forwarder,
            self.tables,
            slot=self.slot,
            now=batch.now,
            writer=self._writer,
            repeats=self.config.logging.repeats,
            repeated_lines=self._repeats,
        )
        batch.report.counts = settlement.settle(
            batch.units,
            batch.results,
            self.config.retries,
            self.config.publish.no_subscribers,
            batch.held,
        )
        batch.tell_failures = settlement.tell

    def _commit(self, batch: Batch) -> None:
        batch.connection.commit()
        if batch.tell_failures is not None:
            batch.tell_failures()
        self._store = batch.transactions.store
        if batch.transactions.prepared:
            batch.transactions.commit_prepared(self._destination_dialects())
        if batch.delivered_locally:
            self._observer.delivered(
                self.forwarder.database,
                batch.delivered_locally,
                time.monotonic() - batch.claimed_at,
            )
        if self._tracer is not None and batch.units:
            self._trace(batch, self._tracer)

    def _trace(self, batch: Batch, tracer: HopTracer) -> None:
        """Hand `tracer` the committed batch's hops (worked out here, so that no message body
        is kept for it), from its claim to now. What fails here is logged
        (once a minute at most), never raised: the batch is committed, and watching it must
        not make it look failed."""
        try:
            hops = hops_of(
                batch.units,
                batch.results,
                self.config.retries,
                self.config.publish.no_subscribers,
                batch.now,
                forwarding_queue=self.tables.queue_canonical,
                error_queue=self._error_queue,
            )
            ended = time.time_ns()
            committed = CommittedBatch(
                self.forwarder.name,
                batch.source,
                self.tables.queue_canonical,
                hops,
                ended - int((time.monotonic() - batch.claimed_at) * 1e9),
                ended,
            )
            tracer.traced(committed)
        except Exception:
            now = time.monotonic()
            if now >= self._next_tracer_log:
                self._next_tracer_log = now + 60.0
                log.exception("tracing a batch failed; delivery goes on")

    # -- what the steps use ----------------------------------------------------------------

    def units_of(
        self,
        connection: Connection,
        message: ClaimedMessage,
        missing_tables: list[BridgeTableMissing],
        source: Source = "queue",
    ) -> list[Unit]:
        """One unit per message, or per subscriber copy of a published event.

        A row from the forwarding queue is a sender's: classification drops the bridge's own
        headers on it before anything reads them, so that neither routing nor retry storage
        nor the error queue takes them from a sender. Retry storage holds rows the bridge
        wrote, whose bridge headers it set itself."""
        decision = self._decide(message, trusted=source == "retry")
        if isinstance(decision, Publish):
            return self.published.units(connection, message, decision, missing_tables)
        return [Unit(message, decision, message.headers_text or "")]

    def _decide(self, message: ClaimedMessage, *, trusted: bool) -> Decision:
        try:
            return classify(message, self.router, self.outgoing, trusted=trusted)
        except Exception as error:
            # A bug must not turn one message into a queue-blocking loop: the batch would roll
            # back and be claimed again forever. This message goes to the error queue instead.
            log.exception("message %s could not be classified", message.row_id)
            return Poison(f"sfbridge could not process the message: {error!r}")

    def pause_state(self, source: Source) -> PauseState:
        """The forwarder's pauses (`sfbridge pause`) as this worker knows them before a batch
        of `source`, read again once per `forwarder.slow_poll_interval` where the claim needs
        them: before a retry claim (which leaves paused databases' messages where they are),
        and while the forwarder is known paused (to learn that it was resumed).

        A queue batch of a forwarder not known paused claims without reading them first: a
        batch that claims reads them in its transaction after the claim (`_check_pauses`),
        which is exact, and puts every row back if the forwarder was paused meanwhile. Read
        first as well, a trickle of single messages paid a transaction more per message
        (about 1 ms of its pickup, measured in the daemon with 500 forwarders)."""
        known = self._pauses.state
        if self._pauses.stale() and (source == "retry" or known.forwarder is not None):
            connection = self.connections.get(self.forwarder.database)
            self._pauses.update(
                self.healer.healing(
                    lambda: read_pauses(connection, self.dialect, self.tables, self.forwarder.name)
                )
            )
        return self._pauses.state

    def _waiting_databases(self) -> list[str]:
        """Databases whose messages stay in retry storage: paused ones, and with
        `retries.during_outage: wait` those in trouble."""
        waiting = list(self._pauses.state.destinations)
        if self.config.retries.during_outage == "wait":
            waiting += [d for d in self._outages.waiting_databases() if d not in waiting]
        return waiting

    def _destination_dialects(self) -> dict[str, Dialect]:
        return {name: dialect_for(d.dialect) for name, d in self.config.databases.items()}


def probe_interval(config: BridgeConfig) -> float:
    """How often a database in trouble is looked at again.

    Once per retry delay when outages wait (`retries.during_outage: wait`); with `count`, at
    most every 5 s, so that a database that is back is used again soon.
    """
    if config.retries.during_outage == "wait":
        return config.retries.delay
    return min(config.retries.delay, 5.0)


# Container allocations between young-generation collections while forwarding (Python's
# default is 700). A batch makes several containers per message (parsed headers, decisions,
# rows), nearly all freed by reference counting, never in a cycle; at 700 the collector ran
# a few times per hundred messages and walked the batch's survivors each time: 1.5 us of
# the bridge's 17 us per message, measured in-process. Cycles now wait a little longer.
YOUNG_COLLECTION_THRESHOLD = 10_000


def tune_garbage_collection() -> None:
    """Collect the young generation less often (`YOUNG_COLLECTION_THRESHOLD`), for a process
    that forwards; the older generations keep their thresholds."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, old)
