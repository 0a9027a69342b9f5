"""Specification of bridge.forwarding.hops: what a trace is told of each unit of a committed batch
(where it went, how it ended, what happened on the way, the sender's trace context). Pure."""

from __future__ import annotations

import uuid
from datetime import datetime

from bridge.addressing import TableAddress
from bridge.config.model import RetryConfig
from bridge.forwarding.hops import (
    DEDUP_HIT,
    OUTAGE_WAIT,
    RETRY_SCHEDULED,
    SENT_TO_ERROR_QUEUE,
    Hop,
    HopEvent,
    hop_of,
    hops_of,
)
from bridge.messages import (
    ClaimedMessage,
    Delivered,
    DeliveryResult,
    Duplicate,
    Expired,
    Failed,
    Forward,
    NoSubscribers,
    Poison,
    Publish,
    Reject,
    Unit,
    UnitDecision,
)
from bridge.routing import Destination

NOW = datetime(2026, 11, 23, 12, 0, 0)
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
HEADERS = {"NServiceBus.MessageId": "m-1", "traceparent": TRACEPARENT, "tracestate": "a=b"}
DESTINATION = Destination("receiver", TableAddress("Receiver", "public"), '"public"."Receiver"')
POLICY = RetryConfig(delay=10.0, max_attempts=3, during_outage="wait", max_wait=3600.0)
QUEUES = {"forwarding_queue": '"public"."Forward"', "error_queue": '"public"."error"'}


def claimed(attempts: int = 0, headers_text: str = "{}") -> ClaimedMessage:
    return ClaimedMessage(uuid.uuid4(), False, None, headers_text, b"", 1, attempts=attempts)


def hop(
    decision: UnitDecision,
    result: DeliveryResult | None = None,
    *,
    attempts: int = 0,
    copy: bool = False,
    headers_text: str = "{}",
) -> Hop:
    unit = Unit(claimed(attempts, headers_text), decision, "{}", uuid.uuid4() if copy else None)
    [only] = hops_of([unit], [result], POLICY, "drop", NOW, **QUEUES)
    return only


def forward(headers: dict[str, str | None] = HEADERS) -> Forward:
    return Forward(headers, DESTINATION, "{}", "m-1")


def test_a_delivered_message_is_a_send_to_its_destination_in_its_senders_trace() -> None:
    assert hop(forward(), Delivered()) == Hop(
        traceparent=TRACEPARENT,
        tracestate="a=b",
        new_trace=False,
        operation="send",
        destination='"public"."Receiver"',
        destination_database="receiver",
        message_id="m-1",
        attempt=1,
        outcome="delivered",
        error_type=None,
        events=(),
    )


def test_a_subscribers_copy_is_a_publish() -> None:
    assert hop(forward(), Delivered(), copy=True).operation == "publish"


def test_a_message_without_traceparent_has_no_trace_context_even_with_a_tracestate() -> None:
    found = hop(forward({"NServiceBus.MessageId": "m-1", "tracestate": "a=b"}), Delivered())
    assert (found.traceparent, found.tracestate, found.new_trace) == (None, None, False)


def test_start_new_trace_counts_only_when_exactly_true() -> None:
    for value, new in (("True", True), ("true", False), ("False", False), (None, False)):
        headers = {**HEADERS, "NServiceBus.OpenTelemetry.StartNewTrace": value}
        assert hop(forward(headers), Delivered()).new_trace is new, value


def test_a_retry_counts_its_attempt() -> None:
    assert hop(forward(), Delivered(), attempts=2).attempt == 3


def test_a_duplicate_is_a_dedup_hit() -> None:
    found = hop(forward(), Duplicate())
    assert (found.outcome, found.events) == ("duplicates-skipped", (HopEvent(DEDUP_HIT),))


