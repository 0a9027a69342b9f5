"""Copies of one published event that go to the error queue go there each once, and the rest of
their batch is delivered: the copies share the event's row, whose Id is the key of
PostgreSQL's queue tables."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import (
    SAMPLES_RECEIVER,
    pg_connect,
    pg_count,
    pg_nsb_receive_all,
    pg_nsb_send,
    pg_rows,
    wait_until,
)
from test_multicast import CONCRETE, published_event, subscribe

pytestmark = pytest.mark.integration

UNROUTABLE = ('"public"."Nowhere.A"', '"public"."Nowhere.B"')


def forward_one_batch(config_path: Path) -> Counter[str]:
    from bridge.config import load_config
    from bridge.connections import Connections
    from bridge.forwarding.spine import BatchForwarder

    config, _ = load_config(config_path)
    connections = Connections(config.databases)
    try:
        return BatchForwarder(config, config.forwarders[0], connections).forward_batch().counts
    finally:
        connections.close()


def test_two_unroutable_copies_of_one_event_both_reach_the_error_queue_and_the_batch_delivers(
    pg_pair_factory: Any,
) -> None:
    # Only the receiver's queues are routed: the other subscribers' addresses match no route.
    pair = pg_pair_factory(
        route={"match": "Samples*"}, subscription_tables=[{"database": "sender"}]
    )
    for endpoint, address in (("A", UNROUTABLE[0]), ("B", UNROUTABLE[1])):
        subscribe(pair.sender, endpoint, address, CONCRETE)
    subscribe(pair.sender, "Receiver", SAMPLES_RECEIVER, CONCRETE)
    event = published_event()
    with pg_connect(pair.sender) as connection:
        pg_nsb_send(connection, pair.forward, event, b"event")
        connection.commit()
    unicast = pair.send(3)

    counts = forward_one_batch(pair.config)

    assert counts == Counter({"delivered": 4, "sent-to-error-queue": 2})
    received = pair.received()
    assert received == Counter({**{i: 1 for i in unicast}, event["NServiceBus.MessageId"]: 1})
    errors = pg_nsb_receive_all(pair.sender, '"public"."error"')
    assert sorted(e["headers"]["$.store-and-forward.destination"] for e in errors) == sorted(
        UNROUTABLE
    )
    # Each copy keeps the event's message id: NServiceBus's retry of it is the same message.
    assert {e["headers"]["NServiceBus.MessageId"] for e in errors} == {
        event["NServiceBus.MessageId"]
    }
    assert {e["body"] for e in errors} == {b"event"}
    assert pg_rows(pair.sender, f"SELECT count(*) FROM {pair.forward}") == [(0,)]


def test_copies_given_up_on_later_join_a_copy_rejected_earlier_in_the_error_queue(
    pg_pair_factory: Any,
) -> None:
    pair = pg_pair_factory(
        route={"match": "Samples*"}, subscription_tables=[{"database": "sender"}]
    )
    # Routed, but their queues do not exist: they wait in retry storage.
    missing = ('"public"."Samples.MissingA"', '"public"."Samples.MissingB"')
    for endpoint, address in (("A", UNROUTABLE[0]), ("MA", missing[0]), ("MB", missing[1])):
        subscribe(pair.sender, endpoint, address, CONCRETE)
    event = published_event()
    with pg_connect(pair.sender) as connection:
        pg_nsb_send(connection, pair.forward, event, b"event")
        connection.commit()

    counts = forward_one_batch(pair.config)
    assert counts == Counter({"sent-to-error-queue": 1, "retries-scheduled": 2})
    failed = pair.cli("retries", "fail", "--yes")
    assert failed.returncode == 0, failed.stdout + failed.stderr

    errors = pg_nsb_receive_all(pair.sender, '"public"."error"')
    assert sorted(e["headers"]["$.store-and-forward.destination"] for e in errors) == sorted(
        (UNROUTABLE[0], *missing)
    )
    assert {e["headers"]["NServiceBus.MessageId"] for e in errors} == {
        event["NServiceBus.MessageId"]
    }
    assert pg_rows(pair.sender, 'SELECT count(*) FROM "public"."sfbridge_retry"') == [(0,)]


def test_the_daemon_delivers_a_batch_whose_event_has_two_rejected_copies(
    pg_pair_factory: Any, tmp_path: Path
) -> None:
    pair = pg_pair_factory(
        route={"match": "Samples*"}, subscription_tables=[{"database": "sender"}]
    )
    for endpoint, address in (("A", UNROUTABLE[0]), ("B", UNROUTABLE[1])):
        subscribe(pair.sender, endpoint, address, CONCRETE)
    with pg_connect(pair.sender) as connection:
        pg_nsb_send(connection, pair.forward, published_event(), b"event")
        connection.commit()
    unicast = pair.send(3)
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        wait_until(
            lambda: pair.delivered() == 3 and pg_count(pair.sender, '"public"."error"') == 2,
            30,
            "the sends delivered and both copies in the error queue",
        )
        assert daemon.stop() == 0, daemon.output()
    assert pair.received() == Counter({i: 1 for i in unicast})
    assert pair.queued() == 0
