"""End to end on real PostgreSQL: the CLI and the daemon in subprocesses, as a user runs them.

Messages are written with NServiceBus's own send statement and read back with its own
receive statement (tests/support/), so wire compatibility is checked.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import SAMPLES_RECEIVER as RECEIVER
from support import SENDER_FORWARD as FORWARD
from support import (
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

pytestmark = pytest.mark.integration

ROUTING_HEADERS = {"$.store-and-forward.destination", "$.store-and-forward.eventtype"}


def bridge_config(sender: str, receiver: str, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "databases": {
            "sender": {"dialect": "postgresql", "connection": sender},
            "receiver": {"dialect": "postgresql", "connection": "${RECEIVER_ODBC}"},
        },
        "forwarders": [
            {
                "name": "sender",
                "database": "sender",
                "queue": FORWARD,
                "peek_interval": "200ms",
                "batch_size": 100,
                "concurrency": 2,
            },
        ],
        "routes": [
            {"match": "Samples.Receiver*", "database": "receiver"},
            {"match": "Local.*", "database": "sender"},
        ],
        "retries": {"delay": "1s", "max_attempts": 100},
    }
    config.update(overrides)
    return config


@pytest.fixture
def databases(new_pg_database: Any) -> tuple[str, str]:
    return new_pg_database(), new_pg_database()


@pytest.fixture
def installed(tmp_path: Path, databases: tuple[str, str]) -> dict[str, Any]:
    sender, receiver = databases
    config_path = write_config(tmp_path / "sfbridge.yaml", bridge_config(sender, receiver))
    env = {"RECEIVER_ODBC": receiver}
    result = sfbridge("-c", str(config_path), "install", env=env)
    assert result.returncode == 0, result.stderr
    pg_create_queue(receiver, RECEIVER)  # what the Receiver endpoint's installers do
    return {"config": config_path, "env": env, "sender": sender, "receiver": receiver}


def status(setup: dict[str, Any]) -> dict[str, Any]:
    result = sfbridge("-c", str(setup["config"]), "status", "--json", env=setup["env"])
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 1: no daemon running
    return json.loads(result.stdout)["forwarders"][0]


def test_daemon_forwards_thousands_of_nservicebus_messages_exactly_once_intact(
    installed: dict[str, Any], tmp_path: Path
) -> None:
    rng = random.Random(7)
    sent: dict[str, dict[str, Any]] = {}
    with pg_connect(installed["sender"]) as connection:
        for number in range(3000):
            headers = nsb_message_headers(
                '"Samples.Receiver"' if number % 2 else RECEIVER,
                **{
                    "Custom.Unicode": "äöü – 日本語 🚀",
                    "Custom.Null": None,
                    "Custom.Slash": "application/json",
                    "Custom.Number": str(number),
                },
            )
            body = None if number == 0 else rng.randbytes(rng.choice([0, 1, 255, 256, 4000]))
            ttbr = 3_600_000 if number % 3 == 0 else None
            pg_nsb_send(connection, FORWARD, headers, body, ttbr)
            sent[str(headers["NServiceBus.MessageId"])] = {"headers": headers, "body": body}
        connection.commit()
    expires_sent = {
        json.loads(headers)["NServiceBus.MessageId"]: expires
        for headers, expires in pg_rows(
            installed["sender"], f"SELECT headers, expires FROM {FORWARD}"
        )
    }

    with DaemonProcess(installed["config"], tmp_path / "daemon.log", installed["env"]) as daemon:
        wait_until(lambda: pg_count(installed["receiver"], RECEIVER) >= 3000, 120, "3000 messages")
        # SIGTERM lets the batches in flight finish: a duplicate would be there once it exits.
        assert daemon.stop() == 0, daemon.output()
    assert "Traceback" not in daemon.output()

    received = pg_nsb_receive_all(installed["receiver"], RECEIVER)
    ids = Counter(message["headers"]["NServiceBus.MessageId"] for message in received)
    assert len(received) == 3000
    assert set(ids) == set(sent) and max(ids.values()) == 1
    for message in received:
        original = sent[message["headers"]["NServiceBus.MessageId"]]
        expected_headers = {
            k: v for k, v in original["headers"].items() if k not in ROUTING_HEADERS
        }
        assert message["headers"] == expected_headers
        assert message["body"] == original["body"]
        assert message["expires"] == expires_sent[message["headers"]["NServiceBus.MessageId"]]
        assert message["expired"] == 0
    assert pg_count(installed["sender"], FORWARD) == 0
    assert pg_count(installed["sender"], '"public"."error"') == 0
    assert pg_count(installed["sender"], '"public"."sfbridge_retry"') == 0
    assert status(installed)["counters"]["delivered"] == 3000


def test_poison_unroutable_expired_and_local_messages_end_where_described(
    installed: dict[str, Any], tmp_path: Path
) -> None:
    sender = installed["sender"]
    pg_create_queue(sender, '"public"."Local.Queue"')
    with pg_connect(sender) as connection:
        pg_nsb_send(connection, FORWARD, "this is not json", b"poison-1")
        pg_nsb_send(connection, FORWARD, '{"NServiceBus.MessageId":"x","Count":1}', b"poison-2")
        pg_nsb_send(connection, FORWARD, nsb_message_headers(None), b"no-header")
        unroutable = nsb_message_headers('"Samples.Reciever"')
        unroutable["$.store-and-forward.destination"] = '"Nowhere.Queue"'
        pg_nsb_send(connection, FORWARD, unroutable, b"unroutable")
        pg_nsb_send(connection, FORWARD, nsb_message_headers(RECEIVER), b"expired", ttbr_ms=1)
        local = nsb_message_headers('"Local.Queue"')
        pg_nsb_send(connection, FORWARD, local, b"local")
        good = nsb_message_headers(RECEIVER)
        pg_nsb_send(connection, FORWARD, good, b"good")
        connection.commit()
    poison_rows = {
        bytes(body): (row_id, headers)
        for row_id, headers, body in pg_rows(sender, f"SELECT id, headers, body FROM {FORWARD}")
        if bytes(body).startswith(b"poison")
    }
    expired = f"SELECT count(*) FROM {FORWARD} WHERE expires <= now() AT TIME ZONE 'UTC'"
    wait_until(lambda: pg_rows(sender, expired) == [(1,)], 10, "the 1 ms message to expire")

    with DaemonProcess(installed["config"], tmp_path / "daemon.log", installed["env"]) as daemon:
        wait_until(lambda: pg_count(sender, FORWARD) == 0, 30, "the forwarding queue to drain")
        assert daemon.process.poll() is None, "bad messages must not take the daemon down"
        assert daemon.stop() == 0

    errors = pg_rows(sender, 'SELECT id, headers, body, expires FROM "public"."error" ORDER BY seq')
    by_body = {bytes(body): (row_id, headers, expires) for row_id, headers, body, expires in errors}
    assert set(by_body) == {b"poison-1", b"poison-2", b"no-header", b"unroutable"}
    for body, (row_id, headers) in poison_rows.items():
        # Poison rows move as they are (as the transport moves them): same Id, same header
        # text, Expires NULL.
        assert by_body[body] == (row_id, headers, None)

    no_header = json.loads(by_body[b"no-header"][1])
    assert no_header["NServiceBus.FailedQ"] == FORWARD
    assert "$.store-and-forward.destination" in no_header["NServiceBus.ExceptionInfo.Message"]
    assert no_header["$.sfbridge.failure-reason"] == "no-routing-header"
    assert len(no_header["NServiceBus.TimeOfFailure"]) == 28

    rejected = json.loads(by_body[b"unroutable"][1])
    assert rejected["$.sfbridge.failure-reason"] == "unroutable"
    assert (
        "no route matches destination table 'Nowhere.Queue'"
        in rejected["NServiceBus.ExceptionInfo.Message"]
    )
    # The routing header stays, so a retry from ServicePulse goes through the bridge again.
    assert rejected["$.store-and-forward.destination"] == '"Nowhere.Queue"'

    delivered = pg_nsb_receive_all(installed["receiver"], RECEIVER)
    assert [m["body"] for m in delivered] == [b"good"]
    local_received = pg_nsb_receive_all(sender, '"public"."Local.Queue"')
    assert [m["headers"]["NServiceBus.MessageId"] for m in local_received] == [
        local["NServiceBus.MessageId"]
    ]
    counters = status(installed)["counters"]
    assert counters["expired-dropped"] == 1
    assert counters["sent-to-error-queue"] == 4
    assert counters["delivered"] == 2


def test_error_queue_message_retried_from_servicepulse_goes_through_the_bridge_again(
    installed: dict[str, Any], tmp_path: Path
) -> None:
    """ServicePulse retries by sending the failed message back to NServiceBus.FailedQ."""
    sender = installed["sender"]
    config = bridge_config(
        sender, installed["receiver"], retries={"delay": "200ms", "max_attempts": 2}
    )
    write_config(installed["config"], config)
    headers = nsb_message_headers('"Samples.ReceiverLater"')
    with pg_connect(sender) as connection:
        pg_nsb_send(connection, FORWARD, headers, b"later")
        connection.commit()
    with DaemonProcess(installed["config"], tmp_path / "d1.log", installed["env"]) as daemon:
        wait_until(lambda: pg_count(sender, '"public"."error"') == 1, 30, "the error queue")
        assert daemon.stop() == 0
    failed = json.loads(pg_rows(sender, 'SELECT headers FROM "public"."error"')[0][0])
    assert failed["$.sfbridge.failure-reason"] == "missing-queue"
    assert failed["$.sfbridge.attempts"] == "2"
    assert "does not exist in database 'receiver'" in failed["NServiceBus.ExceptionInfo.Message"]

    pg_create_queue(installed["receiver"], '"public"."Samples.ReceiverLater"')
    with pg_connect(sender) as connection:  # what a ServicePulse retry does
        connection.execute('DELETE FROM "public"."error"')
        pg_nsb_send(connection, failed["NServiceBus.FailedQ"], failed, b"later")
        connection.commit()
    with DaemonProcess(installed["config"], tmp_path / "d2.log", installed["env"]) as daemon:
        wait_until(
            lambda: pg_count(installed["receiver"], '"public"."Samples.ReceiverLater"') == 1,
            30,
            "the retried message",
        )
        assert daemon.stop() == 0
    [message] = pg_nsb_receive_all(installed["receiver"], '"public"."Samples.ReceiverLater"')
    assert message["headers"]["NServiceBus.MessageId"] == headers["NServiceBus.MessageId"]


def test_a_killed_daemon_loses_and_duplicates_nothing(
    installed: dict[str, Any], tmp_path: Path
) -> None:
    sender, receiver = installed["sender"], installed["receiver"]
    ids = set()
    with pg_connect(sender) as connection:
        for _ in range(4000):
            headers = nsb_message_headers(RECEIVER)
            ids.add(headers["NServiceBus.MessageId"])
            pg_nsb_send(connection, FORWARD, headers, os.urandom(512))
        connection.commit()
    for round_number in range(3):
        with DaemonProcess(
            installed["config"], tmp_path / f"k{round_number}.log", installed["env"]
        ) as daemon:
            target = 800 * (round_number + 1)
            wait_until(lambda: pg_count(receiver, RECEIVER) >= target, 60, "progress")  # noqa: B023
            daemon.kill()  # SIGKILL mid-stream: no chance to finish anything
    with DaemonProcess(installed["config"], tmp_path / "final.log", installed["env"]) as daemon:
        wait_until(lambda: pg_count(sender, FORWARD) == 0, 60, "the queue to drain")
        assert daemon.stop() == 0
    received = Counter(
        m["headers"]["NServiceBus.MessageId"] for m in pg_nsb_receive_all(receiver, RECEIVER)
    )
    assert set(received) == ids
    assert max(received.values()) == 1


def test_check_reports_missing_tables_and_unreachable_databases(
    databases: tuple[str, str], tmp_path: Path
) -> None:
    sender, receiver = databases
    config_path = write_config(tmp_path / "c.yaml", bridge_config(sender, receiver))
    result = sfbridge(
        "-c",
        str(config_path),
        "check",
        env={
            "RECEIVER_ODBC": "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=1;Uid=postgres;"
            "Pwd=TopSecret42;Database=x;"
        },
    )
    assert result.returncode == 1
    assert "PROBLEM  database 'receiver'" in result.stdout
    assert "forwarder 'sender' queue: " in result.stdout and "is missing" in result.stdout
    assert "TopSecret42" not in result.stdout + result.stderr