def test_a_failed_delivery_schedules_a_retry_with_its_due_time_and_error() -> None:
    found = hop(forward(), Failed("boom"))
    assert (found.outcome, found.error_type) == ("retries-scheduled", "delivery-failed")
    assert found.events == (
        HopEvent(
            RETRY_SCHEDULED,
            (
                ("sfbridge.retry.due", "2026-11-23T12:00:10Z"),
                ("sfbridge.attempts_spent", 1),
                ("sfbridge.error", "boom"),
            ),
        ),
    )


def test_an_outage_is_a_wait_that_spends_no_attempt() -> None:
    found = hop(forward(), Failed("down", outage=True))
    assert (found.outcome, found.error_type) == ("retries-scheduled", "outage")
    [event] = found.events
    assert event.name == OUTAGE_WAIT
    assert dict(event.attributes)["sfbridge.destination.database"] == "receiver"
    assert dict(event.attributes)["sfbridge.attempts_spent"] == 0


def test_the_last_attempt_sends_it_to_the_error_queue_with_the_reason() -> None:
    found = hop(forward(), Failed("no table", missing_queue=True), attempts=2)
    assert (found.outcome, found.error_type, found.attempt) == (
        "sent-to-error-queue",
        "missing-queue",
        3,
    )
    assert found.events == (
        HopEvent(
            SENT_TO_ERROR_QUEUE,
            (("sfbridge.failure.code", "missing-queue"), ("sfbridge.failure.reason", "no table")),
        ),
    )


def test_a_rejected_message_goes_to_the_error_queue_named_as_its_destination() -> None:
    found = hop(Reject(HEADERS, "no-destination", "no destination header"))
    assert (found.destination, found.destination_database) == ('"public"."error"', None)
    assert found.error_type == "no-destination" and found.traceparent == TRACEPARENT


def test_a_poison_message_has_no_trace_context_and_goes_to_the_error_queue() -> None:
    found = hop(Poison("not JSON"))
    assert (found.traceparent, found.message_id, found.outcome) == (
        None,
        None,
        "sent-to-error-queue",
    )
    assert found.events[0].name == SENT_TO_ERROR_QUEUE


def test_an_expired_message_is_read_for_its_trace_and_named_by_the_forwarding_queue() -> None:
    found = hop(Expired(), headers_text=f'{{"traceparent": "{TRACEPARENT}"}}')
    assert (found.traceparent, found.tracestate) == (TRACEPARENT, None)
    assert (found.destination, found.outcome) == ('"public"."Forward"', "expired-dropped")
    assert hop(Expired(), headers_text="not json").traceparent is None


def test_an_event_without_subscribers_keeps_its_senders_trace() -> None:
    publish = Publish(HEADERS, "Shared.OrderAccepted, Shared", ("Shared.OrderAccepted",))
    found = hop(NoSubscribers(publish))
    assert found.outcome == "published-without-subscribers"
    assert found.traceparent == TRACEPARENT and found.message_id == "m-1"


def test_the_short_path_of_delivered_units_says_what_the_long_one_says() -> None:
    variants: list[dict[str, str | None]] = [
        HEADERS,
        {"NServiceBus.MessageId": "m-2"},
        {"NServiceBus.MessageId": "m-3", "tracestate": "a=b"},
        {**HEADERS, "NServiceBus.OpenTelemetry.StartNewTrace": "True"},
        {"NServiceBus.OpenTelemetry.StartNewTrace": "True", "traceparent": ""},
    ]
    units = [
        Unit(claimed(attempts), forward(headers), "{}", uuid.uuid4() if copy else None)
        for headers in variants
        for attempts in (0, 4)
        for copy in (False, True)
    ]
    results: list[DeliveryResult | None] = [Delivered()] * len(units)
    short = hops_of(units, results, POLICY, "drop", NOW, **QUEUES)
    long = [
        hop_of(unit, Delivered(), POLICY, "drop", NOW, QUEUES["forwarding_queue"],
               QUEUES["error_queue"])
        for unit in units
    ]  # fmt: skip
    assert short == long
