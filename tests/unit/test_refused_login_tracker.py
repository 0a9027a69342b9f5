"""A refused login is a state of its own in the OutageTracker: tried again after the probe
interval, then twice as long each time up to AUTH_RETRY_MAX_SECONDS, so that after the first
minutes a daemon logs in a handful of times an hour; said once when it starts and once when it
ends, with the login and never the password. The clock is injected: no test sleeps."""

from __future__ import annotations

import logging
from itertools import pairwise

import pytest

from bridge.outages import AUTH_RETRY_MAX_SECONDS, OutageTracker, auth_retry_delay

INTERVAL = 5.0
REFUSED = "database 'receiver': cannot connect: FATAL:  password authentication failed"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_wait_doubles_from_the_probe_interval_up_to_ten_minutes() -> None:
    waits = [auth_retry_delay(INTERVAL, refusals) for refusals in range(1, 11)]
    assert waits == [5, 10, 20, 40, 80, 160, 320, 600, 600, 600]
    assert AUTH_RETRY_MAX_SECONDS == 600
    # A probe interval longer than the cap is kept: never tried more often than outages are.
    assert auth_retry_delay(900, 3) == 900


def _attempts_of_the_daemons_prober(tracker: OutageTracker, clock: Clock, hours: float) -> list:
    """Run the daemon's prober (one look a second) for `hours`, every login refused; the times
    (seconds from the start) at which it logged in."""
    start = clock.now
    attempts = []
    while clock.now - start < hours * 3600:
        for database in tracker.due_for_probe():
            attempts.append(clock.now - start)
            tracker.record_trouble(database, "auth-failed", REFUSED, "bridge")
        clock.now += 1.0
    return attempts


def test_the_prober_logs_in_a_handful_of_times_an_hour_after_the_first_minutes() -> None:
    clock = Clock()
    tracker = OutageTracker(INTERVAL, external_probe=True, clock=clock)
    tracker.record_trouble("receiver", "auth-failed", REFUSED, "bridge")
    attempts = _attempts_of_the_daemons_prober(tracker, clock, hours=3)
    assert attempts[:4] == [5, 15, 35, 75]
    after_the_first_quarter = [t for t in attempts if t >= 15 * 60]
    per_hour = len([t for t in after_the_first_quarter if 3600 <= t < 7200])
    assert per_hour <= 6
    assert all(b - a >= AUTH_RETRY_MAX_SECONDS for a, b in pairwise(attempts[7:]))


def test_an_outage_is_still_probed_every_interval() -> None:
    clock = Clock()
    tracker = OutageTracker(INTERVAL, external_probe=True, clock=clock)
    tracker.record_trouble("receiver", "unreachable", "connection refused")
    attempts = []
    for second in range(60):
        for database in tracker.due_for_probe():
            attempts.append(second)
            tracker.record_trouble(database, "unreachable", "connection refused")
        clock.now += 1.0
    assert attempts == list(range(5, 60, 5))


def test_a_refusal_told_again_by_other_workers_does_not_push_the_next_attempt_away() -> None:
    clock = Clock()
    tracker = OutageTracker(INTERVAL, external_probe=True, clock=clock)
    tracker.record_trouble("receiver", "auth-failed", REFUSED, "bridge")
    # Every worker that raced into the refusal, and each worker process, says it too.
    for _ in range(20):
        tracker.record_trouble("receiver", "auth-failed", REFUSED, "bridge", relayed=True)
    clock.now += INTERVAL
    assert tracker.due_for_probe() == ["receiver"]


def test_while_refused_the_daemons_connections_do_not_log_in_and_messages_wait() -> None:
    clock = Clock()
    tracker = OutageTracker(INTERVAL, external_probe=True, clock=clock)
    tracker.record_trouble("receiver", "auth-failed", REFUSED, "bridge")
    state = tracker.refused_login("receiver")
    assert state is not None and (state.state, state.login) == ("auth-failed", "bridge")
    assert tracker.trouble("receiver") is not None
    assert tracker.waiting_databases() == ["receiver"]
    clock.now += 3600  # however long: only the prober's `due_for_probe` tries
    assert tracker.refused_login("receiver") is not None
    tracker.record_up("receiver")
    assert tracker.refused_login("receiver") is None
    assert tracker.trouble("receiver") is None


def test_standalone_the_one_caller_let_through_tries_and_the_wait_grows() -> None:
    clock = Clock()
    tracker = OutageTracker(INTERVAL, clock=clock)
    tracker.record_trouble("receiver", "auth-failed", REFUSED, "bridge")
    assert tracker.refused_login("receiver") is None  # no prober: `trouble` decides
    clock.now += INTERVAL
    assert tracker.trouble("receiver") is None  # this caller tries
    assert tracker.trouble("receiver") is not None  # the others do not
    tracker.record_trouble("receiver", "auth-failed", REFUSED, "bridge")
    clock.now += 2 * INTERVAL - 1
    assert tracker.trouble("receiver") is not None
    clock.now += 1
    assert tracker.trouble("receiver") is None


def test_a_refused_login_that_turns_into_an_outage_is_probed_as_one() -> None:
    clock = Clock()
    tracker = OutageTracker(INTERVAL, external_probe=True, clock=clock)
    tracker.record_trouble("receiver", "auth-failed", REFUSED, "bridge")
    for _ in range(5):
        clock.now += 1000
        tracker.due_for_probe()
        tracker.record_trouble("receiver", "auth-failed", REFUSED, "bridge")
    tracker.record_trouble("receiver", "unreachable", "connection refused")
    assert tracker.refused_login("receiver") is None
    clock.now += INTERVAL
    assert tracker.due_for_probe() == ["receiver"]


def test_one_line_when_it_starts_and_one_when_it_ends_naming_the_login_not_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    tracker = OutageTracker(INTERVAL, external_probe=True, clock=clock)
    secret = "Tr0ub4dor"
    error = f"{REFUSED} (connection string Uid=bridge;Pwd={secret};)"
    with caplog.at_level(logging.INFO, logger="bridge.outages"):
        tracker.record_trouble("receiver", "auth-failed", error, "bridge")
        for _ in range(10):
            clock.now += 1000
            for database in tracker.due_for_probe():
                tracker.record_trouble(database, "auth-failed", error, "bridge")
        tracker.record_up("receiver")
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    assert "refused the login 'bridge'" in lines[0] and "'receiver'" in lines[0]
    assert "reload" in lines[0]
    assert "login 'bridge' is accepted again" in lines[1]
    assert not any(secret in line for line in lines)
