"""Specification of bridge.forwarding.settle.fate_of: what becomes of every unit, given its outcome
and delivery result. Pure: nothing here touches a database."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import get_args

import pytest

from bridge.addressing import TableAddress
from bridge.config.model import RetryConfig
from bridge.forwarding.settle import (
    DELIVERED,
    DUPLICATES,
    EXPIRED,
    NO_SUBSCRIBERS,
    Count,
    DeadLetter,
    DeadLetterAsIs,
    StoreForRetry,
    fate_of,
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
    SubscribersUnknown,
    Unit,
    UnitDecision,
)
from bridge.routing import Destination

NOW = datetime(2026, 11, 23, 12, 0, 0)
HEADERS = {"NServiceBus.MessageId": "m-1", "$.store-and-forward.destination": "Receiver"}
DESTINATION = Destination("receiver", TableAddress("Receiver", "public"), '"public"."Receiver"')
DELIVER = Forward(HEADERS, DESTINATION, "{}", "m-1")
PUBLISH = Publish(HEADERS, "Shared.OrderAccepted, Shared", ("Shared.OrderAccepted",))
# Outages counted (not the default): what these tests say of attempts holds for every failure.
POLICY = RetryConfig(delay=10.0, max_attempts=3, during_outage="count")
WAITING = RetryConfig(delay=10.0, max_attempts=3, during_outage="wait", max_wait=3600.0)


def message(attempts: int = 0, first_failure_at: datetime | None = None) -> ClaimedMessage:
    return ClaimedMessage(
        row_id=uuid.uuid4(),
        expired=False,
        expires=None,
        headers_text='{"original": "headers"}',
        body=b"body",
        order=1,
        attempts=attempts,
        first_failure_at=first_failure_at,
    )


def fate(
    outcome: UnitDecision,
    result: DeliveryResult | None = None,
    *,
    policy: RetryConfig = POLICY,
    claimed: ClaimedMessage | None = None,
    no_subscribers: str = "drop",
    retry_text: str = "stored headers",
):
    unit = Unit(claimed or message(), outcome, retry_text)
    return fate_of(unit, result, policy, no_subscribers, NOW)  # type: ignore[arg-type]


def test_poison_goes_to_the_error_queue_as_it_is() -> None:
    assert fate(Poison("not JSON")) == DeadLetterAsIs("not JSON")


def test_expired_messages_are_counted_and_dropped() -> None:
    assert fate(Expired()) == Count(EXPIRED)


def test_rejected_messages_go_to_the_error_queue_with_their_reason_and_no_attempts() -> None:
    assert fate(Reject(HEADERS, "unroutable", "no route")) == DeadLetter(
        HEADERS, "unroutable", "no route", "SFBridge.UnroutableMessage", None
    )


@pytest.mark.parametrize(
    ("result", "counter"), [(Delivered(), DELIVERED), (Duplicate(), DUPLICATES)]
)
def test_delivered_and_duplicate_messages_are_counted(result: DeliveryResult, counter: str) -> None:
    assert fate(DELIVER, result) == Count(counter)


def test_a_failed_delivery_is_stored_with_one_more_attempt_due_after_the_delay() -> None:
    stored = fate(DELIVER, Failed("refused"), retry_text="as stored")
    assert stored == StoreForRetry(
        headers_text="as stored",
        destination='"public"."Receiver"',
        destination_database="receiver",
        attempts=1,
        first_failure_at=NOW,
        due=NOW + timedelta(seconds=10),
        error="refused",
        waiting=False,
    )


def test_a_retried_message_keeps_its_first_failure_time() -> None:
    earlier = NOW - timedelta(minutes=5)
    stored = fate(DELIVER, Failed("x"), claimed=message(attempts=1, first_failure_at=earlier))
    assert isinstance(stored, StoreForRetry)
    assert (stored.attempts, stored.first_failure_at) == (2, earlier)


def test_the_last_attempt_gives_up_to_the_error_queue() -> None:
    given_up = fate(DELIVER, Failed("refused"), claimed=message(attempts=2))
    assert given_up == DeadLetter(
        HEADERS, "delivery-failed", "refused", "SFBridge.DeliveryFailed", 3, '"public"."Receiver"'
    )


def test_a_message_that_cannot_be_written_gives_up_at_once() -> None:
    given_up = fate(DELIVER, Failed("cannot bind", retryable=False))
    assert isinstance(given_up, DeadLetter) and given_up.attempts == 1


def test_a_missing_queue_is_retried_unless_the_policy_says_error() -> None:
    missing = Failed("no such queue", missing_queue=True)
    assert isinstance(fate(DELIVER, missing), StoreForRetry)
    strict = RetryConfig(missing_queue="error")
    given_up = fate(DELIVER, missing, policy=strict)
    assert isinstance(given_up, DeadLetter) and given_up.code == "missing-queue"


def test_an_outage_spends_attempts_when_outages_count() -> None:
    down = Failed("cannot connect", outage=True)
    assert isinstance(fate(DELIVER, down, claimed=message(attempts=2)), DeadLetter)


def test_an_outage_spends_no_attempt_when_outages_wait() -> None:
    down = Failed("cannot connect", outage=True)
    stored = fate(DELIVER, down, policy=WAITING, claimed=message(attempts=2))
    assert isinstance(stored, StoreForRetry)
    assert stored.attempts == 2 and stored.waiting
    assert stored.due == NOW + timedelta(seconds=10)


def test_a_refused_login_spends_no_attempt_even_when_outages_count() -> None:
    # Retrying does not fix a password: the message waits for a person, up to max_wait.
    refused = Failed("password authentication failed", outage=True, login_refused=True)
    stored = fate(DELIVER, refused, claimed=message(attempts=2))
    assert isinstance(stored, StoreForRetry)
    assert stored.attempts == 2 and stored.waiting
    first = NOW - timedelta(days=8)
    too_long = fate(DELIVER, refused, claimed=message(attempts=2, first_failure_at=first))
    assert isinstance(too_long, DeadLetter) and too_long.code == "outage-too-long"


def test_a_message_that_never_failed_before_waits_due_after_one_delay() -> None:
    stored = fate(DELIVER, Failed("down", outage=True), policy=WAITING)
    assert isinstance(stored, StoreForRetry)
    assert (stored.attempts, stored.due) == (0, NOW + timedelta(seconds=10))


def test_waiting_ends_at_max_wait_with_a_reason_that_says_so() -> None:
    first = NOW - timedelta(hours=1)
    given_up = fate(
        DELIVER,
        Failed("cannot connect", outage=True),
        policy=WAITING,
        claimed=message(attempts=1, first_failure_at=first),
    )
    assert isinstance(given_up, DeadLetter)
    assert given_up.code == "outage-too-long" and given_up.attempts == 1
    assert given_up.reason == (
        "waited 1h for database 'receiver' (retries.max_wait is 1h); last error: cannot connect"
    )


def test_failures_of_one_message_still_count_while_outages_wait() -> None:
    refused = Failed("value too long")
    given_up = fate(DELIVER, refused, policy=WAITING, claimed=message(attempts=2))
    assert isinstance(given_up, DeadLetter) and given_up.code == "delivery-failed"


def test_events_without_subscribers_are_dropped_or_rejected_as_configured() -> None:
    assert fate(NoSubscribers(PUBLISH)) == Count(NO_SUBSCRIBERS)
    rejected = fate(NoSubscribers(PUBLISH), no_subscribers="error")
    assert isinstance(rejected, DeadLetter) and rejected.code == "no-subscribers"
    assert "'Shared.OrderAccepted' has no subscribers" in rejected.reason


def test_an_event_whose_subscribers_cannot_be_read_waits_whole_as_a_retry() -> None:
    stored = fate(SubscribersUnknown(PUBLISH, "table unreadable"), retry_text="whole event")
    assert isinstance(stored, StoreForRetry)
    assert stored.destination == "subscribers of Shared.OrderAccepted"
    assert (stored.destination_database, stored.headers_text) == (None, "whole event")


def test_every_decision_the_classifier_can_make_has_its_fate() -> None:
    """One case per member of UnitDecision: a decision added without a fate, or with the
    wrong kind of fate, fails here."""
    cases: dict[type, tuple[UnitDecision, DeliveryResult | None, type]] = {
        Poison: (Poison("x"), None, DeadLetterAsIs),
        Expired: (Expired(), None, Count),
        Reject: (Reject(HEADERS, "unroutable", "x"), None, DeadLetter),
        Forward: (DELIVER, Delivered(), Count),
        NoSubscribers: (NoSubscribers(PUBLISH), None, Count),
        SubscribersUnknown: (SubscribersUnknown(PUBLISH, "x"), None, StoreForRetry),
    }
    assert set(cases) == set(get_args(UnitDecision))
    for decision, result, kind in cases.values():
        assert type(fate(decision, result)) is kind, decision
