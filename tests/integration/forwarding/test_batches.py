"""One batch, many fates: multi-row delivery must settle every message on its own merits."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import (
    FORWARD,
    nsb_message_headers,
    pg_connect,
    pg_count,
    pg_create_queue,
    pg_nsb_receive_all,
    pg_nsb_send,
    pg_rows,
    sfbridge,
    write_config,
)

from bridge.config import load_config
from bridge.connections import Connections
from bridge.forwarding.spine import BatchForwarder

pytestmark = pytest.mark.integration


@pytest.fixture
def pg_pair(tmp_path: Path, new_pg_database: Any) -> dict[str, Any]:
    sender, receiver = new_pg_database(), new_pg_database()
    config_path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": sender},
                "receiver": {"dialect": "postgresql", "connection": receiver},
            },
            "forwarders": [{"name": "s", "database": "sender", "queue": "forward"}],
            "routes": [
                {"match": "Local*", "database": "sender"},
                {"match": "*", "database": "receiver"},
            ],
        },
    )
    assert sfbridge("-c", str(config_path), "install").returncode == 0
    pg_create_queue(receiver, '"public"."Good"')
    pg_create_queue(sender, '"public"."LocalGood"')
    config, _ = load_config(config_path)
    connections = Connections(config.databases)
    yield {
        "sender": sender,
        "receiver": receiver,
        "forwarder": BatchForwarder(config, config.forwarders[0], connections),
    }
    connections.close()


def send_all(sender: str, messages: list[tuple[dict[str, Any], bytes]]) -> None:
    with pg_connect(sender) as connection:
        for headers, body in messages:
            pg_nsb_send(connection, FORWARD, headers, body)
        connection.commit()


@pytest.mark.parametrize("prefix", ["", "Local"])
def test_a_missing_queue_in_a_batch_fails_only_its_own_messages(
    pg_pair: dict[str, Any], prefix: str
) -> None:
    good = [(nsb_message_headers(f'"{prefix}Good"'), b"g") for _ in range(10)]
    missing = [(nsb_message_headers(f'"{prefix}Missing"'), b"m") for _ in range(5)]
    send_all(pg_pair["sender"], good[:5] + missing + good[5:])
    report = pg_pair["forwarder"].forward_batch()
    assert report.counts == Counter({"delivered": 10, "retries-scheduled": 5})
    target = pg_pair["sender"] if prefix else pg_pair["receiver"]
    assert pg_count(target, f'"public"."{prefix}Good"') == 10
    errors = pg_rows(
        pg_pair["sender"], 'SELECT destination, last_error FROM "public"."sfbridge_retry"'
    )
    assert {row[0] for row in errors} == {f'"public"."{prefix}Missing"'}
    assert all("does not exist" in row[1] for row in errors)


def test_two_copies_of_one_message_in_one_batch_are_delivered_once(pg_pair: dict[str, Any]) -> None:
    headers = nsb_message_headers('"Good"')
    send_all(
        pg_pair["sender"], [(headers, b"1"), (headers, b"2"), (nsb_message_headers('"Good"'), b"3")]
    )
    report = pg_pair["forwarder"].forward_batch()
    assert report.counts == Counter({"delivered": 2, "duplicates-skipped": 1})
    assert sorted(
        bytes(r[0]) for r in pg_rows(pg_pair["receiver"], 'SELECT body FROM "public"."Good"')
    ) == [b"1", b"3"]


def test_a_message_the_server_rejects_is_isolated_from_the_rest_of_its_batch(
    pg_pair: dict[str, Any],
) -> None:
    # The receiver's DBA refuses some rows (a check constraint): the multi-row statement fails
    # as a whole, and the bridge must find the culprit instead of failing (or retrying) everyone.
    with pg_connect(pg_pair["receiver"]) as connection:
        connection.execute(
            'ALTER TABLE "public"."Good" ADD CONSTRAINT no_bad_bodies '
            "CHECK (body IS NULL OR body <> 'bad'::bytea)"
        )
        connection.commit()
    rejected = nsb_message_headers('"Good"')
    fine = [(nsb_message_headers('"Good"'), b"ok") for _ in range(6)]
    send_all(pg_pair["sender"], [*fine[:3], (rejected, b"bad"), *fine[3:]])
    report = pg_pair["forwarder"].forward_batch()
    assert report.counts == Counter({"delivered": 6, "retries-scheduled": 1})
    assert pg_count(pg_pair["receiver"], '"public"."Good"') == 6
    [(last_error,)] = pg_rows(pg_pair["sender"], 'SELECT last_error FROM "public"."sfbridge_retry"')
    assert "no_bad_bodies" in last_error


def test_a_message_id_longer_than_the_ledger_column_is_delivered_once(
    pg_pair: dict[str, Any],
) -> None:
    # NServiceBus lets an endpoint choose any message id; the ledger keeps a digest of long ones.
    long_id = "order/" + "x" * 500
    other_long_id = "order/" + "x" * 499 + "y"  # same first 200 characters
    messages = [
        (nsb_message_headers('"Good"', **{"NServiceBus.MessageId": long_id}), b"one"),
        (nsb_message_headers('"Good"', **{"NServiceBus.MessageId": other_long_id}), b"two"),
        (nsb_message_headers('"Good"', **{"NServiceBus.MessageId": "nul\u0000id"}), b"three"),
    ]
    send_all(pg_pair["sender"], messages)
    assert pg_pair["forwarder"].forward_batch().counts == Counter({"delivered": 3})
    # The same ids again (a redelivery after a crash between commits) are duplicates.
    send_all(pg_pair["sender"], messages)
    assert pg_pair["forwarder"].forward_batch().counts == Counter({"duplicates-skipped": 3})
    received = pg_nsb_receive_all(pg_pair["receiver"], '"public"."Good"')
    assert sorted(m["headers"]["NServiceBus.MessageId"] for m in received) == sorted(
        [long_id, other_long_id, "nul\x00id"]
    )


def test_the_ledger_compares_its_keys_as_bytes_and_still_tells_duplicates(
    pg_pair: dict[str, Any],
) -> None:
    # Recording a message inserts into the key's index: under the database's locale every
    # comparison there went through strcoll or ICU. Ids that a locale orders apart but that
    # differ only in case or accents must stay distinct messages.
    collations = pg_rows(
        pg_pair["receiver"],
        "SELECT a.attname, c.collname FROM pg_attribute a JOIN pg_collation c "
        "ON c.oid = a.attcollation WHERE a.attrelid = 'public.sfbridge_ledger'::regclass "
        "AND a.attname IN ('message_id', 'destination') ORDER BY a.attname",
    )
    assert collations == [("destination", "C"), ("message_id", "C")]
    ids = ["Order-1", "order-1", "ordér-1"]
    messages = [
        (nsb_message_headers('"Good"', **{"NServiceBus.MessageId": id_}), id_.encode())
        for id_ in ids
    ]
    send_all(pg_pair["sender"], messages)
    assert pg_pair["forwarder"].forward_batch().counts == Counter({"delivered": 3})
    send_all(pg_pair["sender"], messages)
    assert pg_pair["forwarder"].forward_batch().counts == Counter({"duplicates-skipped": 3})
    received = pg_nsb_receive_all(pg_pair["receiver"], '"public"."Good"')
    assert sorted(m["headers"]["NServiceBus.MessageId"] for m in received) == sorted(ids)


def test_sqlite_destination_batches_deduplicate_and_isolate_missing_queues(tmp_path: Path) -> None:
    edge, central = tmp_path / "edge.db", tmp_path / "central.db"
    config_path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "edge": {"dialect": "sqlite", "path": str(edge)},
                "central": {"dialect": "sqlite", "path": str(central)},
            },
            "forwarders": [{"name": "e", "database": "edge", "queue": "forward"}],
            "routes": [{"match": "*", "database": "central"}],
        },
    )
    assert sfbridge("-c", str(config_path), "install").returncode == 0
    with sqlite3.connect(central) as connection:
        connection.execute(
            'CREATE TABLE "Good" (Id TEXT NOT NULL, CorrelationId TEXT, '
            "ReplyToAddress TEXT, Recoverable INTEGER NOT NULL, Expires TEXT, "
            "Headers TEXT NOT NULL, Body BLOB, RowVersion INTEGER PRIMARY KEY "
            "AUTOINCREMENT)"
        )
    twice = nsb_message_headers("Good")
    messages = [twice, twice, nsb_message_headers("Good"), nsb_message_headers("Gone")]
    with sqlite3.connect(edge) as connection:
        for headers in messages:
            connection.execute(
                'INSERT INTO "forward" (Id, Recoverable, Expires, Headers, Body) '
                "VALUES (?, 1, NULL, ?, ?)",
                (str(uuid.uuid4()), json.dumps(headers), b"b"),
            )
    config, _ = load_config(config_path)
    connections = Connections(config.databases)
    report = BatchForwarder(config, config.forwarders[0], connections).forward_batch()
    connections.close()
    assert report.counts == Counter(
        {"delivered": 2, "duplicates-skipped": 1, "retries-scheduled": 1}
    )
    with sqlite3.connect(central) as connection:
        assert connection.execute('SELECT count(*) FROM "Good"').fetchone()[0] == 2


def test_an_event_type_of_kilobytes_does_not_hold_up_its_batch(
    tmp_path: Path, new_pg_database: Any
) -> None:
    # Event types are recorded for `status` when subscribers come from a subscription table;
    # the table keys on the type name, and PostgreSQL's index rows hold about 2.7 KB.
    sender, receiver = new_pg_database(), new_pg_database()
    config_path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": sender},
                "receiver": {"dialect": "postgresql", "connection": receiver},
            },
            "forwarders": [{"name": "s", "database": "sender", "queue": "forward"}],
            "routes": [{"match": "*", "database": "receiver"}],
            "subscription_tables": [{"database": "sender"}],
        },
    )
    assert sfbridge("-c", str(config_path), "install").returncode == 0
    pg_create_queue(receiver, '"public"."Good"')
    with pg_connect(sender) as connection:
        connection.execute(
            'CREATE TABLE "public"."SubscriptionRouting" (QueueAddress varchar(200) NOT NULL, '
            "Endpoint varchar(200), Topic varchar(200) NOT NULL, PRIMARY KEY (QueueAddress, Topic))"
        )
        connection.commit()
    # Not compressible below the limit, as a repetitive name would be.
    noise = "".join(hashlib.sha256(str(n).encode()).hexdigest() for n in range(140))
    huge = f"Shared.Events.OrderAccepted`1[[Shared.P{noise}, Shared]], Shared"
    assert len(huge) > 8000
    event = nsb_message_headers(None, **{"$.store-and-forward.eventtype": huge})
    fine = [(nsb_message_headers('"Good"'), b"ok") for _ in range(5)]
    send_all(sender, [*fine[:2], (event, b"event"), *fine[2:]])
    config, _ = load_config(config_path)
    connections = Connections(config.databases)
    try:
        report = BatchForwarder(config, config.forwarders[0], connections).forward_batch()
    finally:
        connections.close()
    assert report.counts == Counter({"delivered": 5, "published-without-subscribers": 1})
    assert pg_count(receiver, '"public"."Good"') == 5
    [(recorded,)] = pg_rows(sender, 'SELECT event_type FROM "public"."sfbridge_event_types"')
    assert recorded.startswith("Shared.Events.OrderAccepted`1[[") and "(sha256 " in recorded
    assert len(recorded) < 400

    # Recording is isolated in a savepoint: with its table gone, the batch still goes through,
    # and the table is created again afterwards.
    with pg_connect(sender) as connection:
        connection.execute('DROP TABLE "public"."sfbridge_event_types"')
        connection.commit()
    event = nsb_message_headers(None, **{"$.store-and-forward.eventtype": "Shared.Other, Shared"})
    send_all(sender, [(event, b"event"), (nsb_message_headers('"Good"'), b"ok")])
    connections = Connections(config.databases)
    try:
        report = BatchForwarder(config, config.forwarders[0], connections).forward_batch()
    finally:
        connections.close()
    assert report.counts == Counter({"delivered": 1, "published-without-subscribers": 1})
    assert pg_count(sender, '"public"."sfbridge_event_types"') == 0


def _sqlite_edge(tmp_path: Path, new_pg_database: Any) -> tuple[Any, Path, str]:
    edge, central = tmp_path / "edge.db", new_pg_database()
    path = write_config(
        tmp_path / "edge.yaml",
        {
            "databases": {
                "edge": {"dialect": "sqlite", "path": str(edge)},
                "central": {"dialect": "postgresql", "connection": central},
            },
            "forwarders": [{"name": "e", "database": "edge", "queue": "forward"}],
            "routes": [{"match": "*", "database": "central"}],
        },
    )
    assert sfbridge("-c", str(path), "install").returncode == 0
    pg_create_queue(central, '"public"."Good"')
    config, _ = load_config(path)
    return config, edge, central


def _edge_rows(edge: Path, rows: list[tuple[object, object, str, object]]) -> None:
    with sqlite3.connect(edge) as connection:
        connection.executemany(
            'INSERT INTO "forward" (Id, Recoverable, Expires, Headers, Body) '
            "VALUES (?, 1, ?, ?, ?)",
            rows,
        )


def test_an_expires_written_with_an_offset_is_delivered_not_lost(
    tmp_path: Path, new_pg_database: Any
) -> None:
    # SQLite columns are untyped: an application may write Expires with an offset. That once
    # raised after the ledger insert, left the destination transaction open, and the next batch
    # committed the ledger rows alone: three messages counted as duplicates, none delivered.
    config, edge, central = _sqlite_edge(tmp_path, new_pg_database)
    headers = [nsb_message_headers("Good") for _ in range(3)]
    _edge_rows(edge, [
        (str(uuid.uuid4()), expires, json.dumps(h), b"x")
        for h, expires in zip(headers, [None, "2099-01-01T00:00:00+00:00", None], strict=True)
    ])  # fmt: skip
    connections = Connections(config.databases)
    try:
        forwarder = BatchForwarder(config, config.forwarders[0], connections)
        assert forwarder.forward_batch().counts == Counter({"delivered": 3})
        assert forwarder.forward_batch().claimed == 0
    finally:
        connections.close()
    received = pg_nsb_receive_all(central, '"public"."Good"')
    assert sorted(m["headers"]["NServiceBus.MessageId"] for m in received) == sorted(
        h["NServiceBus.MessageId"] for h in headers
    )
    expires = [m["expires"] for m in received if m["expires"] is not None]
    assert [str(e)[:19] for e in expires] == ["2099-01-01 00:00:00"]


def test_a_row_that_cannot_be_read_goes_to_the_error_queue_and_does_not_block_the_queue(
    tmp_path: Path, new_pg_database: Any
) -> None:
    config, edge, central = _sqlite_edge(tmp_path, new_pg_database)
    good = nsb_message_headers("Good")
    _edge_rows(edge, [
        ("not-a-uuid", None, json.dumps(nsb_message_headers("Good")), "text, not a blob"),
        (str(uuid.uuid4()), None, json.dumps(good), b"fine"),
    ])  # fmt: skip
    connections = Connections(config.databases)
    try:
        report = BatchForwarder(config, config.forwarders[0], connections).forward_batch()
    finally:
        connections.close()
    assert report.counts == Counter({"delivered": 1, "sent-to-error-queue": 1})
    received = pg_nsb_receive_all(central, '"public"."Good"')
    assert [m["headers"]["NServiceBus.MessageId"] for m in received] == [
        good["NServiceBus.MessageId"]
    ]
    with sqlite3.connect(edge) as connection:
        assert connection.execute('SELECT count(*) FROM "forward"').fetchone() == (0,)
        [(body,)] = connection.execute('SELECT Body FROM "error"').fetchall()
    assert body == b"text, not a blob"
