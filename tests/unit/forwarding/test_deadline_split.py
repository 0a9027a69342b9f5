"""Specification of bridge.forwarding.isolation's deadline split: a batch that misses the
statement deadline is written again in halves down to one message, a message that misses it
alone fails alone, and what a split taught holds for the next batches for a while. The
deliveries that run these rounds are tested against a real daemon
(tests/integration/forwarding/test_deadlines.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from bridge.addressing import TableAddress
from bridge.forwarding.isolation import (
    CHUNK_LIMIT_HOLD_SECONDS,
    ChunkLimit,
    DeadlineSplit,
    describe_size,
    too_large_for_deadline,
)
from bridge.messages import ClaimedMessage, Delivered, DeliveryResult, Failed, Forward, Item
from bridge.routing import Destination

TOO_LARGE = Failed("too large for the deadline")


def run_rounds(
    split: DeadlineSplit, meets: Callable[[range], bool], log: list[range] | None = None
) -> list[DeliveryResult]:
    """Run the rounds as a delivery does: a chunk is written when `meets` says it meets the
    deadline, else it is halved; a lone message that misses it fails alone."""
    while (chunk := split.current()) is not None:
        if log is not None:
            log.append(chunk)
        if meets(chunk):
            split.settled([Delivered()] * len(chunk))
        elif not split.missed():
            split.settled([TOO_LARGE])
    return split.results()


def test_a_batch_that_meets_the_deadline_is_written_in_one_transaction() -> None:
    tried: list[range] = []
    results = run_rounds(DeadlineSplit(30), lambda chunk: True, tried)
    assert tried == [range(0, 30)]
    assert results == [Delivered()] * 30


def test_a_batch_that_misses_the_deadline_is_written_in_halves_until_they_meet_it() -> None:
    tried: list[range] = []
    split = DeadlineSplit(30)
    results = run_rounds(split, lambda chunk: len(chunk) <= 8, tried)
    # Once 8 met the deadline, the 15 still to write go in chunks of 8 without missing it first.
    assert tried == [range(0, 30), range(0, 15), range(0, 8), range(8, 15), range(15, 23),
                     range(23, 30)]  # fmt: skip
    assert results == [Delivered()] * 30
    assert split.misses == 2 and split.largest_met == 8


def test_only_the_message_that_misses_the_deadline_alone_fails() -> None:
    split = DeadlineSplit(5)
    results = run_rounds(split, lambda chunk: 3 not in chunk)
    assert results == [Delivered()] * 3 + [TOO_LARGE] + [Delivered()]


def test_a_lone_message_that_misses_the_deadline_is_left_to_the_caller() -> None:
    split = DeadlineSplit(1)
    assert split.current() == range(0, 1)
    assert split.missed() is False
    assert split.current() == range(0, 1)  # still there: the caller settles it
    split.settled([TOO_LARGE])
    assert split.results() == [TOO_LARGE]
    assert split.largest_met == 0


@pytest.mark.parametrize("count", [1, 2, 3, 7, 64, 1000])
def test_the_rounds_end_even_when_every_message_misses_the_deadline(count: int) -> None:
    tried: list[range] = []
    results = run_rounds(DeadlineSplit(count), lambda chunk: False, tried)
    assert results == [TOO_LARGE] * count
    assert len(tried) == 2 * count - 1


def test_a_database_gone_down_meanwhile_fails_the_rest_and_keeps_what_was_written() -> None:
    split = DeadlineSplit(4)
    assert split.missed()
    split.settled([Delivered(), Delivered()])
    down = Failed("gone", outage=True)
    split.give_up(down)
    assert split.current() is None
    assert split.results() == [Delivered(), Delivered(), down, down]


def test_a_limit_writes_the_batch_in_chunks_of_that_size() -> None:
    tried: list[range] = []
    run_rounds(DeadlineSplit(10, limit=4), lambda chunk: True, tried)
    assert tried == [range(0, 4), range(4, 8), range(8, 10)]


def test_nothing_to_write_needs_no_round() -> None:
    split = DeadlineSplit(0)
    assert split.current() is None
    assert split.results() == []


def test_the_chunk_size_a_split_taught_holds_then_doubles_until_it_limits_nothing() -> None:
    limit = ChunkLimit()
    assert limit.current(0.0) is None
    split = DeadlineSplit(30)
    run_rounds(split, lambda chunk: len(chunk) <= 8)
    limit.learn(split, 100.0)
    assert limit.current(100.0) == 8
    assert limit.current(100.0 + CHUNK_LIMIT_HOLD_SECONDS - 1) == 8
    assert limit.current(100.0 + CHUNK_LIMIT_HOLD_SECONDS) == 16
    now = 100.0 + CHUNK_LIMIT_HOLD_SECONDS
    while limit.current(now) is not None:
        now += CHUNK_LIMIT_HOLD_SECONDS
    assert now < 100.0 + 12 * CHUNK_LIMIT_HOLD_SECONDS  # 8 -> 16 -> ... -> no limit


def test_a_batch_that_met_the_deadline_at_once_teaches_nothing() -> None:
    limit = ChunkLimit()
    split = DeadlineSplit(30)
    run_rounds(split, lambda chunk: True)
    limit.learn(split, 0.0)
    assert limit.current(0.0) is None


def test_a_message_too_large_alone_teaches_nothing_about_the_others() -> None:
    limit = ChunkLimit()
    split = DeadlineSplit(1)
    run_rounds(split, lambda chunk: False)
    limit.learn(split, 0.0)
    assert limit.current(0.0) is None


def test_the_reason_names_the_size_the_table_the_database_and_the_timeout() -> None:
    message = ClaimedMessage(uuid.uuid4(), False, None, "{}", b"x" * (20 * 1024 * 1024), 1)
    destination = Destination("receiver", TableAddress("Receiver"), "Receiver", "ledger")
    item = Item(message, Forward({}, destination, '{"a": 1}', str(uuid.uuid4())))
    reason = too_large_for_deadline(
        item, '"public"."Receiver"', "receiver", 1.5, "canceling statement (SQLSTATE 57014)"
    )
    assert reason.startswith("message of 20.0 MiB is larger than query_timeout allows")
    assert '"public"."Receiver"' in reason
    assert "1.5 s query_timeout of database 'receiver'" in reason
    assert "SQLSTATE 57014" in reason and "raise that query_timeout" in reason


@pytest.mark.parametrize(
    ("size", "text"),
    [(0, "0 bytes"), (1023, "1023 bytes"), (1536, "1.5 KiB"), (3 * 1024 * 1024, "3.0 MiB")],
)
def test_sizes_read_as_a_person_reads_them(size: int, text: str) -> None:
    assert describe_size(size) == text
