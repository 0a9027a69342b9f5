"""The data path: receive -> classify/route -> deliver -> commit, or retry / error queue.

One call of `forward_batch` is one source transaction:

1. claim up to `batch_size` rows (a destructive, uncommitted DELETE ... RETURNING with
   SKIP LOCKED, so competing workers and daemons never take the same row);
2. classify each row (poison, expired, rejected, or deliverable to a routed destination);
3. deliver, grouped per destination database: the forwarding database's own queues inside
   the source transaction, remote databases in their own transaction with the dedup ledger,
   committed first;
4. in the same source transaction, write what could not be delivered to retry storage or
   the error queue, and add to the counters;
5. commit the source transaction. Only now are the rows gone from where they were.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from bridge.classify import (
    ClaimedMessage,
    Decision,
    Deliver,
    Expired,
    Poison,
    Publish,
    Reject,
    classify,
)
from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.connections import Connections
from bridge.deliver import (
    Delivered,
    DeliveryResult,
    Duplicate,
    Failed,
    Item,
    ItemWriteError,
    NotIsolated,
    RemoteDelivery,
    Target,
    deliver_in_transaction,
    missing_queue_failure,
)
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import Connection, DatabaseError, PermissionDenied, QueueNotFound
from bridge.headers import serialize_headers
from bridge.ledger import RUNTIME_DDL_OFF_ADVICE, cannot_create_advice, ledger_address
from bridge.multicast import Fanout, NoSubscribers, SubscribersUnknown, fan_out
from bridge.outages import OutageTracker
from bridge.routing import Router
from bridge.settle import (
    DELIVERED,
    DUPLICATES,
    ERRORS,
    EXPIRED,
    NO_SUBSCRIBERS,
    RETRIES,
    Settlement,
)
from bridge.subscriptions import SubscriberDirectory
from bridge.tables import (
    BridgeTableMissing,
    ForwarderTables,
    create_tables,
    forwarder_table_steps,
    forwarder_tables,
    owned_table,
    upgrade_retry_table,
)

log = logging.getLogger(__name__)

Source = Literal["queue", "retry"]
# What happens to one claimed message, once published events are expanded per subscriber.
Outcome = Poison | Expired | Reject | Deliver | Fanout | NoSubscribers | SubscribersUnknown
# A delivery unit: (position in the batch, copy index for a fan-out, or -1 for unicast).
UnitKey = tuple[int, int]

__all__ = [
    "DELIVERED",
    "DUPLICATES",
    "ERRORS",
    "EXPIRED",
    "RETRIES",
    "BatchForwarder",
    "BatchReport",
    "ForwarderTables",
    "forwarder_tables",
]


@dataclass
class BatchReport:
    """What one batch did; counts by outcome."""

    claimed: int = 0
    counts: Counter[str] = field(default_factory=Counter)


class BatchForwarder:
    """Forwards batches for one forwarder. One instance per worker thread."""

    def __init__(
        self,
        config: BridgeConfig,
        forwarder: ForwarderConfig,
        connections: Connections,
        *,
        slot: int = 0,
        outages: OutageTracker | None = None,
    ) -> None:
        self.config = config
        self.forwarder = forwarder
        self.connections = connections
        self.slot = slot
        source_database = config.databases[forwarder.database]
        self.dialect: Dialect = dialect_for(source_database.dialect)
        self.tables = forwarder_tables(config, forwarder)
        self.router = Router(source_database, config.routes, config.databases)
        self.subscribers = SubscriberDirectory(config, forwarder.database)
        self._remote: dict[str, RemoteDelivery] = {}
        # A daemon shares one tracker (and its prober) across its workers; standalone use gets
        # its own, where the first attempt after the probe interval is the probe.
        self._outages = outages or OutageTracker(probe_interval(config))
        self._retry_table_checked = False
        self._heal_after_batch: BridgeTableMissing | None = None

    # -- the data path -------------------------------------------------------------------

    def forward_batch(self, source: Source = "queue") -> BatchReport:
        """Forward one batch from the forwarding queue or from due retries.

        A missing table the bridge owns in the forwarding database is created (unless
        `install.at_runtime` is false) and the batch tried once more. Raises DatabaseError
        only for failures of the forwarding database itself (BridgeTableMissing for a table
        that could not be created); the source transaction is then rolled back and every
        claimed row is back where it was.
        """
        try:
            report = self._forward_batch_once(source)
        except BridgeTableMissing as missing:
            self.heal_forwarding_tables(missing)
            report = self._forward_batch_once(source)
        if self._heal_after_batch is not None:
            noted, self._heal_after_batch = self._heal_after_batch, None
            self.heal_forwarding_tables(noted)
        return report

    def _forward_batch_once(self, source: Source) -> BatchReport:
        connection = self.connections.get(self.forwarder.database)
        try:
            if source == "retry" and not self._retry_table_checked:
                self._upgrade_retry_table(connection)
            connection.begin()
            claimed = self._claim(connection, source)
            report = BatchReport(claimed=len(claimed))
            if claimed:
                outcomes = [
                    self._expand(connection, message, self._classify(message))
                    for message in claimed
                ]
                results = self._deliver(connection, claimed, outcomes)
                report.counts = self._settle(connection, claimed, outcomes, results)
            connection.commit()
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

    def heal_forwarding_tables(self, missing: BridgeTableMissing) -> None:
        """Create the forwarder's missing tables in its database, or raise BridgeTableMissing
        saying why that is not done (runtime creation off, no permission)."""
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
            log.warning(
                "forwarder '%s': created %s in database '%s' (it was missing)",
                self.forwarder.name,
                step.description,
                database,
            )
        self._retry_table_checked = False

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

    def _classify(self, message: ClaimedMessage) -> Decision:
        try:
            return classify(message, self.router)
        except Exception as error:
            # A bug must not turn one message into a queue-blocking loop: the batch would roll
            # back and be claimed again forever. This message goes to the error queue instead.
            log.exception("message %s could not be classified", message.row_id)
            return Poison(f"sfbridge could not process the message: {error!r}")

    def _claim(self, connection: Connection, source: Source) -> list[ClaimedMessage]:
        """Delete (uncommitted) up to a batch of rows; both statements return the queue
        columns first, and retry storage adds its bookkeeping after them."""
        dialect = self.dialect
        if source == "queue":
            statement = dialect.sql("receive_batch", queue=self.tables.queue)
            parameters: tuple[object, ...] = (self.forwarder.batch_size,)
            table = ("forwarding queue", self.tables.queue_canonical)
        else:
            statement = dialect.sql("retry_claim_due", retry=self.tables.retry)
            now = _utcnow()
            policy = self.config.retries
            waiting = self._outages.waiting_databases() if policy.during_outage == "wait" else []
            parameters = (
                self.forwarder.name,
                dialect.encode_timestamp(now),
                # Messages for these databases stay in retry storage while they are down,
                # unless they waited too long or expired meanwhile.
                "|" + "|".join(waiting) + "|" if waiting else "",
                dialect.encode_timestamp(now - timedelta(seconds=policy.max_wait)),
                self.forwarder.batch_size,
            )
            table = ("retry storage", dialect.grammar.render(self.tables.retry))
        messages = []
        with owned_table(*table):
            rows = connection.query(statement, parameters)
        for row in rows:
            retried = len(row) > 6
            messages.append(
                ClaimedMessage(
                    row_id=dialect.decode_id(row[0]),
                    expired=bool(row[1]),
                    expires=dialect.decode_timestamp(row[2]),
                    headers_text=row[3],
                    body=_as_bytes(row[4]),
                    order=int(row[5]),
                    attempts=int(row[6]) if retried else 0,
                    first_failure_at=dialect.decode_timestamp(row[7]) if retried else None,
                    last_error=row[8] if retried else None,
                )
            )
        # RETURNING gives no order guarantee; FIFO is restored here.
        messages.sort(key=lambda message: message.order)
        return messages

    def _expand(
        self, connection: Connection, message: ClaimedMessage, decision: Decision
    ) -> Outcome:
        """A published event becomes one copy per subscriber; everything else stays as it is."""
        if not isinstance(decision, Publish):
            return decision
        try:
            lookup = self.subscribers.lookup(decision.topics)
        except DatabaseError as error:
            return SubscribersUnknown(decision, f"cannot read subscribers: {error}")
        outcome = fan_out(
            decision, lookup.subscribers, self.router, fallback_message_id=str(message.row_id)
        )
        if lookup.fresh:
            self._record_event_type(connection, decision, outcome)
        return outcome

    def _record_event_type(
        self, connection: Connection, publish: Publish, outcome: Fanout | NoSubscribers
    ) -> None:
        """What `status` and `check` show: per event type seen, its subscribers and sources."""
        subscribers = [
            {
                "address": listed.address,
                "source": listed.source,
                "destination": (
                    f"{copy.decision.destination.canonical} in database "
                    f"'{copy.decision.destination.database}'"
                    if isinstance(copy.decision, Deliver)
                    else f"unroutable: {copy.decision.reason}"
                ),
            }
            for copy in (outcome.copies if isinstance(outcome, Fanout) else ())
            for listed in copy.subscribers
        ]
        # What status shows must never hold up delivery: a value the table cannot hold (an
        # event type of kilobytes) or a missing table only costs this row, in a savepoint.
        statements = self.dialect.statements
        connection.execute(statements["savepoint"])
        try:
            with owned_table("event types", self.dialect.grammar.render(self.tables.event_types)):
                connection.execute(
                    self.dialect.sql("event_type_seen", event_types=self.tables.event_types),
                    (
                        self.forwarder.name,
                        event_type_key(publish.topics[0]),
                        self.dialect.encode_timestamp(_utcnow()),
                        json.dumps(
                            {"topics": list(publish.topics), "subscribers": subscribers},
                            ensure_ascii=False,
                        ),
                    ),
                )
        except BridgeTableMissing as missing:
            connection.execute(statements["rollback_to_savepoint"])
            self._heal_after_batch = missing
            return
        except (DatabaseError, ValueError) as error:
            connection.execute(statements["rollback_to_savepoint"])
            log.warning("event type %.200s not recorded for status: %s", publish.topics[0], error)
            return
        if statements["release_savepoint"]:
            connection.execute(statements["release_savepoint"])

    def _deliver(
        self,
        connection: Connection,
        claimed: Sequence[ClaimedMessage],
        outcomes: Sequence[Outcome],
    ) -> dict[UnitKey, DeliveryResult]:
        """Deliver every unicast message and every subscriber copy, grouped per database."""
        groups: dict[str, list[tuple[UnitKey, Item]]] = {}
        for position, outcome in enumerate(outcomes):
            message = claimed[position]
            if isinstance(outcome, Deliver):
                units = [((position, -1), outcome)]
            elif isinstance(outcome, Fanout):
                units = [
                    ((position, index), copy.decision)
                    for index, copy in enumerate(outcome.copies)
                    if isinstance(copy.decision, Deliver)
                ]
            else:
                continue
            for key, deliver in units:
                database = deliver.destination.database
                groups.setdefault(database, []).append((key, (message, deliver)))
        results: dict[UnitKey, DeliveryResult] = {}
        for database, keyed_items in groups.items():
            keys = [key for key, _ in keyed_items]
            items = [item for _, item in keyed_items]
            if database == self.forwarder.database:
                delivered = self._deliver_locally(connection, items)
            else:
                delivered = self._remote_delivery(database).deliver(items)
            results.update(zip(keys, delivered, strict=True))
        return results

    def _deliver_locally(
        self, connection: Connection, items: Sequence[Item]
    ) -> list[DeliveryResult]:
        """Same database: one shared transaction makes it atomic; no ledger needed.

        A savepoint isolates an item-specific failure (a missing queue) from the rest of the
        source transaction.
        """
        results: dict[int, DeliveryResult] = {}
        pending = list(range(len(items)))
        one_by_one = False
        # Each round commits its savepoint or settles at least one item, so this terminates.
        while pending:
            connection.execute(self.dialect.statements["savepoint"])
            try:
                done = deliver_in_transaction(
                    connection,
                    self.dialect,
                    [items[i] for i in pending],
                    ledger=None,
                    one_by_one=one_by_one,
                )
            except NotIsolated:
                connection.execute(self.dialect.statements["rollback_to_savepoint"])
                one_by_one = True
                continue
            except ItemWriteError as failure:
                connection.execute(self.dialect.statements["rollback_to_savepoint"])
                failed_at = pending[failure.position]
                destination = items[failed_at][1].destination
                if isinstance(failure.error, QueueNotFound):
                    failed = missing_queue_failure(
                        connection, self.dialect, self.forwarder.database, destination
                    )
                    connection.execute(self.dialect.statements["rollback_to_savepoint"])
                    settled = [p for p in pending if items[p][1].destination == destination]
                else:
                    failed = Failed(str(failure.error), retryable=failure.retryable)
                    settled = [failed_at]
                for position in settled:
                    results[position] = failed
                pending = [p for p in pending if p not in settled]
                continue
            # Empty where the dialect has no RELEASE (SQL Server keeps savepoints to the end).
            if self.dialect.statements["release_savepoint"]:
                connection.execute(self.dialect.statements["release_savepoint"])
            for offset, result in done.items():
                results[pending[offset]] = result
            break
        return [results[i] for i in range(len(items))]

    def _remote_delivery(self, database: str) -> RemoteDelivery:
        delivery = self._remote.get(database)
        if delivery is None:
            target = Target(
                name=database,
                dialect=dialect_for(self.config.databases[database].dialect),
                ledger=ledger_address(self.config, database),
                config=self.config,
                create_ledger=self.config.install.at_runtime,
            )
            delivery = RemoteDelivery(
                target, self.connections, self.config.retries.immediate_attempts, self._outages
            )
            self._remote[database] = delivery
        return delivery

    # -- settling what was not delivered -------------------------------------------------

    def _settle(
        self,
        connection: Connection,
        claimed: Sequence[ClaimedMessage],
        outcomes: Sequence[Outcome],
        results: dict[UnitKey, DeliveryResult],
    ) -> Counter[str]:
        settlement = Settlement(
            connection,
            self.dialect,
            self.forwarder,
            self.tables,
            self.config.retries,
            slot=self.slot,
            now=_utcnow(),
        )
        for position, (message, outcome) in enumerate(zip(claimed, outcomes, strict=True)):
            if isinstance(outcome, Poison):
                settlement.dead_letter_as_is(message, outcome.reason)
            elif isinstance(outcome, Expired):
                settlement.count(EXPIRED)
            elif isinstance(outcome, Reject):
                settlement.reject(message, outcome.headers, outcome.reason_code, outcome.reason)
            elif isinstance(outcome, Deliver):
                self._settle_delivery(
                    settlement,
                    message,
                    outcome,
                    message.headers_text or "",
                    results[(position, -1)],
                )
            elif isinstance(outcome, Fanout):
                for index, copy in enumerate(outcome.copies):
                    if isinstance(copy.decision, Reject):
                        settlement.reject(
                            message, copy.decision.headers, "unroutable", copy.decision.reason
                        )
                    else:
                        # A failed copy waits alone, as a unicast to its subscriber.
                        self._settle_delivery(
                            settlement,
                            message,
                            copy.decision,
                            serialize_headers(copy.decision.headers),
                            results[(position, index)],
                        )
            elif isinstance(outcome, NoSubscribers):
                self._settle_no_subscribers(settlement, message, outcome.publish)
            else:
                settlement.failed(
                    message,
                    outcome.publish.headers,
                    message.headers_text or "",
                    f"subscribers of {outcome.publish.topics[0]}",
                    Failed(outcome.error),
                )
        return settlement.finish()

    def _settle_delivery(
        self,
        settlement: Settlement,
        message: ClaimedMessage,
        deliver: Deliver,
        stored_headers_text: str,
        result: DeliveryResult,
    ) -> None:
        if isinstance(result, Delivered):
            settlement.count(DELIVERED)
        elif isinstance(result, Duplicate):
            log.info(
                "message %s was already delivered to %s; not delivering it twice",
                deliver.message_id,
                deliver.destination.canonical,
            )
            settlement.count(DUPLICATES)
        else:
            settlement.failed(
                message,
                deliver.headers,
                stored_headers_text,
                deliver.destination.canonical,
                result,
                destination_database=deliver.destination.database,
            )

    def _settle_no_subscribers(
        self, settlement: Settlement, message: ClaimedMessage, publish: Publish
    ) -> None:
        reason = (
            f"published event {publish.topics[0]!r} has no subscribers (topics looked up: "
            f"{', '.join(publish.topics)})"
        )
        if self.config.publish.no_subscribers == "error":
            settlement.reject(message, publish.headers, "no-subscribers", reason)
        else:
            log.info("message %s: %s; dropped", message.row_id, reason)
            settlement.count(NO_SUBSCRIBERS)


def probe_interval(config: BridgeConfig) -> float:
    """How often a database in trouble is looked at again.

    Once per retry delay when outages wait (`retries.during_outage: wait`); with `count`, at
    most every 5 s, so that a database that is back is used again soon.
    """
    if config.retries.during_outage == "wait":
        return config.retries.delay
    return min(config.retries.delay, 5.0)


# The event types table keys on the type name; a longer name is stored shortened, with a
# digest, so that it fits every dialect's key (SQL Server: 600 characters).
MAX_EVENT_TYPE_KEY = 400


def event_type_key(event_type: str) -> str:
    """`event_type` as the event types table stores it: whole when short enough, else its first
    300 characters, an ellipsis and a digest of the whole."""
    if len(event_type.encode("utf-8", "surrogatepass")) <= MAX_EVENT_TYPE_KEY:
        return event_type
    digest = hashlib.sha256(event_type.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{event_type[:300]}... (sha256 {digest})"


def _as_bytes(value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"unexpected body type {type(value).__name__}")


def _utcnow() -> datetime:
    """Naive UTC: the queue tables store UTC wall-clock times without a zone."""
    return datetime.now(UTC).replace(tzinfo=None)
