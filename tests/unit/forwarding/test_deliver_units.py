"""Specification of bridge.forwarding.deliver's pure parts: grouping units per database, the
report a batch's deliveries hand back, and isolating a failing message from the rest of its
batch. The writes themselves are tested on real databases
(tests/integration/forwarding/test_batches.py)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from support import wait_until

from bridge.addressing import TableAddress
from bridge.config.model import TransactionMode
from bridge.forwarding.deliver import Delivery, Group, Isolation, deliver_units, delivery_groups
from bridge.forwarding.side_by_side import SideBySide
from bridge.messages import (
    ClaimedMessage,
    Delivered,
    DeliveryResult,
    Duplicate,
    Expired,
    Failed,
    Forward,
    Item,
    Unit,
)
from bridge.routing import Destination


def claimed(number: int) -> ClaimedMessage:
    return ClaimedMessage(uuid.uuid4(), False, None, "{}", b"", number)


def deliver(table: str, database: str = "receiver", mode: TransactionMode = "ledger") -> Forward:
    destination = Destination(database, TableAddress(table), table, mode)
    return Forward({}, destination, "{}", str(uuid.uuid4()))


# The fake deliveries never record on the source side.
NO_SOURCE: Any = None


class FakeDelivery:
    independent = False

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def deliver(self, items: Sequence[Item], transactions: object) -> list[DeliveryResult]:
        self.calls.append([decision.destination.canonical for _, decision in items])
        return [Delivered()] * len(items)


def by_group(
    units: Sequence[Unit], delivery_of: Callable[[str, str], Any]
) -> dict[Group, Delivery]:
    """A delivery for each group of the units, in the order the groups were first seen."""
    return {group: delivery_of(*group) for group in delivery_groups(units)}


def test_units_are_delivered_grouped_per_database_and_the_rest_get_no_result() -> None:
    units = [
        Unit(claimed(1), deliver("a", "receiver"), ""),
        Unit(claimed(2), Expired(), ""),
        Unit(claimed(3), deliver("b", "billing"), ""),
        Unit(claimed(4), deliver("c", "receiver"), ""),
    ]
    deliveries = {"receiver": FakeDelivery(), "billing": FakeDelivery()}
    report = deliver_units(units, by_group(units, lambda db, mode: deliveries[db]), NO_SOURCE)
    assert report.results == [Delivered(), None, Delivered(), Delivered()]
    assert deliveries["receiver"].calls == [["a", "c"]]
    assert deliveries["billing"].calls == [["b"]]


def test_units_for_one_database_are_grouped_per_transaction_mode_too() -> None:
    units = [
        Unit(claimed(1), deliver("a", "receiver", "two-phase"), ""),
        Unit(claimed(2), deliver("b", "receiver", "ledger"), ""),
        Unit(claimed(3), deliver("c", "receiver", "two-phase"), ""),
        Unit(claimed(4), deliver("d", "receiver", "at-least-once"), ""),
    ]
    deliveries: dict[tuple[str, str], FakeDelivery] = {}

    def delivery_for(database: str, mode: str) -> FakeDelivery:
        return deliveries.setdefault((database, mode), FakeDelivery())

    report = deliver_units(units, by_group(units, delivery_for), NO_SOURCE)
    assert report.results == [Delivered()] * 4
    assert {key: d.calls for key, d in deliveries.items()} == {
        ("receiver", "two-phase"): [["a", "c"]],
        ("receiver", "ledger"): [["b"]],
        ("receiver", "at-least-once"): [["d"]],
    }


def items(*tables: str) -> list[Item]:
    return [Item(claimed(n), deliver(table)) for n, table in enumerate(tables)]


def test_the_report_counts_per_database_what_was_delivered_not_duplicates_or_failures() -> None:
    class Mixed(FakeDelivery):
        def deliver(self, items: Sequence[Item], transactions: object) -> list[DeliveryResult]:
            outcomes: list[DeliveryResult] = [Delivered(), Duplicate(), Failed("down")]
            return [outcomes[n % 3] for n in range(len(items))]

    units = [
        Unit(claimed(1), deliver("a", "receiver", "ledger"), ""),
        Unit(claimed(2), deliver("b", "receiver", "ledger"), ""),
        Unit(claimed(3), deliver("c", "receiver", "two-phase"), ""),
        Unit(claimed(4), deliver("d", "billing"), ""),
        Unit(claimed(5), deliver("e", "billing"), ""),
        Unit(claimed(6), deliver("f", "billing"), ""),
        Unit(claimed(7), Expired(), ""),
    ]
    report = deliver_units(units, by_group(units, lambda db, mode: Mixed()), NO_SOURCE)
    # receiver: its ledger group delivered one of two, its two-phase group its only one.
    assert report.delivered == {"receiver": 2, "billing": 1}
    assert report.results[6] is None


def names(items: Sequence[Item] | None) -> list[str]:
    assert items is not None
    return [decision.destination.canonical for _, decision in items]


def test_a_clean_attempt_settles_every_item() -> None:
    isolation = Isolation(items("a", "b"))
    assert names(isolation.pending()) == ["a", "b"]
    assert not isolation.one_by_one
    isolation.succeeded({0: Delivered(), 1: Duplicate()})
    assert isolation.pending() is None
    assert isolation.results() == [Delivered(), Duplicate()]


def test_nothing_to_write_needs_no_attempt() -> None:
    isolation = Isolation([])
    assert isolation.pending() is None
    assert isolation.results() == []


def test_a_failure_that_cannot_be_pinned_on_a_message_switches_to_one_row_at_a_time() -> None:
    isolation = Isolation(items("a", "bad", "c"))
    isolation.not_isolated()
    assert isolation.one_by_one
    assert names(isolation.pending()) == ["a", "bad", "c"]  # all of them again, one by one
    isolation.failed([1], Failed("value too long"))
    assert names(isolation.pending()) == ["a", "c"]
    isolation.succeeded({0: Delivered(), 1: Delivered()})  # offsets among those tried
    assert isolation.pending() is None
    assert isolation.results() == [Delivered(), Failed("value too long"), Delivered()]


def test_single_row_writes_that_cannot_name_the_failing_message_are_a_bug() -> None:
    isolation = Isolation(items("a"))
    isolation.not_isolated()
    with pytest.raises(AssertionError, match="single-row writes always name the failing item"):
        isolation.not_isolated()


def test_an_item_failure_may_settle_several_items_at_once() -> None:
    isolation = Isolation(items("gone", "a", "b", "gone"))
    missing = Failed("missing", missing_queue=True)
    isolation.failed([0, 3], missing)
    assert names(isolation.pending()) == ["a", "b"]
    isolation.failed([1], Failed("value too long"))
    assert names(isolation.pending()) == ["a"]
    isolation.succeeded({0: Delivered()})
    assert isolation.results() == [missing, Delivered(), Failed("value too long"), missing]


def test_when_every_item_failed_no_attempt_is_left() -> None:
    isolation = Isolation(items("gone", "gone"))
    isolation.failed([0, 1], Failed("missing", missing_queue=True))
    assert isolation.pending() is None
    assert isolation.results() == [Failed("missing", missing_queue=True)] * 2


class MeetingDelivery(FakeDelivery):
    """Delivers only once every delivery of the batch meeting at `barrier` is inside its call
    at the same time (a BrokenBarrierError after 5 s otherwise); records its thread."""

    independent = True

    def __init__(self, barrier: threading.Barrier) -> None:
        super().__init__()
        self.barrier = barrier
        self.threads: list[int] = []

    def deliver(self, items: Sequence[Item], transactions: object) -> list[DeliveryResult]:
        self.threads.append(threading.get_ident())
        self.barrier.wait()
        return super().deliver(items, transactions)


def test_independent_deliveries_to_different_databases_run_at_the_same_time() -> None:
    databases = [f"receiver{n}" for n in range(4)]
    barrier = threading.Barrier(len(databases), timeout=5)
    deliveries = {database: MeetingDelivery(barrier) for database in databases}
    units = [Unit(claimed(n), deliver(f"q{n}", databases[n % 4]), "") for n in range(8)]
    side_by_side = SideBySide(3, "test")
    try:
        report = deliver_units(
            units,
            by_group(units, lambda database, mode: deliveries[database]),
            NO_SOURCE,
            side_by_side=side_by_side,
        )
    finally:
        side_by_side.close()
    assert report.results == [Delivered()] * 8
    assert [d.calls for d in deliveries.values()] == [
        [["q0", "q4"]],
        [["q1", "q5"]],
        [["q2", "q6"]],
        [["q3", "q7"]],
    ]
    assert deliveries["receiver0"].threads == [threading.get_ident()]  # the first stays here


def test_deliveries_that_record_in_the_source_run_one_after_the_other_on_the_calling_thread() -> (
    None
):
    order: list[str] = []

    class Recording(FakeDelivery):
        def deliver(self, items: Sequence[Item], transactions: object) -> list[DeliveryResult]:
            assert threading.get_ident() == caller
            order.append(items[0].forward.destination.database)
            return super().deliver(items, transactions)

    caller = threading.get_ident()
    units = [
        Unit(claimed(1), deliver("a", "receiver", "two-phase"), ""),
        Unit(claimed(2), deliver("b", "billing", "at-least-once"), ""),
        Unit(claimed(3), deliver("c", "receiver", "ledger"), ""),  # shares receiver's connection
    ]
    side_by_side = SideBySide(2, "test")
    try:
        report = deliver_units(
            units,
            by_group(units, lambda database, mode: Recording()),
            NO_SOURCE,
            side_by_side=side_by_side,
        )
    finally:
        side_by_side.close()
    assert report.results == [Delivered()] * 3
    assert order == ["receiver", "billing", "receiver"]


def test_a_delivery_that_raises_beside_others_raises_after_they_have_all_returned() -> None:
    finished: list[str] = []
    raised = threading.Event()

    class Slow(FakeDelivery):
        independent = True

        def deliver(self, items: Sequence[Item], transactions: object) -> list[DeliveryResult]:
            assert raised.wait(10)  # still running when the other one raises
            finished.append("slow")
            return super().deliver(items, transactions)

    class Broken(FakeDelivery):
        independent = True

        def deliver(self, items: Sequence[Item], transactions: object) -> list[DeliveryResult]:
            raised.set()
            raise RuntimeError("a bug")

    deliveries = {"broken": Broken(), "slow": Slow()}
    units = [
        Unit(claimed(1), deliver("a", "broken"), ""),
        Unit(claimed(2), deliver("b", "slow"), ""),
    ]
    side_by_side = SideBySide(2, "test")
    try:
        with pytest.raises(RuntimeError, match="a bug"):
            deliver_units(
                units,
                by_group(units, lambda database, mode: deliveries[database]),
                NO_SOURCE,
                side_by_side=side_by_side,
            )
        assert finished == ["slow"]
    finally:
        side_by_side.close()


def test_idle_delivery_threads_end_when_closed() -> None:
    side_by_side = SideBySide(3, "closing")
    names = lambda: {t.name for t in threading.enumerate() if t.name.startswith("closing-")}  # noqa: E731
    assert side_by_side.run([lambda: 1, lambda: 2, lambda: 3]) == [1, 2, 3]
    assert names() == {"closing-1", "closing-2"}
    side_by_side.close()
    wait_until(lambda: not names(), 10, "the delivery threads to end")
