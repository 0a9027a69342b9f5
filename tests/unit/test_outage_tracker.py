"""OutageTracker: an outage is a state of a database, probed once per interval, not per message."""

from __future__ import annotations

import threading
from datetime import datetime

import pytest

from bridge import outages
from bridge.outages import OutageTracker


class Clock:
    """A monotonic clock the test moves on by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_database_never_seen_in_trouble_is_tried():
    tracker = OutageTracker(probe_interval=60)
    assert tracker.trouble("receiver") is None
    assert tracker.waiting_databases() == []


def test_trouble_stands_until_the_database_is_seen_up():
    tracker = OutageTracker(probe_interval=60)
    tracker.record_trouble("receiver", "unreachable", "cannot connect")
    state = tracker.trouble("receiver")
    assert state is not None
    assert (state.state, state.last_error) == ("unreachable", "cannot connect")
    assert state.next_probe_at is not None and state.next_probe_at > state.since
    assert tracker.waiting_databases() == ["receiver"]
    tracker.record_up("receiver")
    assert tracker.trouble("receiver") is None
    assert tracker.waiting_databases() == []
    assert [s.state for s in tracker.states()] == ["up"]


def test_the_outage_keeps_its_start_while_it_lasts_and_a_new_kind_starts_anew(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The wall clock `since` is read from moves on by a minute at every reading.
    readings = (datetime(2026, 11, 25, 12, minute) for minute in range(60))
    monkeypatch.setattr(outages, "utcnow", lambda: next(readings))
    tracker = OutageTracker(probe_interval=60)
    tracker.record_trouble("receiver", "unreachable", "cannot connect")
    first = tracker.states()[0]
    tracker.record_trouble("receiver", "unreachable", "connection refused")
    again = tracker.states()[0]
    assert again.since == first.since
    assert again.last_error == "connection refused"
    tracker.record_trouble("receiver", "not-ready", "ledger missing, may not create")
    assert tracker.states()[0].since > first.since
    assert tracker.states()[0].state == "not-ready"


def test_without_an_external_prober_exactly_one_caller_probes_after_the_interval():
    clock = Clock()
    tracker = OutageTracker(probe_interval=10, clock=clock)
    tracker.record_trouble("receiver", "unreachable", "down")
    assert tracker.trouble("receiver") is not None
    clock.now += 9.9
    assert tracker.waiting_databases() == ["receiver"]
    clock.now += 0.1
    # The database stops being held back for retries only once the probe is due...
    assert tracker.waiting_databases() == []
    results = []
    barrier = threading.Barrier(8)

    def ask():
        barrier.wait()
        results.append(tracker.trouble("receiver"))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # ...and then only one caller gets to try; the others keep failing fast.
    assert sum(result is None for result in results) == 1
    assert tracker.waiting_databases() == ["receiver"]


def test_with_an_external_prober_workers_never_probe_and_the_prober_gets_each_due_database_once():
    clock = Clock()
    tracker = OutageTracker(probe_interval=10, external_probe=True, clock=clock)
    tracker.record_trouble("receiver", "unreachable", "down")
    tracker.record_trouble("billing", "not-ready", "ledger missing")
    assert tracker.due_for_probe() == []
    clock.now += 9.9
    assert tracker.due_for_probe() == []
    clock.now += 0.1
    assert tracker.trouble("receiver") is not None  # workers still fail fast
    assert tracker.waiting_databases() == ["billing", "receiver"]
    assert sorted(tracker.due_for_probe()) == ["billing", "receiver"]
    assert tracker.due_for_probe() == []  # scheduled again at once


def test_every_change_of_state_moves_the_version_on():
    tracker = OutageTracker(probe_interval=60)
    versions = [tracker.version]
    tracker.record_trouble("receiver", "unreachable", "down")
    versions.append(tracker.version)
    tracker.record_up("receiver")
    versions.append(tracker.version)
    tracker.record_up("receiver")  # no change
    versions.append(tracker.version)
    assert versions[0] < versions[1] < versions[2] == versions[3]


def test_the_outage_is_logged_when_it_starts_and_when_it_ends_not_per_failure(caplog):
    tracker = OutageTracker(probe_interval=60)
    with caplog.at_level("INFO", logger="bridge.outages"):
        for _ in range(50):
            tracker.record_trouble("receiver", "unreachable", "cannot connect")
        tracker.record_up("receiver")
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2
    assert "database 'receiver' cannot be reached: cannot connect" in lines[0]
    assert "usable again" in lines[1]
