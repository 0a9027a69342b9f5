"""Specification of QueueDepths.held_by: which retries wait for a pause rather than a failure
(`sfbridge_retries_paused`, which keeps a planned pause from raising
SfbridgeRetriesWaitingLong)."""

from __future__ import annotations

from datetime import datetime

from bridge.storage.pauses import Pause, PauseState
from bridge.storage.queue_depths import QueueDepths

AT = datetime(2026, 11, 27, 12, 0)
# retry_summary rows: destination, messages, failing since, next attempt, attempts, last
# error, destination database
DEPTHS = QueueDepths(
    queued=0,
    oldest_age_seconds=None,
    retry_summary=(
        ('"public"."Billing"', 4, AT, AT, 0, "database 'billing' is paused", "billing"),
        ('"public"."Receiver"', 7, AT, AT, 3, "connection refused", "receiver"),
        ("subscribers of Shared.OrderAccepted", 2, AT, AT, 1, "no table", None),
    ),
)


def test_nothing_is_held_without_a_pause() -> None:
    assert DEPTHS.waiting_for_retry == 13
    assert DEPTHS.held_by(PauseState()) == 0


def test_a_paused_destination_holds_only_its_own_retries() -> None:
    pauses = PauseState((Pause("billing", AT, "upgrade"),))
    assert DEPTHS.held_by(pauses) == 4


def test_a_paused_forwarder_holds_all_of_them() -> None:
    pauses = PauseState((Pause(None, AT, None), Pause("billing", AT, None)))
    assert DEPTHS.held_by(pauses) == 13
