"""`sfbridge pause` / `resume` against a running daemon, as an operator plans maintenance."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
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

FORWARD = '"public"."Samples.Sender.Forward"'
RECEIVER = '"public"."Samples.Receiver"'
RETRY = '"public"."sfbridge_retry"'


def world(tmp_path: Path, new_pg_database: Any) -> dict[str, Any]:
    sender, receiver = new_pg_database(), new_pg_database()
    config = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": sender},
                "receiver": {"dialect": "postgresql", "connection": receiver},
            },
            "forwarders": [
                {"name": "orders", "database": "sender", "queue": FORWARD, "peek_interval": "200ms"}
            ],
            "routes": [{"match": "*", "database": "receiver"}],
            "retries": {"delay": "1s", "max_attempts": 2},
        },
    )
    assert sfbridge("-c", str(config), "install").returncode == 0
    pg_create_queue(receiver, RECEIVER)
    return {"config": config, "sender": sender, "receiver": receiver}


def send(sender: str, count: int) -> set[str]:
    ids = set()
    with pg_connect(sender) as connection:
        for _ in range(count):
            headers = nsb_message_headers(RECEIVER)
            ids.add(str(headers["NServiceBus.MessageId"]))
            pg_nsb_send(connection, FORWARD, headers, b"{}")
        connection.commit()
    return ids


def status(config: Path) -> dict[str, Any]:
    return json.loads(sfbridge("-c", str(config), "status", "--json").stdout)["forwarders"][0]


def received(receiver: str) -> Counter[str]:
    return Counter(
        m["headers"]["NServiceBus.MessageId"] for m in pg_nsb_receive_all(receiver, RECEIVER)
    )


def test_a_paused_forwarder_holds_its_queue_and_delivers_it_after_resume(
    tmp_path: Path, new_pg_database: Any
) -> None:
    w = world(tmp_path, new_pg_database)
    config = str(w["config"])
    paused = sfbridge("-c", config, "pause", "orders", "--reason", "receiver upgrade")
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.startswith("paused forwarder 'orders': it claims nothing")
    with DaemonProcess(w["config"], tmp_path / "daemon.log") as daemon:
        ids = send(w["sender"], 25)
        time.sleep(2)  # ten peek intervals: a running daemon had long delivered them
        assert pg_count(w["sender"], FORWARD) == 25
        assert pg_count(w["receiver"], RECEIVER) == 0
        [pause] = status(w["config"])["paused"]
        assert pause["destination_database"] is None and pause["reason"] == "receiver upgrade"
        text = sfbridge("-c", config, "status").stdout
        assert "PAUSED             the whole forwarder: claims nothing" in text

        resumed = sfbridge("-c", config, "resume", "orders")
        assert resumed.stdout.startswith("resumed forwarder 'orders'"), resumed.stderr
        wait_until(lambda: pg_count(w["receiver"], RECEIVER) == 25, 30, "delivery after resume")
        assert daemon.stop() == 0, daemon.output()
    assert received(w["receiver"]) == Counter(ids)
    assert status(w["config"])["paused"] == []
    again = sfbridge("-c", config, "resume", "orders")
    assert again.stdout.startswith("forwarder 'orders' was not paused")


def test_pausing_a_running_daemon_holds_what_is_sent_next_and_resume_delivers_it(
    tmp_path: Path, new_pg_database: Any
) -> None:
    w = world(tmp_path, new_pg_database)
    config = str(w["config"])
    with DaemonProcess(w["config"], tmp_path / "daemon.log") as daemon:
        before = send(w["sender"], 10)
        wait_until(lambda: pg_count(w["receiver"], RECEIVER) == 10, 30, "delivery before")
        assert sfbridge("-c", config, "pause", "orders").returncode == 0
        time.sleep(1.5)  # every daemon obeys within a second
        during = send(w["sender"], 15)
        time.sleep(2)
        assert pg_count(w["sender"], FORWARD) == 15
        assert pg_count(w["receiver"], RECEIVER) == 10
        assert sfbridge("-c", config, "resume", "orders").returncode == 0
        wait_until(lambda: pg_count(w["receiver"], RECEIVER) == 25, 30, "delivery after resume")
        assert daemon.stop() == 0, daemon.output()
    assert received(w["receiver"]) == Counter(before | during)


def test_a_paused_destination_waits_without_spending_attempts(
    tmp_path: Path, new_pg_database: Any
) -> None:
    w = world(tmp_path, new_pg_database)
    config = str(w["config"])
    with DaemonProcess(w["config"], tmp_path / "daemon.log") as daemon:
        first = send(w["sender"], 5)
        wait_until(lambda: pg_count(w["receiver"], RECEIVER) == 5, 30, "delivery before")
        assert (
            sfbridge("-c", config, "pause", "orders", "--destination", "receiver").returncode == 0
        )
        time.sleep(0.5)  # more than one peek interval: every worker has read the pause
        held = send(w["sender"], 20)
        wait_until(lambda: pg_count(w["sender"], RETRY) == 20, 30, "messages to wait")
        # max_attempts is 2 and the retry delay 1 s: four delays would have used them all up.
        time.sleep(4)
        rows = pg_rows(w["sender"], f"SELECT attempts, last_error FROM {RETRY}")
        assert len(rows) == 20 and {row[0] for row in rows} == {0}
        assert "database 'receiver' is paused since" in rows[0][1]
        assert pg_count(w["receiver"], RECEIVER) == 5
        assert pg_count(w["sender"], '"public"."error"') == 0

        assert (
            sfbridge("-c", config, "resume", "orders", "--destination", "receiver").returncode == 0
        )
        wait_until(lambda: pg_count(w["receiver"], RECEIVER) == 25, 30, "delivery after resume")
        assert daemon.stop() == 0, daemon.output()
    assert received(w["receiver"]) == Counter(first | held)
    assert pg_count(w["sender"], RETRY) == 0


def test_pause_names_what_it_does_not_know(tmp_path: Path, new_pg_database: Any) -> None:
    w = world(tmp_path, new_pg_database)
    wrong = sfbridge("-c", str(w["config"]), "pause", "order")
    assert wrong.returncode == 2
    assert wrong.stderr == "sfbridge pause: no forwarder named 'order' (did you mean 'orders'?)\n"
    wrong = sfbridge("-c", str(w["config"]), "pause", "orders", "--destination", "reciever")
    assert wrong.returncode == 2
    assert "no database named 'reciever' (did you mean 'receiver'?)" in wrong.stderr
