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

import logging
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from bridge.addressing import QueueAddress
from bridge.classify import ClaimedMessage, Decision, Deliver, Expired, Poison, Reject, classify
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
from bridge.dialects.base import COUNTERS_TABLE, LEDGER_TABLE, RETRY_TABLE
from bridge.drivers import Connection, DatabaseError, QueueNotFound
from bridge.headers import serialize_headers, with_failure_headers
from bridge.outages import OutageMemory
from bridge.retry_policy import gives_up_after, next_attempt_at
from bridge.routing import Router

log = logging.getLogger(__name__)

Source = Literal["queue", "retry"]

# Counter names, as `status` shows them.
DELIVERED = "delivered"
DUPLICATES = "duplicates-skipped"
EXPIRED = "expired-dropped"
RETRIES = "retries-scheduled"
ERRORS = "sent-to-error-queue"


@dataclass
class BatchReport:
    """What one batch did; counts by outcome."""

    claimed: int = 0
    counts: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class ForwarderTables:
    """The resolved addresses a forwarder works with, all in its own database."""

    queue: QueueAddress
    error_queue: QueueAddress
    retry: QueueAddress
    counters: QueueAddress
    queue_canonical: str


def forwarder_tables(config: BridgeConfig, forwarder: ForwarderConfig) -> ForwarderTables:
    """Resolve a forwarder's queue, error queue and bridge tables in its database's grammar."""
    database = config.databases[forwarder.database]
    dialect = dialect_for(database.dialect)
    grammar = dialect.grammar
    queue = grammar.resolve(grammar.parse(forwarder.queue), database.schema, None)
    return ForwarderTables(
        queue=queue,
        error_queue=grammar.resolve(grammar.parse(forwarder.error_queue), database.schema, None),
        retry=dialect.bridge_table(RETRY_TABLE, database.schema),
        counters=dialect.bridge_table(COUNTERS_TABLE, database.schema),
        queue_canonical=grammar.render(queue),
    )


