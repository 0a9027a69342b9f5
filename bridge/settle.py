"""Settling a batch: what was not delivered goes to retry storage or the error queue, inside
the source transaction, so it is recorded exactly when the claimed rows disappear.
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import datetime

from bridge.classify import ClaimedMessage
from bridge.config.durations import format_duration
from bridge.config.model import ForwarderConfig, RetryConfig
from bridge.deliver import Failed
from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.headers import Headers, serialize_headers, with_failure_headers
from bridge.retry_policy import gives_up_after, next_attempt_at, waited_too_long
from bridge.tables import ForwarderTables, owned_table

log = logging.getLogger(__name__)

# Counter names, as `status` shows them.
DELIVERED = "delivered"
DUPLICATES = "duplicates-skipped"
EXPIRED = "expired-dropped"
RETRIES = "retries-scheduled"
ERRORS = "sent-to-error-queue"
NO_SUBSCRIBERS = "published-without-subscribers"


class Settlement:
    """Writes each claimed message's fate into the open source transaction, and counts it."""

    def __init__(
        self,
        connection: Connection,
        dialect: Dialect,
        forwarder: ForwarderConfig,
        tables: ForwarderTables,
        policy: RetryConfig,
        *,
        slot: int,
        now: datetime,
    ) -> None:
        self._connection = connection
        self._dialect = dialect
        self._forwarder = forwarder
        self._tables = tables
        self._policy = policy
        self._slot = slot
        self._now = now
        self.counts: Counter[str] = Counter()
        # One log line per destination and error per batch, not one per message: an outage
        # with a backlog of thousands must not flood the journal.
        self._retried: Counter[tuple[str, str, str]] = Counter()
        self._given_up: Counter[tuple[str, str]] = Counter()
        self._waiting: Counter[str] = Counter()

    def count(self, counter: str) -> None:
        self.counts[counter] += 1

    def dead_letter_as_is(self, message: ClaimedMessage, reason: str) -> None:
        """Poison: the row goes to the error queue exactly as it was (nsb-wire §7)."""
        log.error(
            "message %s in %s cannot be processed (%s); moved to the error queue as is",
            message.row_id,
            self._tables.queue_canonical,
            reason,
        )
        self._dead_letter(message, message.headers_text or "")
        self.count(ERRORS)

    def reject(self, message: ClaimedMessage, headers: Headers, code: str, reason: str) -> None:
        """To the error queue at once, with the failure headers and a reason to act on."""
        log.warning("message %s: %s; moved to the error queue", message.row_id, reason)
        self._dead_letter_with_reason(
            message, headers, code, reason, "SFBridge.UnroutableMessage", attempts=None
        )
        self.count(ERRORS)

    def failed(
        self,
        message: ClaimedMessage,
        headers: Headers,
        stored_headers_text: str,
        destination: str,
        failure: Failed,
        destination_database: str | None = None,
    ) -> None:
        """Store for a later attempt, or give up to the error queue after the last one.

        `stored_headers_text` is what retry storage keeps and routes again later; `headers`
        what the error queue gets (with the failure headers) when this was the last attempt.
        With `retries.during_outage: wait` an outage spends no attempt; the message waits,
        up to `retries.max_wait` from its first failure.
        """
        policy = self._policy
        waits_out_outage = failure.outage and policy.during_outage == "wait"
        attempts = message.attempts + (0 if waits_out_outage else 1)
        first_failure_at = message.first_failure_at or self._now
        if waits_out_outage and waited_too_long(first_failure_at, self._now, policy):
            reason = (
                f"waited {format_duration((self._now - first_failure_at).total_seconds())} for "
                f"database '{destination_database}' (retries.max_wait is "
                f"{format_duration(policy.max_wait)}); last error: {failure.error}"
            )
            self._give_up(message, headers, destination, "outage-too-long", reason, attempts)
            return
        give_up = not waits_out_outage and (
            gives_up_after(attempts, policy)
            or not failure.retryable
            or (failure.missing_queue and policy.missing_queue == "error")
        )
        if give_up:
            code = "missing-queue" if failure.missing_queue else "delivery-failed"
            self._give_up(message, headers, destination, code, failure.error, attempts)
            return
        due = next_attempt_at(self._now, max(attempts, 1), policy)
        dialect = self._dialect
        with owned_table("retry storage", dialect.grammar.render(self._tables.retry)):
            self._connection.execute(
                dialect.sql("retry_store", retry=self._tables.retry),
                (
                    dialect.encode_id(message.row_id),
                    self._forwarder.name,
                    destination,
                    destination_database,
                    dialect.encode_timestamp(message.expires),
                    stored_headers_text,
                    message.body,
                    attempts,
                    dialect.encode_timestamp(first_failure_at),
                    dialect.encode_timestamp(due),
                    failure.error,
                ),
            )
        if waits_out_outage:
            self._waiting[destination_database or destination] += 1
        else:
            self._retried[(destination, failure.error, due.strftime("%H:%M:%S"))] += 1
        self.count(RETRIES)

    def _give_up(
        self,
        message: ClaimedMessage,
        headers: Headers,
        destination: str,
        code: str,
        reason: str,
        attempts: int,
    ) -> None:
        self._dead_letter_with_reason(
            message, headers, code, reason, "SFBridge.DeliveryFailed", attempts=attempts
        )
        self._given_up[(destination, reason)] += 1
        self.count(ERRORS)

    def finish(self) -> Counter[str]:
        """Add the counts to the counters table and log the batch's failures, grouped."""
        statement = self._dialect.sql("counters_add", counters=self._tables.counters)
        with owned_table("counters", self._dialect.grammar.render(self._tables.counters)):
            for name in sorted(self.counts):
                if self.counts[name]:
                    self._connection.execute(
                        statement, (self._forwarder.name, name, self._slot, self.counts[name])
                    )
        for database, count in self._waiting.items():
            # The outage itself is logged once, when it starts (bridge.outages).
            log.info("%d message(s) wait in retry storage for database '%s'", count, database)
        for (destination, error, due), count in self._retried.items():
            log.warning(
                "%d message(s) to %s not delivered: %s; next attempt at %s UTC",
                count,
                destination,
                error,
                due,
            )
        for (destination, error), count in self._given_up.items():
            log.error(
                "%d message(s) to %s moved to the error queue after their last attempt: %s",
                count,
                destination,
                error,
            )
        return self.counts

    def _dead_letter(self, message: ClaimedMessage, headers_text: str) -> None:
        error_queue = self._tables.error_queue
        with owned_table("error queue", self._dialect.grammar.render(error_queue)):
            self._dialect.write_queue(
                self._connection,
                "dead_letter",
                error_queue,
                (self._dialect.encode_id(message.row_id), headers_text, message.body),
            )

    def _dead_letter_with_reason(
        self,
        message: ClaimedMessage,
        headers: Headers,
        code: str,
        reason: str,
        exception_type: str,
        *,
        attempts: int | None,
    ) -> None:
        failure_headers = with_failure_headers(
            headers,
            failed_queue=self._tables.queue_canonical,
            exception_type=exception_type,
            message=reason,
            reason=code,
            failed_at=self._now,
            attempts=attempts,
        )
        self._dead_letter(message, serialize_headers(failure_headers))
