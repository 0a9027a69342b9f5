"""Specification of bridge.forwarding.repeats: a failure that repeats is one line per window
with a count and a few ids, and the sum of its repeats when the window ends. Clock injected."""

from __future__ import annotations

import logging

import pytest

from bridge.forwarding.repeats import RepeatedLines

LOG = "bridge.forwarding.settle"
WHOSE = "forwarder 'orders': "
SUBJECT = "moved to the error queue: no route for 'Samples.Unknown'"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def test_the_first_batch_is_told_with_its_count_and_a_few_ids(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    repeats = RepeatedLines(Clock())
    ids = [f"id-{n}" for n in range(1000)]
    repeats.tell(LOG, logging.WARNING, ("orders", SUBJECT), WHOSE, SUBJECT, 1000, ids, 60)
    assert lines(caplog) == [
        f"{WHOSE}1,000 message(s) {SUBJECT} (MessageIds: id-0, id-1, id-2, ...)"
    ]
    assert caplog.records[0].levelno == logging.WARNING


def test_repeats_within_the_window_are_summed_into_one_line_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    clock = Clock()
    repeats = RepeatedLines(clock)
    key = ("orders", SUBJECT)
    repeats.tell(LOG, logging.WARNING, key, WHOSE, SUBJECT, 2, ["a", "b"], 60)
    for batch in range(1, 11):
        clock.now += 5
        repeats.tell(
            LOG, logging.WARNING, key, WHOSE, SUBJECT, 199, [f"x{batch}", "y", "z", "w"], 60
        )
        repeats.flush()
    assert lines(caplog) == [f"{WHOSE}2 message(s) {SUBJECT} (MessageIds: a, b)"]
    clock.now += 10  # 60 s since the first line
    repeats.flush()
    repeats.flush()  # told once
    assert lines(caplog)[1:] == [
        f"{WHOSE}... and 1,990 more in the last minute {SUBJECT} (MessageIds: x10, y, z, ...)"
    ]
    # After the window a new one begins with a line in full.
    repeats.tell(LOG, logging.WARNING, key, WHOSE, SUBJECT, 1, ["c"], 60)
    assert lines(caplog)[2:] == [f"{WHOSE}1 message(s) {SUBJECT} (MessageIds: c)"]


def test_a_window_without_repeats_ends_silently_and_other_reasons_are_told_apart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    clock = Clock()
    repeats = RepeatedLines(clock)
    repeats.tell(LOG, logging.WARNING, ("orders", "a"), "", "reason a", 1, ["m1"], 2)
    repeats.tell(LOG, logging.ERROR, ("orders", "b"), "", "reason b", 1, ["m2"], 2)
    clock.now += 2
    repeats.flush()
    assert lines(caplog) == [
        "1 message(s) reason a (MessageIds: m1)",
        "1 message(s) reason b (MessageIds: m2)",
    ]
    # The next window's repeat is told with the window's length as configured.
    repeats.tell(LOG, logging.ERROR, ("orders", "b"), "", "reason b", 1, ["m3"], 2)
    repeats.tell(LOG, logging.ERROR, ("orders", "b"), "", "reason b", 4, ["m4"], 2)
    clock.now += 2
    repeats.tell(LOG, logging.ERROR, ("orders", "c"), "", "reason c", 1, ["m5"], 2)
    assert lines(caplog)[2:] == [
        "1 message(s) reason b (MessageIds: m3)",
        "... and 4 more in the last 2s reason b (MessageIds: m4, ...)",
        "1 message(s) reason c (MessageIds: m5)",
    ]


def test_a_worker_process_passes_every_tell_on() -> None:
    told: list[tuple[object, ...]] = []
    repeats = RepeatedLines(Clock(), relay=lambda *args: told.append(args))
    repeats.tell(LOG, logging.ERROR, ["orders", "x"], WHOSE, "x", 5, ["a", "b", "c", "d"], 60)
    assert told == [(LOG, logging.ERROR, ("orders", "x"), WHOSE, "x", 5, ["a", "b", "c"], 60, {})]
