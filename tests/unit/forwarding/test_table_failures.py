"""Specification of busy tables (bridge.forwarding.table_failures): a destination table, or the
dedup ledger, found locked past the query timeout is not tried again while it counts as busy."""

from __future__ import annotations

import uuid

from bridge.addressing import TableAddress
from bridge.dialects import dialect_for
from bridge.forwarding.table_failures import busy_tables, with_busy_items
from bridge.messages import ClaimedMessage, Delivered, DeliveryResult, Failed, Forward, Item
from bridge.outages import OutageTracker
from bridge.routing import Destination

DIALECT = dialect_for("postgresql")
LEDGER = TableAddress("sfbridge_ledger", "public")


def item(table: str) -> Item:
    address = TableAddress(table, "public")
    destination = Destination("receiver", address, DIALECT.grammar.render(address))
    message = ClaimedMessage(uuid.uuid4(), False, None, "{}", b"", 1)
    return Item(message, Forward({}, destination, "{}", str(message.row_id)))


def tracker(*busy: TableAddress) -> OutageTracker:
    outages = OutageTracker(60.0, quiet=True)
    for table in busy:
        outages.record_busy("receiver", DIALECT.grammar.render(table), "ALTER TABLE holds it")
    return outages


def test_only_the_items_bound_for_a_busy_table_fail_at_once() -> None:
    items = [item("A"), item("B"), item("A")]
    busy = busy_tables(tracker(TableAddress("A", "public")), "receiver", DIALECT, items, LEDGER)
    assert sorted(busy) == [0, 2]
    assert busy[0].outage
    assert 'destination queue "public"."A" in database \'receiver\' is locked' in busy[0].error


def test_a_busy_ledger_fails_every_item_written_with_it() -> None:
    items = [item("A"), item("B")]
    busy = busy_tables(tracker(LEDGER), "receiver", DIALECT, items, LEDGER)
    assert busy == dict.fromkeys(
        [0, 1],
        Failed("the dedup ledger is locked by another session: ALTER TABLE holds it", outage=True),
    )
    # Delivered without the ledger (two-phase, at-least-once), the items do not wait for it.
    assert busy_tables(tracker(LEDGER), "receiver", DIALECT, items) == {}


def test_the_results_keep_the_items_order_and_a_table_written_to_is_free_again() -> None:
    outages = tracker(TableAddress("A", "public"), TableAddress("B", "public"))
    items = [item("A"), item("C"), item("B")]
    busy = busy_tables(outages, "receiver", DIALECT, items)
    del busy[2]  # say B was tried after all
    results = with_busy_items(outages, "receiver", DIALECT, items, busy, [Delivered(), Delivered()])
    assert results == [busy[0], Delivered(), Delivered()]
    assert outages.busy("receiver", '"public"."B"') is None
    assert outages.busy("receiver", '"public"."A"') == "ALTER TABLE holds it"


def test_nothing_suspect_hands_the_results_back_as_they_are() -> None:
    results: list[DeliveryResult] = [Delivered()]
    assert with_busy_items(tracker(), "receiver", DIALECT, [item("A")], None, results) is results
