"""`sfbridge retries` and the per-forwarder error counts on SQLite files, through the real CLI:
the forwarder (run in-process, as a daemon would) parks messages in retry storage because the
receiver's queue is missing; `retries list / now / fail` and `status` then work as on
PostgreSQL, with SQLite's own statements."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from support import SqliteEndpoint, nsb_message_headers, sfbridge, write_config

from bridge.config import load_config
from bridge.connections import Connections
from bridge.forwarding.spine import BatchForwarder
from bridge.messages import Source

pytestmark = pytest.mark.integration

FORWARD = "Samples.Sender.Forward"
BILLING = "Samples.Billing.Forward"
SOURCES: tuple[Source, ...] = ("queue", "retry")


def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = sfbridge("-c", str(config), *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _forward_all(config: Path) -> Counter[str]:
    loaded, _ = load_config(config)
    connections = Connections(loaded.databases)
    counts: Counter[str] = Counter()
    try:
        for forwarder in loaded.forwarders:
            batches = BatchForwarder(loaded, forwarder, connections)
            for source in SOURCES:
                while (report := batches.forward_batch(source)).claimed:
                    counts += report.counts
    finally:
        connections.close()
    return counts


def test_retries_and_error_counts_on_sqlite(tmp_path: Path) -> None:
    sender = SqliteEndpoint(tmp_path / "sender.db")
    receiver = SqliteEndpoint(tmp_path / "receiver.db")
    config = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {"sender": sender.database_entry(), "receiver": receiver.database_entry()},
            "forwarders": [
                {"name": "orders", "database": "sender", "queue": FORWARD},
                {"name": "billing", "database": "sender", "queue": BILLING},
            ],
            "routes": [{"match": "Samples.Receiver", "database": "receiver"}],
            "retries": {"delay": "1h", "max_delay": "1h"},
        },
    )
    _cli(config, "install")
    waiting = [nsb_message_headers("Samples.Receiver") for _ in range(4)]
    sender.send(FORWARD, [(headers, b"{}", None) for headers in waiting])
    sender.send(BILLING, [(nsb_message_headers("Samples.Unknown"), b"{}", None)])
    assert _forward_all(config) == Counter({"retries-scheduled": 4, "sent-to-error-queue": 1})
    ids = {str(headers["NServiceBus.MessageId"]) for headers in waiting}

    listed = json.loads(_cli(config, "retries", "list", "--json").stdout)
    assert {entry["message_id"] for entry in listed} == ids
    assert {entry["destination_database"] for entry in listed} == {"receiver"}
    one = sorted(ids)[0]
    assert "made 1 message(s) due now" in _cli(config, "retries", "now", "--id", one).stdout
    [due] = [entry for entry in json.loads(_cli(config, "retries", "list", "--json").stdout)
             if entry["message_id"] == one]  # fmt: skip
    assert due["next_attempt_at"] == due["first_failure_at"]
    receiver.create_queue("Samples.Receiver")  # the cause, fixed
    assert _forward_all(config) == Counter({"delivered": 1})
    assert [
        m["headers"]["NServiceBus.MessageId"] for m in receiver.receive_all("Samples.Receiver")
    ] == [one]

    failed = _cli(config, "retries", "fail", "--yes", "--destination", "receiver")
    assert "moved 3 message(s) to their forwarders' error queues" in failed.stdout
    with sqlite3.connect(sender.path) as connection:
        assert connection.execute("SELECT count(*) FROM sfbridge_retry").fetchone()[0] == 0
        rows = [json.loads(h) for (h,) in connection.execute('SELECT Headers FROM "error"')]
    by_reason = Counter(headers["$.sfbridge.failure-reason"] for headers in rows)
    assert by_reason == Counter({"failed-by-operator": 3, "unroutable": 1})

    shown = sfbridge("-c", str(config), "status", "--json")
    assert shown.returncode == 1, shown.stderr  # no daemon runs here: status says so
    status = json.loads(shown.stdout)
    assert {f["forwarder"]: f["in_error"] for f in status["forwarders"]} == {
        "orders": 3,
        "billing": 1,
    }
    [queue] = status["error_queues"]
    assert queue["forwarders"] == {"billing": 1, "orders": 3} and queue["other"] == 0
