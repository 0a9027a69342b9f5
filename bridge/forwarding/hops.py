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

# The header by which an NServiceBus sender asks the receiver to start a new trace, linked to
# the sender's (the trace context itself is in W3C `traceparent` and `tracestate`).
START_NEW_TRACE_HEADER = "NServiceBus.OpenTelemetry.StartNewTrace"

EventValue = str | int
_NO_EVENTS: tuple[HopEvent, ...] = ()


@dataclass(frozen=True, slots=True)
class HopEvent:
    """Something that happened to a hop: `name` (one of the names above) and its attributes."""

    name: str
    attributes: tuple[tuple[str, EventValue], ...] = ()


# Built once per unit of every traced batch, so not frozen: a frozen dataclass costs about
# three times as much to build (bridge/messages.py says the same). Nothing assigns to them.
@dataclass(slots=True)
class Hop:
    """One unit's way through the batch.

    `traceparent`, `tracestate`: the message's trace context headers as they are (None when it
    has no `traceparent`, or its headers cannot be read); `new_trace`: the sender asked for a
    new trace (`NServiceBus.OpenTelemetry.StartNewTrace` is `True`). `operation`
    is `send`, or `publish` for a subscriber's copy of an event. `destination` is the queue it
    was routed to (canonical), or for a message that never had one the error queue it went to
    or the forwarding queue it came from. `attempt` counts this one: 1 for a message from the
    queue. `outcome` is settle's counter name (`delivered`, `retries-scheduled`, ...);
    `error_type` a short code when it was not delivered (`outage`, `delivery-failed`, ...).
    """

    traceparent: str | None
    tracestate: str | None
    new_trace: bool
    operation: str
    destination: str
    destination_database: str | None
    message_id: str | None
    attempt: int
    outcome: str
    error_type: str | None
    events: tuple[HopEvent, ...]


@dataclass(slots=True)
class CommittedBatch:
    """A batch whose source transaction committed, as a tracer is handed it: its `hops`, of
    `forwarder`, claimed from `source` (`queue` or `retry`; `source_queue` is the forwarding
    queue, canonical) at `started_ns` and committed at `ended_ns` (Unix epoch ns). The hops
    hold no message bodies: a tracer may keep them a while."""

    forwarder: str
    source: Source
    source_queue: str
    hops: list[Hop]
    started_ns: int
    ended_ns: int


class HopTracer(Protocol):
    """Told every batch whose source transaction committed."""

    def traced(self, batch: CommittedBatch) -> None:
        """Called by the worker right after the commit: returns at once, leaving the spans to
        a thread of the tracer's."""


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
    hops: list[Hop] = []
    for unit, result in zip(units, results, strict=True):
        decision = unit.decision
        if type(result) is Delivered and type(decision) is Forward:
            # Nearly every unit, and every traced message pays for this: `hop_of`, shortened.
            headers, destination = decision.headers, decision.destination
            traceparent = headers.get("traceparent") or None
            hops.append(
                Hop(
                    traceparent,
                    headers.get("tracestate") or None if traceparent else None,
                    traceparent is not None and headers.get(START_NEW_TRACE_HEADER) == "True",
                    "send" if unit.copy_row_id is None else "publish",
                    destination.canonical,
                    destination.database,
                    headers.get(MESSAGE_ID_HEADER),
                    unit.message.attempts + 1,
                    DELIVERED,
                    None,
                    _NO_EVENTS,
                )
            )
        else:
            hops.append(
                hop_of(unit, result, policy, no_subscribers, now, forwarding_queue, error_queue)
            )
    return hops


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
    if type(result) is Delivered:  # nearly every unit, as in settle: nothing to work out
        outcome, error_type, events = DELIVERED, None, _NO_EVENTS
    else:
        outcome, error_type, events = _told(
            fate_of(unit, result, policy, no_subscribers, now), database
        )
    if destination is None:
        destination = error_queue if outcome == ERRORS else forwarding_queue
    traceparent = tracestate = None
    new_trace = False
    if headers and (traceparent := headers.get("traceparent") or None):
        tracestate = headers.get("tracestate") or None
        # Compared as an NServiceBus receiver compares it: exactly `True`; anything else
        # continues the sender's trace.
        new_trace = headers.get(START_NEW_TRACE_HEADER) == "True"
    return Hop(
        traceparent=traceparent,
        tracestate=tracestate,
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


# The outcomes a span is marked failed for: the hop did not get the message where it was going.
FAILED_OUTCOMES = frozenset({RETRIES, ERRORS})
