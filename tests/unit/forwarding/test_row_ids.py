"""Row ids the bridge writes into destination queues: time-ordered UUIDs (version 7), so that
a destination's primary key grows at its right edge (`bridge.forwarding.writes.new_ids`)."""

from __future__ import annotations

import time
import uuid

from bridge.dialects import dialect_for
from bridge.forwarding.writes import new_ids

POSTGRESQL = dialect_for("postgresql")


def _ms_now() -> int:
    return time.time_ns() // 1_000_000


def test_ids_are_version_7_with_the_rfc_variant_and_the_time_of_writing() -> None:
    before = _ms_now()
    ids = new_ids(POSTGRESQL, 1000)
    after = _ms_now()
    assert {value.version for value in ids} == {7}
    assert {value.variant for value in ids} == {uuid.RFC_4122}
    # What any reader of the string form sees, not only this process's objects.
    assert {uuid.UUID(str(value)).version for value in ids} == {7}
    assert all(before <= value.int >> 80 <= after for value in ids)


def test_ids_of_one_call_are_consecutive() -> None:
    ids = new_ids(POSTGRESQL, 5000)
    assert [value.int - ids[0].int for value in ids] == list(range(5000))


def test_ids_of_later_milliseconds_sort_after_earlier_ones() -> None:
    first = new_ids(POSTGRESQL, 100)
    deadline = time.monotonic() + 5
    started = first[0].int >> 80
    while _ms_now() <= started:
        assert time.monotonic() < deadline, "the clock did not move"
        time.sleep(0.0005)
    second = new_ids(POSTGRESQL, 100)
    assert max(first) < min(second)


def test_many_calls_in_the_same_milliseconds_never_share_an_id() -> None:
    ids = [value for _ in range(2000) for value in new_ids(POSTGRESQL, 50)]
    assert len(set(ids)) == len(ids) == 100_000


def test_every_dialect_takes_them() -> None:
    for name in ("postgresql", "sqlite", "sqlserver"):
        dialect = dialect_for(name)
        (encoded,) = new_ids(dialect, 1)
        assert uuid.UUID(str(encoded)).version == 7