class BatchForwarder:
    """Forwards batches for one forwarder. One instance per worker thread."""

    def __init__(
        self,
        config: BridgeConfig,
        forwarder: ForwarderConfig,
        connections: Connections,
        *,
        slot: int = 0,
        outages: OutageMemory | None = None,
    ) -> None:
        self.config = config
        self.forwarder = forwarder
        self.connections = connections
        self.slot = slot
        source_database = config.databases[forwarder.database]
        self.dialect: Dialect = dialect_for(source_database.dialect)
        self.tables = forwarder_tables(config, forwarder)
        self.router = Router(source_database, config.routes, config.databases)
        self._remote: dict[str, RemoteDelivery] = {}
        # A daemon shares one memory across its workers; standalone use gets its own.
        self._outages = outages or OutageMemory(outage_hold_seconds(config))

    # -- the data path -------------------------------------------------------------------

    def forward_batch(self, source: Source = "queue") -> BatchReport:
        """Forward one batch from the forwarding queue or from due retries.

        Raises DatabaseError only for failures of the forwarding database itself; the source
        transaction is then rolled back and every claimed row is back where it was.
        """
        connection = self.connections.get(self.forwarder.database)
        try:
            connection.begin()
            claimed = self._claim(connection, source)
            report = BatchReport(claimed=len(claimed))
            if claimed:
                decisions = [self._classify(message) for message in claimed]
                results = self._deliver(connection, claimed, decisions)
                self._settle(connection, claimed, decisions, results, report)
            connection.commit()
            return report
        except DatabaseError:
            self.connections.discard(self.forwarder.database)
            raise
        except BaseException:
            connection.rollback()
            raise

    def _classify(self, message: ClaimedMessage) -> Decision:
        try:
            return classify(message, self.router)
        except Exception as error:
            # A bug must not turn one message into a queue-blocking loop: the batch would roll
            # back and be claimed again forever. This message goes to the error queue instead.
            log.exception("message %s could not be classified", message.row_id)
            return Poison(f"sfbridge could not process the message: {error!r}")

    def _claim(self, connection: Connection, source: Source) -> list[ClaimedMessage]:
        dialect = self.dialect
        if source == "queue":
            rows = connection.query(
                dialect.sql("receive_batch", queue=self.tables.queue), (self.forwarder.batch_size,)
            )
            messages = [
                ClaimedMessage(
                    row_id=dialect.decode_id(row[0]),
                    expired=bool(row[1]),
                    expires=dialect.decode_timestamp(row[2]),
                    headers_text=row[3],
                    body=_as_bytes(row[4]),
                    order=int(row[5]),
                )
                for row in rows
            ]
        else:
            rows = connection.query(
                dialect.sql("retry_claim_due", retry=self.tables.retry),
                (
                    self.forwarder.name,
                    dialect.encode_timestamp(_utcnow()),
                    self.forwarder.batch_size,
                ),
            )
            messages = [
                ClaimedMessage(
                    row_id=dialect.decode_id(row[0]),
                    expired=bool(row[1]),
                    expires=dialect.decode_timestamp(row[2]),
                    headers_text=row[3],
                    body=_as_bytes(row[4]),
                    order=int(row[5]),
                    attempts=int(row[6]),
                    first_failure_at=dialect.decode_timestamp(row[7]),
                    last_error=row[8],
                )
                for row in rows
            ]
        # RETURNING gives no order guarantee; FIFO is restored here.
        messages.sort(key=lambda message: message.order)
        return messages

    def _deliver(
        self,
        connection: Connection,
        claimed: Sequence[ClaimedMessage],
        decisions: Sequence[object],
    ) -> dict[int, DeliveryResult]:
        groups: dict[str, list[int]] = defaultdict(list)
        for position, decision in enumerate(decisions):
            if isinstance(decision, Deliver):
                groups[decision.destination.database].append(position)
        results: dict[int, DeliveryResult] = {}
        for database, positions in groups.items():
            items: list[Item] = [(claimed[p], decisions[p]) for p in positions]  # type: ignore[misc]
            if database == self.forwarder.database:
                outcome = self._deliver_locally(connection, items)
            else:
                outcome = self._remote_delivery(database).deliver(items)
            results.update(zip(positions, outcome, strict=True))
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
            target_config = self.config.databases[database]
            dialect = dialect_for(target_config.dialect)
            target = Target(
                name=database,
                dialect=dialect,
                ledger=dialect.bridge_table(LEDGER_TABLE, target_config.schema),
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
        decisions: Sequence[object],
        results: dict[int, DeliveryResult],
        report: BatchReport,
    ) -> None:
        now = _utcnow()
        # One log line per destination and error per batch, not one per message: an outage
        # with a backlog of thousands must not flood the journal.
        retried: Counter[tuple[str, str, str]] = Counter()
        given_up: Counter[tuple[str, str]] = Counter()
        for position, (message, decision) in enumerate(zip(claimed, decisions, strict=True)):
            if isinstance(decision, Poison):
                log.error(
                    "message %s in %s has unreadable headers (%s); moved to the error queue as is",
                    message.row_id,
                    self.tables.queue_canonical,
                    decision.reason,
                )
                self._dead_letter(connection, message, message.headers_text or "")
                report.counts[ERRORS] += 1
            elif isinstance(decision, Expired):
                report.counts[EXPIRED] += 1
            elif isinstance(decision, Reject):
                log.warning(
                    "message %s: %s; moved to the error queue", message.row_id, decision.reason
                )
                self._dead_letter_with_reason(
                    connection,
                    message,
                    decision.headers,
                    decision.reason_code,
                    decision.reason,
                    "SFBridge.UnroutableMessage",
                    now,
                    attempts=None,
                )
                report.counts[ERRORS] += 1
            elif isinstance(decision, Deliver):
                result = results[position]
                if isinstance(result, Delivered):
                    report.counts[DELIVERED] += 1
                elif isinstance(result, Duplicate):
                    log.info(
                        "message %s was already delivered to %s; not delivering it twice",
                        decision.message_id,
                        decision.destination.canonical,
                    )
                    report.counts[DUPLICATES] += 1
                else:
                    outcome, due = self._retry_or_give_up(
                        connection, message, decision, result, now
                    )
                    report.counts[outcome] += 1
                    if due is None:
                        given_up[(decision.destination.canonical, result.error)] += 1
                    else:
                        retried[(decision.destination.canonical, result.error, due)] += 1
        self._add_counters(connection, report.counts)
        for (destination, error, due), count in retried.items():
            log.warning(
                "%d message(s) to %s not delivered: %s; next attempt at %s UTC",
                count,
                destination,
                error,
                due,
            )
        for (destination, error), count in given_up.items():
            log.error(
                "%d message(s) to %s moved to the error queue after their last attempt: %s",
                count,
                destination,
                error,
            )

    def _retry_or_give_up(
        self,
        connection: Connection,
        message: ClaimedMessage,
        decision: Deliver,
        failure: Failed,
        now: datetime,
    ) -> tuple[str, str | None]:
        """Store the message for a later attempt, or give up. Returns (counter, due time)."""
        attempts = message.attempts + 1
        policy = self.config.retries
        give_up = (
            gives_up_after(attempts, policy)
            or not failure.retryable
            or (failure.missing_queue and policy.missing_queue == "error")
        )
        if give_up:
            log.debug(
                "message %s to %s failed after %d attempt(s): %s; moved to the error queue",
                decision.message_id,
                decision.destination.canonical,
                attempts,
                failure.error,
            )
            self._dead_letter_with_reason(
                connection,
                message,
                decision.headers,
                "missing-queue" if failure.missing_queue else "delivery-failed",
                failure.error,
                "SFBridge.DeliveryFailed",
                now,
                attempts=attempts,
            )
            return ERRORS, None
        due = next_attempt_at(now, attempts, policy)
        log.debug(
            "message %s to %s: attempt %d of %d failed: %s; next attempt at %s",
            decision.message_id,
            decision.destination.canonical,
            attempts,
            policy.max_attempts,
            failure.error,
            due.strftime("%H:%M:%S"),
        )
        dialect = self.dialect
        connection.execute(
            dialect.sql("retry_store", retry=self.tables.retry),
            (
                dialect.encode_id(message.row_id),
                self.forwarder.name,
                decision.destination.canonical,
                dialect.encode_timestamp(message.expires),
                message.headers_text,
                message.body,
                attempts,
                dialect.encode_timestamp(message.first_failure_at or now),
                dialect.encode_timestamp(due),
                failure.error,
            ),
        )
        return RETRIES, due.strftime("%H:%M:%S")

    def _dead_letter(
        self, connection: Connection, message: ClaimedMessage, headers_text: str
    ) -> None:
        connection.execute(
            self.dialect.sql("dead_letter", queue=self.tables.error_queue),
            (self.dialect.encode_id(message.row_id), headers_text, message.body),
        )

    def _dead_letter_with_reason(
        self,
        connection: Connection,
        message: ClaimedMessage,
        headers: dict[str, str | None],
        reason_code: str,
        reason: str,
        exception_type: str,
        now: datetime,
        *,
        attempts: int | None,
    ) -> None:
        failure_headers = with_failure_headers(
            headers,
            failed_queue=self.tables.queue_canonical,
            exception_type=exception_type,
            message=reason,
            reason=reason_code,
            failed_at=now,
            attempts=attempts,
        )
        self._dead_letter(connection, message, serialize_headers(failure_headers))

    def _add_counters(self, connection: Connection, counts: Counter[str]) -> None:
        statement = self.dialect.sql("counters_add", counters=self.tables.counters)
        for name in sorted(counts):
            if counts[name]:
                connection.execute(statement, (self.forwarder.name, name, self.slot, counts[name]))


def outage_hold_seconds(config: BridgeConfig) -> float:
    """How long one failed connection counts as proof that a database is down."""
    return min(config.retries.delay, 5.0)


def _as_bytes(value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"unexpected body type {type(value).__name__}")


def _utcnow() -> datetime:
    """Naive UTC: the queue tables store UTC wall-clock times without a zone."""
    return datetime.now(UTC).replace(tzinfo=None)
