"""`sfbridge where MESSAGE_ID` against real PostgreSQL and SQLite forwarding databases: a
message still queued, waiting in retry storage, delivered (the dedup ledger), failed into the
error queue and archived, and each subscriber's copy of a published event."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import PostgresEndpoint, nsb_message_headers, pg_rows
from support.error_world import FORWARD, RECEIVER, World, park_in_retry, unroutable_in_error_queue

pytestmark = pytest.mark.integration


@pytest.fixture(params=["postgresql", "sqlite"])
def world(request: pytest.FixtureRequest, tmp_path: Path, new_pg_database: Any) -> World:
    return World(tmp_path, request.param, new_pg_database)


def where(world: World, *args: str) -> list[dict[str, Any]]:
    result = world.cli("where", *args, "--json")
    assert result.returncode in (0, 1), result.stderr
    places: list[dict[str, Any]] = json.loads(result.stdout)
    return places


def test_where_says_where_a_message_is_in_each_place_it_can_be(world: World) -> None:
    # In the error queue (unroutable), then archived.
    failed = unroutable_in_error_queue(world, 2)
    (failed_row, failed_id), (archived_row, archived_id) = sorted(failed.items())
    [place] = where(world, failed_id)
    assert place["place"] == "failed" and place["reason"] == "unroutable"
    assert place["id"] == failed_row and place["time_of_failure"]
    assert place["destination"] == world.sender.address(RECEIVER)
    assert world.cli("errors", "archive", "--id", archived_id, "--yes").returncode == 0
    [place] = where(world, archived_row)
    assert place["place"] == "archived" and place["message_id"] == archived_id
    text = world.cli("where", archived_id)
    assert text.returncode == 0
    assert "archived   in " in text.stdout and "errors restore --id" in text.stdout

    # Waiting in retry storage: attempts, next attempt, last error.
    [waiting] = park_in_retry(world, 1)
    [place] = where(world, waiting)
    assert place["place"] == "retrying" and place["attempts"] == 3
    assert place["last_error"] == "receiver is down" and place["next_attempt_at"]

    # Still queued: by its row Id at once; by its MessageId when the queue is scanned.
    world.add_route()
    headers = nsb_message_headers(world.sender.address(RECEIVER))
    [queued_row] = world.sender.send(FORWARD, [(headers, b"{}", None)])
    message_id = str(headers["NServiceBus.MessageId"])
    [place] = where(world, str(queued_row))
    assert place["place"] == "queued" and place["forwarder"] == "orders"
    nowhere = world.cli("where", message_id)
    assert nowhere.returncode == 1
    assert "found nowhere" in nowhere.stdout and "--scan" in nowhere.stdout
    [place] = where(world, message_id, "--scan")
    assert place["place"] == "queued" and place["id"] == str(queued_row)

    # Delivered: the receiver's ledger, found by the MessageId and by the row Id.
    assert world.forward_all() == Counter({"delivered": 1})
    [place] = where(world, message_id)
    assert place["place"] == "delivered" and place["database"] == "receiver"
    assert place["destination"] == world.sender.address(RECEIVER) and place["forwarded_at"]


def test_where_shows_each_subscribers_copy_of_an_event(world: World) -> None:
    subscribers = [
        world.sender.address("Samples.Receiver.A"),
        world.sender.address("Samples.Receiver.B"),
    ]
    world.config["subscriptions"] = {"Shared.OrderSubmitted": subscribers}
    world.add_route()
    world.receiver.create_queue("Samples.Receiver.A")
    headers = nsb_message_headers(
        None, **{"$.store-and-forward.eventtype": "Shared.OrderSubmitted"}
    )
    world.sender.send(FORWARD, [(headers, b"{}", None)])
    # Subscriber B's queue is missing: its copy waits in retry storage.
    assert world.forward_all() == Counter({"delivered": 1, "retries-scheduled": 1})
    places = where(world, str(headers["NServiceBus.MessageId"]))
    assert sorted((p["place"], p["destination"]) for p in places) == [
        ("delivered", subscribers[0]),
        ("retrying", subscribers[1]),
    ]


def test_install_adds_the_lookup_indexes_to_retry_storage_made_before_them(
    tmp_path: Path, new_pg_database: Any
) -> None:
    world = World(tmp_path, "postgresql", new_pg_database)
    assert isinstance(world.sender, PostgresEndpoint)
    connection = world.sender.connection_string

    def indexes() -> set[str]:
        rows = pg_rows(
            connection, "SELECT indexname FROM pg_indexes WHERE tablename = 'sfbridge_retry'"
        )
        return {str(row[0]) for row in rows}

    assert {"sfbridge_retry_by_id", "sfbridge_retry_by_message_id"} <= indexes()
    pg_rows(connection, "DROP INDEX sfbridge_retry_by_id; DROP INDEX sfbridge_retry_by_message_id")
    assert not {"sfbridge_retry_by_id", "sfbridge_retry_by_message_id"} & indexes()
    assert world.cli("install").returncode == 0
    assert {"sfbridge_retry_by_id", "sfbridge_retry_by_message_id"} <= indexes()
    [waiting] = park_in_retry(world, 1)
    [place] = where(world, waiting)
    assert place["place"] == "retrying"
