"""A forwarder whose batches keep failing is a state: said when it starts, when its error
changes, once a minute while it lasts, and when it ends - never once per batch."""

from __future__ import annotations

import logging

import pytest

from bridge.daemon import forwarder_health
from bridge.daemon.forwarder_health import ForwarderHealth


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(forwarder_health.time, "monotonic", lambda: now[0])
    return now


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def test_a_run_of_failures_is_logged_once_then_each_minute_then_when_it_ends(
    caplog: pytest.LogCaptureFixture, clock: list[float]
) -> None:
    health = ForwarderHealth()
    caplog.set_level(logging.INFO, logger="bridge.daemon.forwarder_health")
    health.succeeded("orders")
    assert messages(caplog) == []
    for _ in range(100):  # twice a second for 50 s: one line
        health.failed("orders", "database 'sender': no answer within 15 s")
        clock[0] += 0.5
    assert messages(caplog) == [
        "forwarder 'orders' cannot forward: database 'sender': no answer within 15 s; "
        "retrying (its messages stay queued)"
    ]
    clock[0] += 10  # past a minute since the first line: a reminder
    health.failed("orders", "database 'sender': no answer within 15 s")
    assert messages(caplog)[-1] == (
        "forwarder 'orders' still cannot forward after 101 failed batch(es) over 60 s: "
        "database 'sender': no answer within 15 s"
    )
    health.succeeded("orders")
    assert messages(caplog)[-1] == (
        "forwarder 'orders' is forwarding again after 101 failed batch(es) over 60 s"
    )
    assert len(messages(caplog)) == 3


def test_a_new_error_is_said_at_once(caplog: pytest.LogCaptureFixture, clock: list[float]) -> None:
    health = ForwarderHealth()
    caplog.set_level(logging.INFO, logger="bridge.daemon.forwarder_health")
    assert health.failed("orders", "cannot connect")
    assert not health.failed("orders", "cannot connect")
    assert health.failed("orders", "the queue is locked")
    assert len(messages(caplog)) == 2
    assert "the queue is locked" in messages(caplog)[-1]


def test_states_say_who_is_failing_since_when_and_with_what(clock: list[float]) -> None:
    health = ForwarderHealth()
    version = health.version
    health.failed("orders", "locked")
    health.failed("orders", "locked")
    health.succeeded("billing")
    assert health.version > version
    [failing] = health.failing()
    assert (failing.forwarder, failing.failures, failing.last_error) == ("orders", 2, "locked")
    assert [state.forwarder for state in health.states()] == ["billing", "orders"]
    seen = health.version
    health.failed("orders", "locked")  # the same state: nothing new to publish
    assert health.version == seen
    health.succeeded("orders")
    assert health.failing() == []
    assert health.version > seen


def test_errors_that_take_turns_are_said_once_each_until_the_reminder(
    caplog: pytest.LogCaptureFixture, clock: list[float]
) -> None:
    # A silent database: open connections get no answer, new ones cannot connect, in turns.
    health = ForwarderHealth()
    caplog.set_level(logging.INFO, logger="bridge.daemon.forwarder_health")
    for _ in range(40):  # 20 s of batches twice a second, the error flipping each time
        health.failed("orders", "no answer within 5 s")
        clock[0] += 0.25
        health.failed("orders", "cannot connect: connection timeout expired")
        clock[0] += 0.25
    assert len(messages(caplog)) == 2
    assert "still cannot forward" in messages(caplog)[1]
    assert "cannot connect" in messages(caplog)[1]
    clock[0] += 45  # past a minute since the last line: one reminder, whichever error
    health.failed("orders", "no answer within 5 s")
    health.failed("orders", "cannot connect: connection timeout expired")
    assert len(messages(caplog)) == 3
    health.succeeded("orders")
    health.failed("orders", "cannot connect: connection timeout expired")  # a new run
    assert len(messages(caplog)) == 5
    assert "forwarder 'orders' cannot forward" in messages(caplog)[-1]
