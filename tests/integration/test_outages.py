"""Failure paths: the destination database dies and comes back; the bridge dies between commits."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import (
    CommitFailsOnce,
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

from bridge.config import load_config
from bridge.connections import Connections
from bridge.drivers import ConnectionLost
from bridge.forwarding import BatchForwarder

pytestmark = pytest.mark.integration

FORWARD = '"public"."Samples.Sender.Forward"'
RECEIVER = '"public"."Samples.Receiver"'


def make_setup(tmp_path: Path, sender: str, receiver: str) -> dict[str, Any]:
    config = {
        "databases": {
            "sender": {"dialect": "postgresql", "connection": sender},
            "receiver": {"dialect": "postgresql", "connection": receiver, "connect_timeout": "2s"},
        },
        "forwarders": [
            {"name": "sender", "database": "sender", "queue": FORWARD, "peek_interval": "200ms"}
        ],
        "routes": [{"match": "*", "database": "receiver"}],
        "retries": {"delay": "1s", "max_attempts": 1000},
    }
    path = write_config(tmp_path / "sfbridge.yaml", config)
    result = sfbridge("-c", str(path), "install")
    assert result.returncode == 0, result.stdout + result.stderr
    pg_create_queue(receiver, RECEIVER)
    return {"config": path, "sender": sender, "receiver": receiver}


def send(sender: str, count: int) -> set[str]:
    ids = set()
    with pg_connect(sender) as connection:
        for _ in range(count):
            headers = nsb_message_headers(RECEIVER)
            ids.add(str(headers["NServiceBus.MessageId"]))
            pg_nsb_send(connection, FORWARD, headers, b"x" * 300)
        connection.commit()
    return ids


def test_killing_the_destination_database_and_bringing_it_back_loses_nothing(
    tmp_path: Path, new_pg_database: Any, private_postgres: Any
) -> None:
    sender = new_pg_database()
    import pyodbc

    with pyodbc.connect(private_postgres.connection_string(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE receiver")
    receiver = private_postgres.connection_string("receiver")
    setup = make_setup(tmp_path, sender, receiver)

    with DaemonProcess(setup["config"], tmp_path / "daemon.log") as daemon:
        before = send(sender, 200)
        wait_until(lambda: pg_count(receiver, RECEIVER) == 200, 30, "delivery while up")

        private_postgres.kill()
        during = send(sender, 500)

        def waiting_for_retry() -> int:
            result = sfbridge("-c", str(setup["config"]), "status", "--json")
            return int(json.loads(result.stdout)["forwarders"][0].get("waiting_for_retry", 0))

        wait_until(lambda: waiting_for_retry() == 500, 60, "messages to wait in retry storage")
        text = sfbridge("-c", str(setup["config"]), "status").stdout
        assert "waiting for retry  500" in text and "last error:" in text
        assert pg_count(sender, '"public"."error"') == 0

        private_postgres.start()
        wait_until(lambda: pg_count(receiver, RECEIVER) >= 700, 60, "delivery after the restart")
        time.sleep(1.5)
        assert daemon.stop() == 0, daemon.output()

    received = Counter(
        m["headers"]["NServiceBus.MessageId"] for m in pg_nsb_receive_all(receiver, RECEIVER)
    )
    assert set(received) == before | during
    assert max(received.values()) == 1
    assert pg_count(sender, FORWARD) == 0
    assert pg_count(sender, '"public"."sfbridge_retry"') == 0
    assert pg_count(sender, '"public"."error"') == 0


def test_a_crash_between_the_destination_and_source_commits_delivers_once(
    tmp_path: Path, new_pg_database: Any
) -> None:
    sender, receiver = new_pg_database(), new_pg_database()
    setup = make_setup(tmp_path, sender, receiver)
    ids = send(sender, 50)
    config, _ = load_config(setup["config"])
    connections = Connections(config.databases)
    forwarder = BatchForwarder(config, config.forwarders[0], connections)
    source = CommitFailsOnce(connections.get("sender"))
    connections._open["sender"] = source  # the crash is injected; the databases are real

    with pytest.raises(ConnectionLost):
        forwarder.forward_batch()
    # The destination committed, the source did not: every message is in both places now.
    assert pg_count(receiver, RECEIVER) == 50
    assert pg_count(sender, FORWARD) == 50

    report = forwarder.forward_batch()  # the restarted bridge picks the rows up again
    assert report.counts == Counter({"duplicates-skipped": 50})
    assert pg_count(sender, FORWARD) == 0
    received = Counter(
        m["headers"]["NServiceBus.MessageId"] for m in pg_nsb_receive_all(receiver, RECEIVER)
    )
    assert set(received) == ids and max(received.values()) == 1
    connections.close()


def test_a_dropped_destination_connection_is_retried_at_once_without_costing_an_attempt(
    tmp_path: Path, new_pg_database: Any, postgres: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="bridge.deliver")
    sender, receiver = new_pg_database(), new_pg_database()
    setup = make_setup(tmp_path, sender, receiver)
    config, _ = load_config(setup["config"])
    connections = Connections(config.databases)
    forwarder = BatchForwarder(config, config.forwarders[0], connections)
    send(sender, 10)
    assert forwarder.forward_batch().counts == Counter({"delivered": 10})

    # The server drops the bridge's open destination connection (a failover, a restart).
    receiver_name = receiver.split("Database=")[1].rstrip(";")
    with postgres.admin() as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = ? AND pid <> pg_backend_pid()",
            receiver_name,
        )
    send(sender, 10)
    assert forwarder.forward_batch().counts == Counter({"delivered": 10})
    assert pg_count(receiver, RECEIVER) == 20
    assert "transient error on database 'receiver'; retrying at once" in caplog.text
    connections.close()
