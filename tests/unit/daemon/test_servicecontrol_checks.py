"""What each custom check reports (bridge/daemon/servicecontrol/checks.py)."""

from __future__ import annotations

from datetime import datetime

from bridge.daemon.forwarder_health import ForwarderState
from bridge.daemon.servicecontrol.checks import (
    DestinationTrouble,
    destination_result,
    error_queue_result,
    forwarder_result,
)
from bridge.storage.pauses import Pause, PauseState

SINCE = datetime(2026, 5, 1, 12, 0, 0)


def test_a_reachable_destination_passes() -> None:
    result = destination_result("Billing", None)
    assert (result.check_id, result.category, result.failure_reason) == (
        "sfbridge destination Billing",
        "sfbridge",
        None,
    )


def test_an_unreachable_destination_fails_with_the_error_without_the_database_prefix() -> None:
    trouble = DestinationTrouble("unreachable", "database 'Billing': connection refused")
    result = destination_result("Billing", trouble)
    assert result.has_failed
    assert result.failure_reason == (
        "database 'Billing' cannot be reached: connection refused; messages for it wait in "
        "retry storage"
    )


def test_a_read_only_destination_says_so() -> None:
    trouble = DestinationTrouble("read-only", "does not accept writes: standby")
    reason = destination_result("Billing", trouble).failure_reason
    assert reason is not None and "does not accept writes (read-only" in reason


def test_a_refused_login_names_the_user_and_what_to_do() -> None:
    trouble = DestinationTrouble("auth-failed", "password authentication failed", "bridge")
    reason = destination_result("Billing", trouble).failure_reason
    assert reason is not None
    assert "refuses the bridge's login (user 'bridge')" in reason
    assert "reload the daemon" in reason


def test_a_failure_reason_never_carries_a_password() -> None:
    trouble = DestinationTrouble("unreachable", "bad string Server=h;Uid=u;Pwd=hunter2-Secret;")
    reason = destination_result("Billing", trouble).failure_reason
    assert reason is not None and "hunter2" not in reason


def test_a_forwarder_that_forwards_and_is_not_paused_passes() -> None:
    healthy = ForwarderState("sender", False, SINCE)
    result = forwarder_result("sender", PauseState(), healthy)
    assert (result.check_id, result.failure_reason) == ("sfbridge forwarder sender", None)
    assert not forwarder_result("sender", None, None).has_failed


def test_a_paused_forwarder_fails_with_its_reason_and_how_to_resume() -> None:
    pauses = PauseState((Pause(None, SINCE, "maintenance"),))
    reason = forwarder_result("sender", pauses, None).failure_reason
    assert reason == (
        "forwarder 'sender' is paused since 2026-05-01 12:00:00 UTC: maintenance "
        "(`sfbridge resume sender` resumes it)"
    )


def test_deliveries_paused_for_one_database_fail_the_forwarder_check() -> None:
    pauses = PauseState((Pause("Billing", SINCE, None),))
    reason = forwarder_result("sender", pauses, None).failure_reason
    assert reason == (
        "forwarder 'sender''s deliveries to database 'Billing' are paused since "
        "2026-05-01 12:00:00 UTC"
    )


def test_a_failing_forwarder_fails_with_its_error_and_since_when() -> None:
    failing = ForwarderState("sender", True, SINCE, 7, "its queue is missing")
    reason = forwarder_result("sender", PauseState(), failing).failure_reason
    assert reason == (
        "forwarder 'sender' cannot forward since 2026-05-01 12:00:00 UTC (7 failed batch(es)): "
        "its queue is missing; its messages stay queued"
    )


def test_paused_and_failing_are_both_told() -> None:
    pauses = PauseState((Pause(None, SINCE, None),))
    failing = ForwarderState("sender", True, SINCE, 1, "boom")
    reason = forwarder_result("sender", pauses, failing).failure_reason
    assert reason is not None and "paused since" in reason and "cannot forward" in reason


def test_the_error_queue_check_passes_at_first_look_and_while_it_does_not_grow() -> None:
    assert not error_queue_result("sender", "error", None, 5, 30.0).has_failed
    assert not error_queue_result("sender", "error", 5, 5, 30.0).has_failed
    assert not error_queue_result("sender", "error", 5, 2, 30.0).has_failed


def test_the_error_queue_check_fails_when_it_grew_since_the_check_before() -> None:
    result = error_queue_result("sender", '"public"."error"', 5, 8, 30.0)
    assert result.check_id == "sfbridge error queue sender"
    assert result.failure_reason == (
        "forwarder 'sender' moved 3 message(s) to error queue '\"public\".\"error\"' in the last "
        "30s (8 of its messages are there); `sfbridge errors summary --forwarder sender` says why"
    )
