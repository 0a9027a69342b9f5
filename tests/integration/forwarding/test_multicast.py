"""Published events reach every subscriber of the event's type hierarchy, exactly once,
even when one subscriber's database is down."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyodbc
import pytest
from support import (
    FORWARD,
    DaemonProcess,
    nsb_message_headers,
    pg_connect,
    pg_count,
    pg_create_queue,
    pg_nsb_receive_all,
    pg_nsb_send,
    sfbridge,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration

ASSEMBLY = "Shared, Version=1.0.0.0, Culture=neutral, PublicKeyToken=null"
CONCRETE, BASE, INTERFACE = (
    "Shared.PriorityOrderAccepted",
    "Shared.OrderAccepted",
    "Shared.IOrderEvent",
)
ENCLOSED = ";".join(f"{name}, {ASSEMBLY}" for name in (CONCRETE, BASE, INTERFACE))

# NServiceBus's own statements for its PostgreSQL subscription table.
NSB_PG_CREATE_SUBSCRIPTIONS = """CREATE TABLE IF NOT EXISTS "public"."SubscriptionRouting" (
    QueueAddress VARCHAR(200) NOT NULL, Endpoint VARCHAR(200) NOT NULL,
    Topic VARCHAR(200) NOT NULL, PRIMARY KEY (Endpoint, Topic)) WITH (fillfactor=100)"""
NSB_PG_SUBSCRIBE = """INSERT INTO "public"."SubscriptionRouting" (QueueAddress, Topic, Endpoint)
VALUES (?, ?, ?) ON CONFLICT (Endpoint, Topic) DO UPDATE SET QueueAddress = ?"""


def published_event(**extra: str) -> dict[str, str | None]:
    headers = nsb_message_headers(None, **extra)
    del headers["NServiceBus.ReplyToAddress"]
    headers["NServiceBus.MessageIntent"] = "Publish"
    headers["NServiceBus.EnclosedMessageTypes"] = ENCLOSED
    headers["$.store-and-forward.eventtype"] = f"{CONCRETE}, {ASSEMBLY}"
    return headers


def subscribe(connection_string: str, endpoint: str, address: str, topic: str) -> None:
    with pg_connect(connection_string) as connection:
        connection.execute(NSB_PG_CREATE_SUBSCRIPTIONS)
        connection.execute(NSB_PG_SUBSCRIBE, address, topic, endpoint, address)
        connection.commit()


def test_an_event_reaches_subscribers_of_its_type_base_class_and_interface_across_databases(
    tmp_path: Path, new_pg_database: Any, private_postgres: Any
) -> None:
    sender, billing_db, shipping_db = new_pg_database(), new_pg_database(), new_pg_database()
    with pyodbc.connect(private_postgres.connection_string(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE audit")
    audit_db = private_postgres.connection_string("audit")
    config_path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": sender},
                "billing": {"dialect": "postgresql", "connection": billing_db},
                "shipping": {"dialect": "postgresql", "connection": shipping_db},
                "audit": {"dialect": "postgresql", "connection": audit_db, "connect_timeout": "2s"},
            },
            "forwarders": [
                {
                    "name": "sender",
                    "database": "sender",
                    "queue": "forward",
                    "peek_interval": "100ms",
                }
            ],
            "routes": [
                {"match": "Billing*", "database": "billing"},
                {"match": "Shipping*", "database": "shipping"},
                {"match": "Audit*", "database": "audit"},
            ],
            "retries": {"delay": "500ms", "max_attempts": 1000},
            # The concrete type's subscriber is configured; the others subscribed natively.
            "subscriptions": {CONCRETE: ['"public"."Billing"']},
            "subscription_tables": [{"database": "shipping"}],
        },
    )
    assert sfbridge("-c", str(config_path), "install").returncode == 0
    pg_create_queue(billing_db, '"public"."Billing"')
    pg_create_queue(shipping_db, '"public"."Shipping"')
    pg_create_queue(audit_db, '"public"."Audit"')
    subscribe(shipping_db, "Shipping", '"public"."Shipping"', BASE)
    subscribe(shipping_db, "Audit", '"public"."Audit"', INTERFACE)
    private_postgres.kill()

    sent = {}
    with pg_connect(sender) as connection:
        for number in range(10):
            headers = published_event(**{"Custom.Number": str(number)})
            sent[headers["NServiceBus.MessageId"]] = headers
            pg_nsb_send(connection, FORWARD, headers, f"event {number}".encode())
        connection.commit()

    with DaemonProcess(config_path, tmp_path / "daemon.log") as daemon:
        wait_until(
            lambda: (
                pg_count(billing_db, '"public"."Billing"') == 10
                and pg_count(shipping_db, '"public"."Shipping"') == 10
            ),
            30,
            "the reachable subscribers to get their copies at once",
        )
        status = json.loads(sfbridge("-c", str(config_path), "status", "--json").stdout)
        forwarder = status["forwarders"][0]
        assert forwarder["waiting_for_retry"] == 10
        assert [r["destination"] for r in forwarder["retries"]] == ['"public"."Audit"']
        [event] = forwarder["event_types"]
        assert event["event_type"] == CONCRETE
        assert event["topics"] == [CONCRETE, BASE, INTERFACE, "System.Object"]
        sources = {s["address"]: s["source"] for s in event["subscribers"]}
        assert sources == {
            '"public"."Billing"': "config",
            '"public"."Shipping"': "table SubscriptionRouting in database 'shipping'",
            '"public"."Audit"': "table SubscriptionRouting in database 'shipping'",
        }

        private_postgres.start()
        wait_until(lambda: pg_count(audit_db, '"public"."Audit"') == 10, 30, "the late subscriber")
        assert daemon.stop() == 0, daemon.output()

    for connection_string, queue in (
        (billing_db, "Billing"),
        (shipping_db, "Shipping"),
        (audit_db, "Audit"),
    ):
        received = pg_nsb_receive_all(connection_string, f'"public"."{queue}"')
        ids = Counter(m["headers"]["NServiceBus.MessageId"] for m in received)
        assert set(ids) == set(sent) and max(ids.values()) == 1, queue
        for message in received:
            original = sent[message["headers"]["NServiceBus.MessageId"]]
            expected = {k: v for k, v in original.items() if k != "$.store-and-forward.eventtype"}
            assert message["headers"] == expected
    assert pg_count(sender, '"public"."error"') == 0
    assert pg_count(sender, '"public"."sfbridge_retry"') == 0
    check = sfbridge("-c", str(config_path), "check")
    assert check.returncode == 0, check.stdout
    assert f'event {CONCRETE}: "public"."Audit" (table SubscriptionRouting' in check.stdout


SQLSERVER_SHAPED_QUEUE = """CREATE TABLE "{0}" (Id TEXT NOT NULL, CorrelationId TEXT,
    ReplyToAddress TEXT, Recoverable INTEGER NOT NULL, Expires TEXT, Headers TEXT NOT NULL,
    Body BLOB, RowVersion INTEGER PRIMARY KEY AUTOINCREMENT)"""


def test_sqlite_edge_publishes_to_sqlite_and_postgresql_subscribers_and_drops_unsubscribed_events(
    tmp_path: Path, new_pg_database: Any
) -> None:
    edge, local = tmp_path / "edge.db", tmp_path / "local.db"
    central = new_pg_database()
    config_path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "edge": {"dialect": "sqlite", "path": str(edge)},
                "local": {"dialect": "sqlite", "path": str(local)},
                "central": {"dialect": "postgresql", "connection": central},
            },
            "forwarders": [
                {"name": "edge", "database": "edge", "queue": "forward", "peek_interval": "100ms"}
            ],
            "routes": [
                {"match": "Local.*", "database": "local"},
                {"match": "*", "database": "central"},
            ],
            "subscription_tables": [{"database": "local"}],
            "publish": {"no_subscribers": "drop"},
        },
    )
    assert sfbridge("-c", str(config_path), "install").returncode == 0
    with sqlite3.connect(local) as connection:
        connection.execute(SQLSERVER_SHAPED_QUEUE.format("Local.Reports"))
        connection.execute(
            "CREATE TABLE SubscriptionRouting (QueueAddress TEXT NOT NULL, "
            "Endpoint TEXT NOT NULL, Topic TEXT NOT NULL, "
            "PRIMARY KEY (Endpoint, Topic))"
        )
        for endpoint, address, topic in (
            ("Local.Reports", "Local.Reports", INTERFACE),
            ("Central", "Central.Orders@[dbo]@[nsb]", BASE),
        ):
            connection.execute(
                "INSERT INTO SubscriptionRouting VALUES (?, ?, ?)", (address, endpoint, topic)
            )
    pg_create_queue(central, '"public"."Central.Orders"')
    unsubscribed = published_event()
    unsubscribed["$.store-and-forward.eventtype"] = f"Shared.NobodyCares, {ASSEMBLY}"
    unsubscribed["NServiceBus.EnclosedMessageTypes"] = f"Shared.NobodyCares, {ASSEMBLY}"
    events = [published_event() for _ in range(5)]
    with sqlite3.connect(edge) as connection:
        for headers in [*events, unsubscribed]:
            connection.execute(
                'INSERT INTO "forward" (Id, Recoverable, Expires, Headers, Body) '
                "VALUES (?, 1, NULL, ?, ?)",
                (str(uuid.uuid4()), json.dumps(headers), b"e"),
            )
    with DaemonProcess(config_path, tmp_path / "daemon.log") as daemon:
        wait_until(lambda: pg_count(central, '"public"."Central.Orders"') == 5, 30, "central")
        assert daemon.stop() == 0
    with sqlite3.connect(local) as connection:
        assert connection.execute('SELECT count(*) FROM "Local.Reports"').fetchone()[0] == 5
    status = json.loads(sfbridge("-c", str(config_path), "status", "--json").stdout)
    counters = status["forwarders"][0]["counters"]
    # 6 events claimed, fanned out into 5 more copies: 11 settled.
    assert counters == {
        "claimed": 6,
        "fan-out-copies": 5,
        "delivered": 10,
        "published-without-subscribers": 1,
    }


def test_a_subscription_table_in_the_sqlite_forwarding_file_itself_is_read_during_a_batch(
    tmp_path: Path,
) -> None:
    # The lookup runs while the batch holds the file's write lock; it must only read.
    from collections import Counter

    from bridge.config import load_config
    from bridge.connections import Connections
    from bridge.forwarding.spine import BatchForwarder

    edge = tmp_path / "edge.db"
    config_path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {"edge": {"dialect": "sqlite", "path": str(edge)}},
            "forwarders": [{"name": "edge", "database": "edge", "queue": "forward"}],
            "routes": [{"match": "*", "database": "edge"}],
            "subscription_tables": [{"database": "edge"}],
        },
    )
    assert sfbridge("-c", str(config_path), "install").returncode == 0
    with sqlite3.connect(edge) as connection:
        connection.execute(SQLSERVER_SHAPED_QUEUE.format("Reports"))
        connection.execute(
            "CREATE TABLE SubscriptionRouting (QueueAddress TEXT NOT NULL, "
            "Endpoint TEXT NOT NULL, Topic TEXT NOT NULL, PRIMARY KEY (Endpoint, Topic))"
        )
        connection.execute("INSERT INTO SubscriptionRouting VALUES ('Reports', 'Reports', ?)",
                           (CONCRETE,))  # fmt: skip
        for headers in [published_event() for _ in range(3)]:
            connection.execute(
                'INSERT INTO "forward" (Id, Recoverable, Expires, Headers, Body) '
                "VALUES (?, 1, NULL, ?, ?)",
                (str(uuid.uuid4()), json.dumps(headers), b"e"),
            )
    config, _ = load_config(config_path)
    connections = Connections(config.databases)
    try:
        report = BatchForwarder(config, config.forwarders[0], connections).forward_batch()
    finally:
        connections.close()
    assert report.counts == Counter({"delivered": 3})
    with sqlite3.connect(edge) as connection:
        assert connection.execute('SELECT count(*) FROM "Reports"').fetchone() == (3,)
