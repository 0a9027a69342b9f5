"""Proxy queues, as a team leaving multi-instance mode uses them.

Two PostgreSQL databases, one endpoint in each. Neither endpoint knows about the bridge: the
Sender sends `OrderSubmitted` with the transport's own INSERT into a table named after the
Receiver in *its own* database, and the Receiver replies `OrderAccepted` to whatever
`NServiceBus.ReplyToAddress` says, again in its own database. Two proxy forwarders carry the
messages across, both ways, through a destination database that is dropped and recreated
and a daemon killed with SIGKILL.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyodbc
import pytest
from support import ERROR_QUEUE as ERROR
from support import (
    NSB_PG_CREATE_QUEUE,
    NSB_PG_RECEIVE,
    DaemonProcess,
    nsb_message_headers,
    pg_connect,
    pg_count,
    pg_create_queue,
    pg_nsb_receive_all,
    pg_nsb_send,
    pg_rows,
    sfbridge,
    wait_until,
    write_config,
)
from support import RETRY_TABLE as RETRY
from support import SAMPLES_RECEIVER as RECEIVER_QUEUE

pytestmark = pytest.mark.integration

SENDER_QUEUE = '"public"."Samples.Sender"'


def order(reply_to: str) -> dict[str, str | None]:
    """An ordinary Send from the Sender endpoint: no store-and-forward header at all."""
    return nsb_message_headers(
        None,
        **{
            "NServiceBus.ReplyToAddress": reply_to,
            "NServiceBus.OriginatingEndpoint": "Samples.Sender",
        },
    )


def send_orders(sender: str, proxy: str, reply_to: str, count: int) -> set[str]:
    ids = set()
    with pg_connect(sender) as connection:
        for _ in range(count):
            headers = order(reply_to)
            ids.add(str(headers["NServiceBus.MessageId"]))
            pg_nsb_send(
                connection,
                proxy,
                headers,
                b'{"OrderId":"' + uuid.uuid4().bytes.hex().encode() + b'"}',
            )
        connection.commit()
    return ids


def receive_and_reply(receiver: str, queue: str, own_address: str) -> list[dict[str, Any]]:
    """The Receiver endpoint: receive one message at a time and reply to its ReplyToAddress in
    the same transaction (the transport's sends-atomic-with-receive). A reply that cannot be
    sent (its table is missing) rolls the receive back, as the endpoint's recoverability would.
    Returns the headers of what was handled."""
    handled: list[dict[str, Any]] = []
    with pg_connect(receiver) as connection:
        while True:
            cursor = connection.execute(NSB_PG_RECEIVE.format(queue))
            row = cursor.fetchone() if cursor.description is not None else None
            if row is None:
                connection.commit()
                return handled
            headers = json.loads(row[2])
            reply = {
                "NServiceBus.MessageId": str(uuid.uuid4()),
                "NServiceBus.MessageIntent": "Reply",
                "NServiceBus.CorrelationId": headers["NServiceBus.MessageId"],
                "NServiceBus.ReplyToAddress": own_address,
                "NServiceBus.EnclosedMessageTypes": "Shared.OrderAccepted, Shared",
            }
            try:
                # The reply goes to the address exactly as received: a PostgreSQL address is
                # the qualified table name.
                pg_nsb_send(connection, headers["NServiceBus.ReplyToAddress"], reply, b"{}")
            except pyodbc.Error:
                connection.rollback()
                return handled
            connection.commit()
            handled.append(headers)


def replies_by_correlation(sender: str, queue: str) -> Counter[str]:
    return Counter(
        m["headers"]["NServiceBus.CorrelationId"] for m in pg_nsb_receive_all(sender, queue)
    )


def table_exists(connection_string: str, table: str) -> bool:
    rows = pg_rows(
        connection_string,
        f"SELECT count(*) FROM information_schema.tables WHERE table_name = '{table}'",
    )
    return bool(rows[0][0])


def columns_of(connection_string: str, table: str) -> list[tuple[Any, ...]]:
    return pg_rows(
        connection_string,
        "SELECT column_name, data_type, is_nullable, column_default IS NOT NULL "
        f"FROM information_schema.columns WHERE table_name = '{table}' ORDER BY ordinal_position",
    )


def drop_database(postgres: Any, name: str) -> None:
    with postgres.admin() as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def create_database(postgres: Any, name: str) -> None:
    with postgres.admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')


def two_endpoints(
    tmp_path: Path, postgres: Any, receiver_schema: str | None = None
) -> dict[str, Any]:
    names = {"sender": postgres.create_database(), "receiver": postgres.create_database()}
    strings = {role: postgres.connection_string(name) for role, name in names.items()}
    receiver_entry: dict[str, Any] = {
        "dialect": "postgresql",
        "connection": strings["receiver"],
        "connect_timeout": "2s",
    }
    if receiver_schema:
        receiver_entry["schema"] = receiver_schema
    config = {
        "databases": {
            "sender": {"dialect": "postgresql", "connection": strings["sender"]},
            "receiver": receiver_entry,
        },
        # No routes: both forwarders are proxies. The queues name no schema, so each takes
        # its database's default.
        "forwarders": [
            {
                "name": "to-receiver",
                "database": "sender",
                "queue": '"Samples.Receiver"',
                "destination": {"database": "receiver"},
                "peek_interval": "200ms",
            },
            {
                "name": "to-sender",
                "database": "receiver",
                "queue": '"Samples.Sender"',
                "destination": {"database": "sender"},
                "peek_interval": "200ms",
            },
        ],
        "retries": {"delay": "1s", "during_outage": "wait"},
    }
    path = write_config(tmp_path / "sfbridge.yaml", config)
    return {"config": path, "names": names, **strings}


def install_endpoints(world: dict[str, Any], receiver_queue: str = RECEIVER_QUEUE) -> None:
    """Each endpoint's installer creates its own input queue."""
    pg_create_queue(world["sender"], SENDER_QUEUE)
    if receiver_queue.startswith('"nsb"'):
        pg_rows(world["receiver"], 'CREATE SCHEMA IF NOT EXISTS "nsb"')
    pg_create_queue(world["receiver"], receiver_queue)


def test_orders_and_their_replies_cross_both_ways_exactly_once_through_an_outage(
    tmp_path: Path, postgres: Any
) -> None:
    world = two_endpoints(tmp_path, postgres)
    sender, receiver, config = world["sender"], world["receiver"], world["config"]
    installed = sfbridge("-c", str(config), "install")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    install_endpoints(world)

    # The proxies are queue tables in the transport's exact shape.
    pg_rows(sender, NSB_PG_CREATE_QUEUE.format('"public"."shape"'))
    for database, proxy in ((sender, "Samples.Receiver"), (receiver, "Samples.Sender")):
        assert columns_of(database, proxy) == columns_of(sender, "shape"), proxy
    checked = sfbridge("-c", str(config), "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The tests connect as postgres: that warning is check's, about the login, not the proxies.
    assert not [
        line
        for line in checked.stdout.splitlines()
        if line.startswith("WARNING") and "is superuser" not in line
    ], checked.stdout
    assert (
        "forwarder 'to-receiver' destination in database 'receiver': "
        f"{RECEIVER_QUEUE} has the NServiceBus queue shape" in checked.stdout
    )

    proxy_in_sender = RECEIVER_QUEUE  # named after the Receiver, in the sender database
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    try:
        before = send_orders(sender, proxy_in_sender, SENDER_QUEUE, 20)
        handled: list[dict[str, Any]] = []

        def received_all_before() -> bool:
            handled.extend(receive_and_reply(receiver, RECEIVER_QUEUE, RECEIVER_QUEUE))
            return len(handled) == 20

        wait_until(received_all_before, 30, "the Receiver to get the first orders")
        assert {h["NServiceBus.MessageId"] for h in handled} == before
        assert not any(k.startswith("$.store-and-forward") for h in handled for k in h)
        wait_until(lambda: pg_count(sender, SENDER_QUEUE) == 20, 30, "the first replies")

        # The receiver database is dropped; the Sender goes on sending.
        drop_database(postgres, world["names"]["receiver"])
        during = send_orders(sender, proxy_in_sender, SENDER_QUEUE, 30)

        def waiting() -> bool:
            result = sfbridge("-c", str(config), "status", "--json")
            status = json.loads(result.stdout)
            states = {d["database"]: d for d in status["destinations"]}
            return states.get("receiver", {}).get("waiting") == 30

        wait_until(waiting, 30, "the orders to wait for the receiver database")

        # Killed hard while it waits; a new daemon takes over.
        daemon.kill()  # SIGKILL
        daemon = DaemonProcess(config, tmp_path / "daemon2.log")

        # The Receiver's installer recreates its database and its own queue only; the proxy
        # for the replies is the bridge's to bring back.
        create_database(postgres, world["names"]["receiver"])
        pg_create_queue(receiver, RECEIVER_QUEUE)
        after: list[dict[str, Any]] = []

        def received_all_during() -> bool:
            after.extend(receive_and_reply(receiver, RECEIVER_QUEUE, RECEIVER_QUEUE))
            return len(after) >= 30

        wait_until(received_all_during, 60, "the Receiver to get the orders sent meanwhile")
        wait_until(lambda: pg_count(sender, SENDER_QUEUE) == 50, 60, "every reply")
        assert daemon.stop() == 0, daemon.output()
    finally:
        daemon.__exit__()

    assert Counter(h["NServiceBus.MessageId"] for h in after) == Counter(during)
    replies = replies_by_correlation(sender, SENDER_QUEUE)
    assert replies == Counter(before | during)
    for database in (sender, receiver):
        assert pg_count(database, ERROR) == 0
        assert pg_count(database, RETRY) == 0
    assert pg_count(sender, proxy_in_sender) == 0
    assert pg_count(receiver, SENDER_QUEUE) == 0
    log = daemon.output()
    made = "created what was missing in database 'receiver'"
    created = [line for line in log.splitlines() if made in line]
    assert any('forwarding queue "public"."Samples.Sender"' in line for line in created), log
    assert "found nothing to create" not in log and "Traceback" not in log, log


def test_reply_addresses_are_rewritten_where_the_schemas_differ(
    tmp_path: Path, postgres: Any
) -> None:
    world = two_endpoints(tmp_path, postgres, receiver_schema="nsb")
    sender, receiver, config = world["sender"], world["receiver"], world["config"]
    receiver_queue = '"nsb"."Samples.Receiver"'
    installed = sfbridge("-c", str(config), "install")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    install_endpoints(world, receiver_queue)

    with DaemonProcess(config, tmp_path / "daemon.log") as daemon:
        sent = send_orders(sender, RECEIVER_QUEUE, SENDER_QUEUE, 5)
        handled: list[dict[str, Any]] = []

        def received() -> bool:
            handled.extend(receive_and_reply(receiver, receiver_queue, receiver_queue))
            return len(handled) == 5

        wait_until(received, 30, "the Receiver to get the orders")
        wait_until(lambda: pg_count(sender, SENDER_QUEUE) == 5, 30, "the replies")
        assert daemon.stop() == 0, daemon.output()

    # The Sender's address means nothing in the receiver database, where the way back is
    # the proxy in schema nsb; the Receiver's address was rewritten on the way back too.
    assert {h["NServiceBus.ReplyToAddress"] for h in handled} == {'"nsb"."Samples.Sender"'}
    assert {h["NServiceBus.MessageId"] for h in handled} == sent
    replies = pg_nsb_receive_all(sender, SENDER_QUEUE)
    assert {m["headers"]["NServiceBus.ReplyToAddress"] for m in replies} == {RECEIVER_QUEUE}
    assert Counter(m["headers"]["NServiceBus.CorrelationId"] for m in replies) == Counter(sent)


def test_send_without_a_destination_goes_through_a_proxy_and_check_warns_of_shadowing(
    tmp_path: Path, postgres: Any
) -> None:
    world = two_endpoints(tmp_path, postgres)
    sender, receiver, config = world["sender"], world["receiver"], world["config"]
    assert sfbridge("-c", str(config), "install").returncode == 0
    install_endpoints(world)

    sent = sfbridge("-c", str(config), "send", "--forwarder", "to-receiver", "--count", "3")
    assert sent.returncode == 0, sent.stderr
    assert "sent 3 message(s) to the proxy's destination in database 'receiver'" in sent.stdout
    [(headers,)] = pg_rows(sender, f"SELECT headers FROM {RECEIVER_QUEUE} LIMIT 1")
    assert not any(key.startswith("$.store-and-forward") for key in json.loads(headers))
    with DaemonProcess(config, tmp_path / "daemon.log") as daemon:
        wait_until(lambda: pg_count(receiver, RECEIVER_QUEUE) == 3, 30, "the test messages")
        assert daemon.stop() == 0, daemon.output()

    # The Receiver endpoint also lives in the sender database: its delayed-delivery table and
    # a native subscription give it away, and the proxy would take its messages.
    pg_rows(sender, NSB_PG_CREATE_QUEUE.format('"public"."Samples.Receiver.Delayed"'))
    pg_rows(
        sender,
        'CREATE TABLE "public"."SubscriptionRouting" (QueueAddress varchar(200), '
        "Endpoint varchar(200), Topic varchar(200))",
    )
    pg_rows(
        sender,
        """INSERT INTO "public"."SubscriptionRouting" VALUES """
        """('"public"."Samples.Receiver"', 'Samples.Receiver', 'Shared.OrderSubmitted')""",
    )
    checked = sfbridge("-c", str(config), "check")
    assert checked.returncode == 0, checked.stdout
    [warning] = [
        line
        for line in checked.stdout.splitlines()
        if line.startswith("WARNING") and "is superuser" not in line
    ]
    assert warning == (
        'WARNING  forwarder \'to-receiver\' queue: "public"."Samples.Receiver" looks like the '
        "queue of a real endpoint in database 'sender' (its delayed-delivery table "
        '"public"."Samples.Receiver.Delayed" exists; it subscribes to events from this queue '
        '("public"."SubscriptionRouting")): the proxy would take that endpoint\'s messages. '
        "Give the proxy its own database, or route by headers"
    )

    routed = sfbridge("-c", str(config), "send", "--forwarder", "to-sender")
    assert routed.returncode == 0  # a proxy too
    plain = write_config(
        tmp_path / "plain.yaml",
        {
            "databases": {"sender": {"dialect": "postgresql", "connection": sender}},
            "forwarders": [{"name": "f", "database": "sender", "queue": "forward"}],
            "routes": [{"match": "*", "database": "sender"}],
        },
    )
    refused = sfbridge("-c", str(plain), "send")
    assert refused.returncode == 2
    assert "forwarder 'f' routes by the destination header" in refused.stderr
