"""What one batch's hops were, for tracing: per unit (a message, or a subscriber's copy of a
published event) where it went, how it ended and what happened on the way. Pure.

The spine hands a `HopTracer` (the daemon's OpenTelemetry one, `bridge.daemon.tracing`) the
`Hop`s of every batch whose source transaction committed, and nothing when tracing is off: then
none of this runs. A hop's outcome and events follow from the same `fate_of` that settle wrote
(`bridge.forwarding.settle`), so a trace says what the tables say.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from bridge.config.model import NoSubscribersPolicy, RetryConfig
from bridge.exceptions import PoisonHeaders
from bridge.forwarding.settle import (
    DELIVERED,
    DUPLICATES,
    ERRORS,
    RETRIES,
    Count,
    DeadLetter,
    DeadLetterAsIs,
    StoreForRetry,
    fate_of,
)
from bridge.headers import MESSAGE_ID_HEADER, Headers, parse_headers
from bridge.messages import (
    Delivered,
    DeliveryResult,
    Expired,
    Forward,
    NoSubscribers,
    Poison,
    Reject,
    Source,
    SubscribersUnknown,
    Unit,
)

# Event names (`HopEvent.name`), as the trace shows them.
DEDUP_HIT = "sfbridge.dedup_hit"
OUTAGE_WAIT = "sfbridge.outage_wait"
RETRY_SCHEDULED = "sfbridge.retry_scheduled"
SENT_TO_ERROR_QUEUE = "sfbridge.sent_to_error_queue"

# The headers NServiceBus carries a trace's context in (W3C trace context), and the one by
# which a sender asks the receiver to start a new trace, linked to the sender's.
TRACE_CONTEXT_HEADERS = ("traceparent", "tracestate")
START_NEW_TRACE_HEADER = "NServiceBus.OpenTelemetry.StartNewTrace"

EventValue = str | int


@dataclass(frozen=True, slots=True)
class HopEvent:
    """Something that happened to a hop: `name` (one of the names above) and its attributes."""

    name: str
    attributes: tuple[tuple[str, EventValue], ...] = ()


@dataclass(frozen=True, slots=True)
class Hop:
    """One unit's way through the batch.

    `trace_headers`: the message's trace context headers (`traceparent`, `tracestate`) as
    they are, None when it has none (or its headers cannot be read); `new_trace`: the sender
    asked for a new trace (`NServiceBus.OpenTelemetry.StartNewTrace` is `True`). `operation`
    is `send`, or `publish` for a subscriber's copy of an event. `destination` is the queue it
    was routed to (canonical), or for a message that never had one the error queue it went to
    or the forwarding queue it came from. `attempt` counts this one: 1 for a message from the
    queue. `outcome` is settle's counter name (`delivered`, `retries-scheduled`, ...);
    `error_type` a short code when it was not delivered (`outage`, `delivery-failed`, ...).
    """

    trace_headers: dict[str, str] | None
    new_trace: bool
    operation: str
    destination: str
    destination_database: str | None
    message_id: str | None
    attempt: int
    outcome: str
    error_type: str | None
    events: tuple[HopEvent, ...]


class HopTracer(Protocol):
    """Told the hops of every batch whose source transaction committed."""

    def traced(
        self,
        forwarder: str,
        source: Source,
        source_queue: str,
        hops: Sequence[Hop],
        started_ns: int,
        ended_ns: int,
    ) -> None:
        """`hops` of one batch of `forwarder`, claimed from `source` (`source_queue`, its
        canonical name) at `started_ns` and committed at `ended_ns` (Unix epoch nanoseconds)."""


def hops_of(
    units: Sequence[Unit],
    results: Sequence[DeliveryResult | None],
    policy: RetryConfig,
    no_subscribers: NoSubscribersPolicy,
    now: datetime,
    *,
    forwarding_queue: str,
    error_queue: str,
) -> list[Hop]:
    """One `Hop` per unit, given the batch's delivery `results` and settle's inputs (what it
    decided is decided again: `fate_of` is pure)."""
    return [
        hop_of(unit, result, policy, no_subscribers, now, forwarding_queue, error_queue)
        for unit, result in zip(units, results, strict=True)
    ]


def hop_of(
    unit: Unit,
    result: DeliveryResult | None,
    policy: RetryConfig,
    no_subscribers: NoSubscribersPolicy,
    now: datetime,
    forwarding_queue: str,
    error_queue: str,
) -> Hop:
    decision = unit.decision
    headers = _headers_of(unit)
    attempt = unit.message.attempts + 1
    destination: str | None = None
    database: str | None = None
    if isinstance(decision, Forward):
        destination, database = decision.destination.canonical, decision.destination.database
    operation = "publish" if unit.copy_row_id is not None else "send"
    if type(result) is Delivered:  # nearly every unit, as in settle
        fate: object = Count(DELIVERED)
    else:
        fate = fate_of(unit, result, policy, no_subscribers, now)
    outcome, error_type, events = _told(fate, database)
    if destination is None:
        destination = error_queue if outcome == ERRORS else forwarding_queue
    trace_headers, new_trace = _trace_context(headers)
    return Hop(
        trace_headers=trace_headers,
        new_trace=new_trace,
        operation=operation,
        destination=destination,
        destination_database=database,
        message_id=headers.get(MESSAGE_ID_HEADER) if headers else None,
        attempt=attempt,
        outcome=outcome,
        error_type=error_type,
        events=events,
    )


def _told(fate: object, database: str | None) -> tuple[str, str | None, tuple[HopEvent, ...]]:
    """(outcome, error type, events) of a fate."""
    if isinstance(fate, Count):
        events = (HopEvent(DEDUP_HIT),) if fate.counter == DUPLICATES else ()
        return fate.counter, None, events
    if isinstance(fate, DeadLetterAsIs):
        return ERRORS, "poison", (HopEvent(SENT_TO_ERROR_QUEUE, _reason("poison", fate.reason)),)
    if isinstance(fate, DeadLetter):
        event = HopEvent(SENT_TO_ERROR_QUEUE, _reason(fate.code, fate.reason))
        return ERRORS, fate.code, (event,)
    assert isinstance(fate, StoreForRetry), fate
    due = fate.due.isoformat(timespec="seconds") + "Z"
    attributes: tuple[tuple[str, EventValue], ...] = (
        ("sfbridge.retry.due", due),
        ("sfbridge.attempts_spent", fate.attempts),
        ("sfbridge.error", fate.error),
    )
    if fate.waiting:
        where = (("sfbridge.destination.database", fate.destination_database or database or ""),)
        return RETRIES, "outage", (HopEvent(OUTAGE_WAIT, where + attributes),)
    return RETRIES, "delivery-failed", (HopEvent(RETRY_SCHEDULED, attributes),)


def _reason(code: str, reason: str) -> tuple[tuple[str, EventValue], ...]:
    return (("sfbridge.failure.code", code), ("sfbridge.failure.reason", reason))


def _headers_of(unit: Unit) -> Headers | None:
    """The unit's parsed headers, None when they cannot be read (a poison row)."""
    decision = unit.decision
    if isinstance(decision, Forward | Reject):
        return decision.headers
    if isinstance(decision, NoSubscribers | SubscribersUnknown):
        return decision.publish.headers
    if isinstance(decision, Poison):
        return None
    assert isinstance(decision, Expired), decision
    try:  # an expired row is dropped unread; rare, and only when tracing
        return parse_headers(unit.message.headers_text)
    except PoisonHeaders:
        return None


def _trace_context(headers: Headers | None) -> tuple[dict[str, str] | None, bool]:
    if not headers or not headers.get("traceparent"):
        return None, False
    context = {name: value for name in TRACE_CONTEXT_HEADERS if (value := headers.get(name))}
    # Compared as an NServiceBus receiver compares it: exactly `True`; anything else
    # continues the sender's trace.
    return context, headers.get(START_NEW_TRACE_HEADER) == "True"


# The outcomes a span is marked failed for: the hop did not get the message where it was going.
FAILED_OUTCOMES = frozenset({RETRIES, ERRORS})
