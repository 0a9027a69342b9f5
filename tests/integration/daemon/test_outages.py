"""Failure paths: the destination database dies and comes back; the bridge dies between commits."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import RETRY_TABLE as RETRY
from support import (
    SAMPLES_RECEIVER,
    SENDER_FORWARD,
    CommitFailsOnce,
    DaemonProcess,
    install_pg_pair,
    nsb_message_headers,
    pg_connect,
    pg_count,
    pg_nsb_receive_all,
    pg_nsb_send,
    pg_rows,
    send_to_receiver,
    sfbridge,
    wait_for_reads,
    wait_until,
    write_config,
)

from bridge.config import load_config
from bridge.connections import Connections
from bridge.exceptions import ConnectionLost
from bridge.forwarding.spine import BatchForwarder

pytestmark = pytest.mark.integration

FORWARD, RECEIVER = SENDER_FORWARD, SAMPLES_RECEIVER


def make_setup(tmp_path: Path, sender: str, receiver: str) -> dict[str, Any]:
    return install_pg_pair(tmp_path, sender, receiver, peek_interval="200ms")


def send(sender: str, count: int) -> set[str]:
    return send_to_receiver(sender, count, b"x" * 300)


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
        # SIGTERM lets the batches in flight finish: a duplicate would be there once it exits.
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
    connections._open[("sender", "")] = source  # the crash is injected; the databases are real

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
    caplog.set_level("INFO", logger="bridge.forwarding.deliver")
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


@pytest.mark.parametrize("during_outage", ["wait", "count"])
def test_an_outage_longer_than_the_retry_patience_spends_no_attempts_when_told_to_wait(
    tmp_path: Path, new_pg_database: Any, private_postgres: Any, during_outage: str
) -> None:
    # Patience: 2 attempts 1 s apart. The outage lasts several times that.
    sender = new_pg_database()
    import pyodbc

    with pyodbc.connect(private_postgres.connection_string(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE receiver")
    receiver = private_postgres.connection_string("receiver")
    setup = make_setup(tmp_path, sender, receiver)
    config = load_config_yaml(setup["config"])
    config["retries"] = {"delay": "1s", "max_attempts": 2, "during_outage": during_outage}
    write_config(setup["config"], config)

    with DaemonProcess(setup["config"], tmp_path / "daemon.log") as daemon:
        private_postgres.kill()
        ids = send(sender, 100)
        if during_outage == "count":
            # The literal policy: every message spent its attempts and was given up on.
            wait_until(lambda: pg_count(sender, '"public"."error"') == 100, 30, "error queue")
            private_postgres.start()
            assert daemon.stop() == 0, daemon.output()
            return
        wait_until(lambda: pg_count(sender, RETRY) == 100, 30, "the messages to wait")
        # The workers look at retry storage once a second each: after eight more looks (four
        # retry delays), the two attempts would have been spent had the outage counted.
        wait_for_reads(sender, "sfbridge_retry", 8)
        assert pg_count(sender, '"public"."error"') == 0
        assert pg_rows(sender, 'SELECT count(*), max(attempts) FROM "public"."sfbridge_retry"') == [
            (100, 0)
        ]
        [entry] = json.loads(sfbridge("-c", str(setup["config"]), "status", "--json").stdout)[
            "destinations"
        ]
        assert entry["database"] == "receiver" and entry["state"] == "unreachable"
        assert entry["waiting"] == 100 and entry["next_probe_at"] and entry["since"]
        assert "cannot connect" in entry["last_error"]
        private_postgres.start()
        wait_until(lambda: pg_count(receiver, RECEIVER) == 100, 60, "delivery after the outage")
        assert daemon.stop() == 0, daemon.output()
    received = Counter(
        m["headers"]["NServiceBus.MessageId"] for m in pg_nsb_receive_all(receiver, RECEIVER)
    )
    assert set(received) == ids and max(received.values()) == 1
    assert pg_count(sender, '"public"."sfbridge_retry"') == 0
    # Said once when it began and once when it ended, not per batch or per probe.
    log = daemon.output()
    assert log.count("cannot be reached") == 1, log
    assert log.count("is usable again") == 1, log


def test_waiting_out_an_outage_ends_at_max_wait_and_expired_messages_are_dropped_meanwhile(
    tmp_path: Path, new_pg_database: Any, private_postgres: Any
) -> None:
    sender = new_pg_database()
    import pyodbc

    with pyodbc.connect(private_postgres.connection_string(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE receiver")
    setup = make_setup(tmp_path, sender, private_postgres.connection_string("receiver"))
    config = load_config_yaml(setup["config"])
    config["retries"] = {"delay": "1s", "during_outage": "wait", "max_wait": "4s"}
    write_config(setup["config"], config)

    with DaemonProcess(setup["config"], tmp_path / "daemon.log") as daemon:
        private_postgres.kill()
        waiting = send(sender, 5)
        with pg_connect(sender) as connection:
            pg_nsb_send(connection, FORWARD, nsb_message_headers(RECEIVER), b"soon", 2000)
            connection.commit()
        wait_until(lambda: pg_count(sender, '"public"."error"') == 5, 30, "max_wait to pass")
        wait_until(
            lambda: pg_count(sender, '"public"."sfbridge_retry"') == 0, 10, "the expired one"
        )
        assert daemon.stop() == 0, daemon.output()
    rows = pg_rows(sender, 'SELECT headers FROM "public"."error"')
    failed = [json.loads(headers) for (headers,) in rows]
    assert {h["NServiceBus.MessageId"] for h in failed} == waiting
    for headers in failed:
        assert headers["$.sfbridge.failure-reason"] == "outage-too-long"
        assert "retries.max_wait is 4s" in headers["NServiceBus.ExceptionInfo.Message"]
        assert "database 'receiver'" in headers["NServiceBus.ExceptionInfo.Message"]
    counters = json.loads(sfbridge("-c", str(setup["config"]), "status", "--json").stdout)
    assert counters["forwarders"][0]["counters"]["expired-dropped"] == 1


def test_a_retry_backlog_does_not_hold_up_new_messages(
    tmp_path: Path, new_pg_database: Any
) -> None:
    # What a database that comes back after a long outage finds: thousands of messages due in
    # retry storage, and new ones arriving. One worker must take turns between the two.
    sender, receiver = new_pg_database(), new_pg_database()
    setup = make_setup(tmp_path, sender, receiver)
    config = load_config_yaml(setup["config"])
    config["forwarders"][0].update(concurrency=1, batch_size=100)
    write_config(setup["config"], config)
    backlog = set()
    with pg_connect(sender) as connection:
        for _ in range(2000):
            headers = nsb_message_headers(RECEIVER)
            backlog.add(headers["NServiceBus.MessageId"])
            connection.execute(
                'INSERT INTO "public"."sfbridge_retry" (id, forwarder, destination, '
                "destination_database, expires, headers, body, attempts, first_failure_at, "
                "next_attempt_at, last_error) VALUES (gen_random_uuid(), 'sender', ?, "
                "'receiver', NULL, ?, 'x', 3, now() - interval '1 hour', "
                "now() - interval '1 minute', 'it was down')",
                RECEIVER,
                json.dumps(headers),
            )
        connection.commit()
    new = send(sender, 50)
    with DaemonProcess(setup["config"], tmp_path / "daemon.log") as daemon:
        wait_until(lambda: pg_count(receiver, RECEIVER) == 2050, 60, "everything delivered")
        assert daemon.stop() == 0, daemon.output()
    order = [m["headers"]["NServiceBus.MessageId"] for m in pg_nsb_receive_all(receiver, RECEIVER)]
    assert len(order) == len(set(order)) == 2050
    positions = [index for index, message_id in enumerate(order) if message_id in new]
    # Oldest first within the backlog; new messages within the first few batches, not last.
    assert max(positions) < 400, positions


def load_config_yaml(path: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(path.read_text())  # type: ignore[no-any-return]
