"""SQLite, the embedded default: edge host buffering to PostgreSQL, and the demo."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import SAMPLES_RECEIVER as RECEIVER
from support import (
    DaemonProcess,
    nsb_message_headers,
    pg_count,
    pg_create_queue,
    pg_nsb_receive_all,
    sfbridge,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration

# The SQL Server transport's send, in SQLite's syntax: SQLite queues use the
# SQL Server queue shape.
NSB_SQLSERVER_SHAPED_SEND = (
    'INSERT INTO "{0}" (Id, Recoverable, Expires, Headers, Body) VALUES (?, 1, ?, ?, ?)'
)


def test_edge_sqlite_queue_forwards_to_postgresql_exactly_once(
    tmp_path: Path, new_pg_database: Any
) -> None:
    receiver = new_pg_database()
    edge = tmp_path / "edge.db"
    config = write_config(
        tmp_path / "edge.yaml",
        {
            "databases": {
                "edge": {"dialect": "sqlite", "path": str(edge)},
                "central": {"dialect": "postgresql", "connection": receiver},
            },
            "forwarders": [
                {
                    "name": "edge",
                    "database": "edge",
                    "queue": "Edge.Forward",
                    "peek_interval": "200ms",
                }
            ],
            "routes": [{"match": "Samples.*", "database": "central"}],
        },
    )
    assert sfbridge("-c", str(config), "install").returncode == 0
    pg_create_queue(receiver, RECEIVER)
    sent = {}
    with sqlite3.connect(edge) as connection:
        for number in range(500):
            headers = nsb_message_headers(
                "Samples.Receiver@[dbo]@[nsb]" if number % 2 else "Samples.Receiver"
            )
            sent[headers["NServiceBus.MessageId"]] = (headers, bytes([number % 256]) * number)
            connection.execute(
                NSB_SQLSERVER_SHAPED_SEND.format("Edge.Forward"),
                (
                    str(uuid.uuid4()),
                    None,
                    json.dumps(headers),
                    sent[headers["NServiceBus.MessageId"]][1],
                ),
            )
    with DaemonProcess(config, tmp_path / "daemon.log") as daemon:
        wait_until(lambda: pg_count(receiver, RECEIVER) == 500, 60, "delivery to PostgreSQL")
        assert daemon.stop() == 0, daemon.output()
    received = pg_nsb_receive_all(receiver, RECEIVER)
    ids = Counter(m["headers"]["NServiceBus.MessageId"] for m in received)
    assert set(ids) == set(sent) and max(ids.values()) == 1
    for message in received:
        headers, body = sent[message["headers"]["NServiceBus.MessageId"]]
        assert message["body"] == body
        assert "$.store-and-forward.destination" not in message["headers"]
    with sqlite3.connect(edge) as connection:
        assert connection.execute('SELECT count(*) FROM "Edge.Forward"').fetchone()[0] == 0


def test_demo_replays_the_whole_sample_replies_included_exactly_once(tmp_path: Path) -> None:
    started = time.monotonic()
    result = sfbridge("demo", "--dir", str(tmp_path / "demo"), timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    assert time.monotonic() - started < 60
    assert "waiting: 5 message(s), 0 attempt(s) spent (an outage spends none)" in result.stdout
    assert (
        "7 orders sent, 7 received, 7 replies: every order and every reply exactly once"
        in result.stdout
    )
    assert "arrived without store-and-forward headers" in result.stdout
    status = sfbridge("-c", str(tmp_path / "demo" / "sfbridge.yaml"), "status", "--json")
    orders, replies = json.loads(status.stdout)["forwarders"]
    assert orders["counters"]["delivered"] == 7 and orders["counters"]["duplicates-skipped"] == 1
    assert replies["proxy_for"] == {"database": "sender", "queue": "Samples.StoreAndForward.Sender"}
    assert replies["counters"]["delivered"] == 7


def test_the_demo_runs_without_pyodbc_or_unixodbc(tmp_path: Path) -> None:
    # `sys.modules['pyodbc'] = None` makes any import of pyodbc fail, as on a machine
    # without unixODBC: the SQLite path must never import it.
    script = (
        "import sys; sys.modules['pyodbc'] = None\n"
        "from bridge.commands.cli import main\n"
        f"raise SystemExit(main(['demo', '--dir', {str(tmp_path / 'demo')!r}]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=90
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every order and every reply exactly once" in result.stdout
