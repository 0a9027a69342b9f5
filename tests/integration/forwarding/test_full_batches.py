"""A batch cut short by its byte bound reports `full` whatever the headers' encoding.

The claim weighs a row in the database's bytes (PostgreSQL `octet_length`, SQL Server
`DATALENGTH` of nvarchar: two bytes a character); `BatchForwarder` re-weighs the claimed rows
with `len(headers_text)`, in characters. With non-ASCII headers the Python sum stays under
`batch_bytes` although the database cut the batch, so `full` is False: the Spark drain ends
its partition with rows left in its range, and the daemon waits a peek interval per batch.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from support import FORWARD, pg_connect, pg_count, pg_nsb_send, write_config

from bridge.commands.install import run_install
from bridge.config import load_config
from bridge.connections import Connections
from bridge.forwarding.spine import BatchForwarder

pytestmark = pytest.mark.integration

KIB = 1024


@pytest.fixture
def config(tmp_path: Path, new_pg_database: Any) -> Any:
    path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "local": {"dialect": "postgresql", "connection": new_pg_database()},
                "receiver": {"dialect": "sqlite", "path": "r.db"},
            },
            "forwarders": [{"name": "f", "database": "local", "queue": "forward"}],
            "routes": [{"match": "*", "database": "receiver"}],
        },
    )
    loaded, _ = load_config(path)
    run_install(loaded)
    return loaded


def send_accented(config: Any, count: int) -> None:
    """Messages with no routing header (each goes to the error queue) whose headers weigh
    about 30,000 bytes in UTF-8 and 15,000 characters."""
    with pg_connect(config.databases["local"].connection) as connection:
        for _ in range(count):
            pg_nsb_send(
                connection, FORWARD, json.dumps({"note": "é" * 15000}, ensure_ascii=False), b""
            )
        connection.commit()


@pytest.mark.parametrize("drain", [False, True], ids=["daemon", "spark-drain-range"])
def test_a_batch_cut_by_bytes_of_non_ascii_headers_reports_full(config: Any, drain: bool) -> None:
    send_accented(config, 7)
    forwarder = dataclasses.replace(config.forwarders[0], batch_bytes=64 * KIB)
    connections = Connections(config.databases)
    try:
        batches = BatchForwarder(config, forwarder, connections)
        seq_range = (0, 10**9) if drain else None
        first = batches.forward_batch(seq_range=seq_range)
    finally:
        connections.close()
    # 30,000-byte rows under a 64 KiB bound: three per batch, four left behind.
    assert first.claimed == 3
    assert pg_count(config.databases["local"].connection, FORWARD) == 4
    assert first.full, "cut by its byte bound with rows left, yet reported as not full"


def test_a_full_claim_is_told_before_its_batch_is_delivered(config: Any) -> None:
    """`on_full` runs once per full claim, while the batch's rows are still claimed and not
    yet delivered (a daemon lets a second worker join then); a short claim never calls it."""
    send_accented(config, 5)
    forwarder = dataclasses.replace(config.forwarders[0], batch_size=3)
    connections = Connections(config.databases)
    seen: list[tuple[int, int]] = []
    local = config.databases["local"].connection

    def on_full() -> None:
        # Another session still sees the claimed rows (uncommitted delete) and no settled one.
        seen.append((pg_count(local, FORWARD), pg_count(local, "error")))

    try:
        batches = BatchForwarder(config, forwarder, connections)
        first = batches.forward_batch(on_full=on_full)
        second = batches.forward_batch(on_full=on_full)
    finally:
        connections.close()
    assert (first.claimed, first.full, second.claimed, second.full) == (3, True, 2, False)
    assert seen == [(5, 0)], "called for the full claim only, before the batch was settled"
    assert pg_count(local, "error") == 5
