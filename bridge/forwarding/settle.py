"""Settling a batch: every unit's fate, written into the open source transaction.

A unit's fate follows from its decision and, for a delivery, its result (`fate_of`, pure):
counted (delivered, duplicate, expired, published without subscribers), to the error queue as
it is (poison) or with a reason (rejected, or given up on), or stored in retry storage for a
later attempt. `Settlement` writes the fates in the source transaction, so they are recorded
exactly when the claimed rows disappear, and adds to the counters.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from bridge.config.durations import format_duration
from bridge.config.model import ForwarderConfig, NoSubscribersPolicy, RetryConfig
from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.forwarding.catch_up import HELD_MESSAGES, HELD_MILLISECONDS, Held
from bridge.forwarding.repeats import RepeatedLines
from bridge.forwarding.writes import QueueWriter
from bridge.headers import MESSAGE_ID_HEADER, Headers, serialize_headers, with_failure_headers
from bridge.messages import (
    UNREADABLE_ROW,
    Delivered,
    DeliveryResult,
    Duplicate,
    Expired,
    Failed,
    Forward,
    NoSubscribers,
    Poison,
    Reject,
    SubscribersUnknown,
    Unit,
    about,
)
from bridge.processing_host import processing_host
from bridge.retry_policy import gives_up_after, next_attempt_at, waited_too_long
from bridge.secrets import inert
from bridge.storage.retries import store_retry
from bridge.storage.tables import ForwarderTables, owned_table

log = logging.getLogger(__name__)

# Counter names, as `status` shows them.
DELIVERED = "delivered"
DUPLICATES = "duplicates-skipped"
EXPIRED = "expired-dropped"
RETRIES = "retries-scheduled"
ERRORS = "sent-to-error-queue"
NO_SUBSCRIBERS = "published-without-subscribers"
# Claims, counted in the same transaction as their outcomes, so that `spark reconcile` can check
# from the database that CLAIMED + FAN_OUT_COPIES equals the sum of OUTCOMES.
CLAIMED = "claimed"
FAN_OUT_COPIES = "fan-out-copies"
# Counted in the table, not outcomes of the batch's messages.
_BOOKKEEPING = frozenset({CLAIMED, FAN_OUT_COPIES, HELD_MESSAGES, HELD_MILLISECONDS})
OUTCOMES = (DELIVERED, DUPLICATES, EXPIRED, RETRIES, ERRORS, NO_SUBSCRIBERS)
# Of ERRORS, the rows of the forwarder's own queue whose headers cannot be read: moved as they
# are, so they name no NServiceBus.FailedQ and the error-queue count cannot charge them to the
# forwarder (`bridge.storage.error_counts`); this counter does (a metric, and an alert on it).
POISON = "poison-to-error-queue"


# -- fates ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Count:
    """Nothing to write but the counter."""

    counter: str


@dataclass(frozen=True)
class DeadLetterAsIs:
    """Poison: to the error queue exactly as it was, as the transport does."""

    reason: str


@dataclass(frozen=True)
class DeadLetter:
    """To the error queue with the NServiceBus failure headers and a reason to act on."""

    headers: Headers
    code: str
    reason: str
    exception_type: str
    attempts: int | None
    destination: str | None = None  # for the grouped log line of messages given up on


@dataclass(frozen=True)
class StoreForRetry:
    """To retry storage, due again at `due`. `waiting`: it waits out an outage."""

    headers_text: str
    destination: str
    destination_database: str | None
    attempts: int
    first_failure_at: datetime
    due: datetime
    error: str
    waiting: bool


Fate = Count | DeadLetterAsIs | DeadLetter | StoreForRetry


def fate_of(
    unit: Unit,
    result: DeliveryResult | None,
    policy: RetryConfig,
    no_subscribers: NoSubscribersPolicy,
    now: datetime,
) -> Fate:
    """What becomes of one unit, given its delivery result (None unless it was delivered)."""
    decision = unit.decision
    if isinstance(decision, Poison):
        return DeadLetterAsIs(decision.reason)
    if isinstance(decision, Expired):
        return Count(EXPIRED)
    if isinstance(decision, Reject):
        exception_type = (
            "SFBridge.UnreadableRow"
            if decision.reason_code == UNREADABLE_ROW
            else "SFBridge.UnroutableMessage"
        )
        return DeadLetter(
            decision.headers, decision.reason_code, decision.reason, exception_type, None
        )
    if isinstance(decision, NoSubscribers):
        if no_subscribers == "drop":
            return Count(NO_SUBSCRIBERS)
        publish = decision.publish
        reason = (
            f"published event {publish.topics[0]!r} has no subscribers (topics looked up: "
            f"{', '.join(publish.topics)})"
        )
        return DeadLetter(
            publish.headers, "no-subscribers", reason, "SFBridge.UnroutableMessage", None
        )
    if isinstance(decision, SubscribersUnknown):
        destination = f"subscribers of {decision.publish.topics[0]}"
        failure = Failed(decision.error)
        return retry_fate(unit, decision.publish.headers, destination, None, failure,
                          policy, now)  # fmt: skip
    assert isinstance(decision, Forward), decision
    if isinstance(result, Delivered):
        return Count(DELIVERED)
    if isinstance(result, Duplicate):
        return Count(DUPLICATES)
    assert isinstance(result, Failed), result
    target = decision.destination
    return retry_fate(unit, decision.headers, target.canonical, target.database,
                      result, policy, now)  # fmt: skip


def retry_fate(
    unit: Unit,
    headers: Headers,
    destination: str,
    destination_database: str | None,
    failure: Failed,
    policy: RetryConfig,
    now: datetime,
) -> DeadLetter | StoreForRetry:
    """A failed delivery: stored for a later attempt, or given up on after the last one.

    With `retries.during_outage: wait` an outage spends no attempt; the message waits, up to
    `retries.max_wait` from its first failure; so does a refused login, whatever the policy
    (retrying does not fix it, and no attempt was made while it stands). A paused database
    spends none either, and a message waits for it as long as the pause lasts.
    """
    message = unit.message
    if failure.paused:
        return StoreForRetry(
            headers_text=unit.retry_headers_text,
            destination=destination,
            destination_database=destination_database,
            attempts=message.attempts,
            first_failure_at=message.first_failure_at or now,
            due=next_attempt_at(now, max(message.attempts, 1), policy),
            error=failure.error,
            waiting=True,
        )
    waits = failure.login_refused or (failure.outage and policy.during_outage == "wait")
    attempts = message.attempts + (0 if waits else 1)
    first_failure_at = message.first_failure_at or now
    if waits and waited_too_long(first_failure_at, now, policy):
        waited = format_duration(round((now - first_failure_at).total_seconds()))
        reason = (
            f"waited {waited} for database '{destination_database}' (retries.max_wait is "
            f"{format_duration(policy.max_wait)}); last error: {failure.error}"
        )
        return DeadLetter(
            headers, "outage-too-long", reason, "SFBridge.DeliveryFailed", attempts, destination
        )
    if not waits and (
        gives_up_after(attempts, policy)
        or not failure.retryable
        or (failure.missing_queue and policy.missing_queue == "error")
    ):
        code = "missing-queue" if failure.missing_queue else "delivery-failed"
        return DeadLetter(
            headers, code, failure.error, "SFBridge.DeliveryFailed", attempts, destination
        )
    return StoreForRetry(
        headers_text=unit.retry_headers_text,
        destination=destination,
        destination_database=destination_database,
        attempts=attempts,
        first_failure_at=first_failure_at,
        due=next_attempt_at(now, max(attempts, 1), policy),
        error=failure.error,
        waiting=waits,
    )


# -- writing them ----------------------------------------------------------------------------


class Settlement:
    """Writes each unit's fate into the open source transaction, and counts it."""

    def __init__(
        self,
        connection: Connection,
        dialect: Dialect,
        forwarder: ForwarderConfig,
        tables: ForwarderTables,
        *,
        slot: int,
        now: datetime,
        writer: QueueWriter,
        repeats: float = 60.0,
        repeated_lines: RepeatedLines | None = None,
    ) -> None:
        """`repeated_lines` holds a failure told once for `repeats` seconds
        (`logging.repeats`); without it, each batch's failures are told in full."""
        self._connection = connection
        self._dialect = dialect
        self._forwarder = forwarder
        self._tables = tables
        self._slot = slot
        self._now = now
        self._writer = writer
        self.counts: Counter[str] = Counter()
        # One log line per destination and error per batch, not one per message: an outage
        # with a backlog of thousands must not flood the journal.
        self._retried: Counter[tuple[str, str, str]] = Counter()
        self._waiting: Counter[str] = Counter()
        # Messages moved to the error queue, per (level, what happened to them): one line per
        # batch and reason naming a few of them, and repeats held (`bridge.forwarding.repeats`).
        # Keyed by (level, subject, reason code).
        self._dead_lettered: dict[tuple[int, str, str], list[str]] = {}
        self._repeats = repeats if repeated_lines is not None else 0.0
        self._repeated_lines = repeated_lines or RepeatedLines()

    def settle(
        self,
        units: Sequence[Unit],
        results: Sequence[DeliveryResult | None],
        policy: RetryConfig,
        no_subscribers: NoSubscribersPolicy,
        held: Held | None = None,
    ) -> Counter[str]:
        """Write every unit's fate, add to the counters (with what catch-up limits `held`
        back), log what failed (grouped)."""
        claimed = len({id(unit.message) for unit in units})
        if held is not None and held.messages:
            self.counts[HELD_MESSAGES] += sum(held.messages.values())
            self.counts[HELD_MILLISECONDS] += round(sum(held.seconds.values()) * 1000)
        self.counts[CLAIMED] += claimed
        self.counts[FAN_OUT_COPIES] += len(units) - claimed
        delivered = 0
        for unit, result in zip(units, results, strict=True):
            if type(result) is Delivered:
                # Nearly every unit: nothing to write but the counter (`fate_of` says so too).
                delivered += 1
            else:
                self.apply(unit, fate_of(unit, result, policy, no_subscribers, self._now))
        self.counts[DELIVERED] += delivered
        return self.finish()

    def apply(self, unit: Unit, fate: Fate) -> None:
        message = unit.message
        if isinstance(fate, Count):
            self._log_counted(unit, fate)
            self.counts[fate.counter] += 1
        elif isinstance(fate, DeadLetterAsIs):
            subject = (
                f"in {self._tables.queue_canonical} cannot be processed ({fate.reason}); moved "
                "to the error queue as is"
            )
            # Headers that cannot be read name no MessageId: the row's Id is all there is.
            self._dead_lettered.setdefault((logging.ERROR, subject, UNREADABLE_ROW), []).append(
                f"row Id {message.row_id}"
            )
            self._dead_letter(unit, message.headers_text or "")
            self.counts[ERRORS] += 1
            self.counts[POISON] += 1
        elif isinstance(fate, DeadLetter):
            if fate.attempts is None:
                level = logging.WARNING
                subject = (
                    f"from {self._tables.queue_canonical} moved to the error queue: {fate.reason}"
                )
            else:
                level = logging.ERROR
                subject = (
                    f"to {fate.destination or '?'} moved to the error queue after their last "
                    f"attempt: {fate.reason}"
                )
            self._dead_lettered.setdefault((level, subject, fate.code), []).append(
                _known_as(fate.headers, message.row_id)
            )
            self._dead_letter_with_reason(unit, fate)
            self.counts[ERRORS] += 1
        else:
            self._store_for_retry(unit, fate)
            self.counts[RETRIES] += 1

    def _log_counted(self, unit: Unit, fate: Count) -> None:
        outcome = unit.decision
        if fate.counter == DUPLICATES and isinstance(outcome, Forward):
            log.info(
                "message %s was already delivered to %s; not delivering it twice",
                outcome.message_id,
                outcome.destination.canonical,
            )
        elif fate.counter == NO_SUBSCRIBERS and isinstance(outcome, NoSubscribers):
            log.info(
                "message %s: published event %r has no subscribers; dropped",
                unit.message.row_id,
                outcome.publish.topics[0],
            )

    def _store_for_retry(self, unit: Unit, fate: StoreForRetry) -> None:
        message = unit.message
        dialect = self._dialect
        store_retry(
            self._connection,
            dialect,
            self._tables.retry,
            unit.row_id,
            self._forwarder.name,
            (fate.destination, fate.destination_database),
            (message.expires, fate.headers_text, message.body),
            fate.attempts,
            fate.first_failure_at,
            fate.due,
            fate.error,
        )
        if fate.waiting:
            self._waiting[fate.destination_database or fate.destination] += 1
        else:
            self._retried[(fate.destination, fate.error, fate.due.strftime("%H:%M:%S"))] += 1

    def finish(self) -> Counter[str]:
        """Add the counts to the counters table. Returns the outcome counts (the claim
        bookkeeping goes to the table only); `tell` logs the failures once committed."""
        counted = [(name, value) for name, value in sorted(self.counts.items()) if value]
        if counted:
            statement = self._dialect.sql(
                "counters_add_many", rows=len(counted), counters=self._tables.counters
            )
            parameters = [
                value
                for name, count in counted
                for value in (self._forwarder.name, name, self._slot, count)
            ]
            with owned_table("counters", self._dialect.grammar.render(self._tables.counters)):
                self._connection.execute(statement, parameters)
        return Counter({k: v for k, v in self.counts.items() if k not in _BOOKKEEPING})

    def tell(self) -> None:
        """Log the batch's failures, grouped (one line per destination and error, or per
        reason, a repeated reason held by `repeated_lines`); after the commit."""
        for database, count in self._waiting.items():
            # The outage itself is logged once, when it starts (bridge.outages).
            log.info(
                "%d message(s) wait in retry storage for database '%s'",
                count,
                database,
                extra=about(forwarder=self._forwarder.name, database=database),
            )
        for (destination, error, due), count in self._retried.items():
            log.warning(
                "%d message(s) to %s not delivered: %s; next attempt at %s UTC",
                count,
                destination,
                error,
                due,
                extra=about(forwarder=self._forwarder.name),
            )
        for (level, subject, code), ids in self._dead_lettered.items():
            self._repeated_lines.tell(
                __name__,
                level,
                (self._forwarder.name, str(level), subject),
                f"forwarder '{self._forwarder.name}': ",
                subject,
                len(ids),
                ids,
                self._repeats,
                about(forwarder=self._forwarder.name, error_code=code),
            )

    def _dead_letter(self, unit: Unit, headers_text: str) -> None:
        error_queue = self._tables.error_queue
        with owned_table("error queue", self._dialect.grammar.render(error_queue)):
            self._writer.write(
                self._connection,
                self._dialect,
                "dead_letter",
                error_queue,
                (self._dialect.encode_id(unit.row_id), headers_text, unit.message.body),
            )

    def _dead_letter_with_reason(self, unit: Unit, fate: DeadLetter) -> None:
        failure_headers = with_failure_headers(
            fate.headers,
            failed_queue=self._tables.failed_queue,
            exception_type=fate.exception_type,
            message=fate.reason,
            reason=fate.code,
            failed_at=self._now,
            processed_by=processing_host(self._forwarder.name),
            row_id=str(unit.message.row_id),
            attempts=fate.attempts,
        )
        self._dead_letter(unit, serialize_headers(failure_headers))


def _known_as(headers: Headers, row_id: object) -> str:
    """How a log line names a message: its `NServiceBus.MessageId` (what `send`, the endpoints
    and ServicePulse know it by), else its row's Id. Inert: a sender wrote it."""
    message_id = headers.get(MESSAGE_ID_HEADER)
    return inert(message_id) if message_id else f"row Id {row_id}"
