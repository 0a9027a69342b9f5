"""Workers racing on one queue with byte-bounded claims (rows locked past the bound
are held until the claimer commits, then taken by whoever comes next): tiny and large
messages mixed, every message ends in the destination exactly once and none is left."""

from __future__ import annotations

import dataclasses
import json
import threading
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
    pg_nsb_send,
    pg_rows,
    sfbridge,
    write_config,
)
from support import SAMPLES_RECEIVER as RECEIVER

from bridge.config import load_config
from bridge.connections import Connections
from bridge.forwarding.spine import BatchForwarder

pytestmark = pytest.mark.integration

KIB = 1024


def test_four_workers_with_a_small_byte_bound_deliver_a_mixed_queue_exactly_once(
    tmp_path: Path, new_pg_database: Any
) -> None:
    sender, receiver = new_pg_database(), new_pg_database()
    path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": sender},
                "receiver": {"dialect": "postgresql", "connection": receiver},
            },
            "forwarders": [{"name": "s", "database": "sender", "queue": "forward"}],
            "routes": [{"match": "*", "database": "receiver"}],
        },
    )
    assert sfbridge("-c", str(path), "install").returncode == 0
    pg_create_queue(receiver, RECEIVER)
    config, _ = load_config(path)
    forwarder_config = dataclasses.replace(config.forwarders[0], batch_bytes=64 * KIB)

    sizes = [10, 10, 200 * KIB, 10, 70 * KIB, 10, 10, 10, 300 * KIB, 10] * 30
    ids = []
    with pg_connect(sender) as connection:
        for size in sizes:
            headers = nsb_message_headers(RECEIVER)
            ids.append(headers["NServiceBus.MessageId"])
            pg_nsb_send(connection, FORWARD, headers, b"b" * size)
        connection.commit()

    failures: list[BaseException] = []

    def work(slot: int) -> None:
        connections = Connections(config.databases)
        try:
            batches = BatchForwarder(config, forwarder_config, connections, slot=slot)
            idle = 0
            while idle < 3:
                report = batches.forward_batch()
                idle = 0 if report.claimed else idle + 1
        except BaseException as error:
            failures.append(error)
        finally:
            connections.close()

    threads = [threading.Thread(target=work, args=(slot,)) for slot in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    assert pg_count(sender, FORWARD) == 0
    arrived = Counter(
        json.loads(h)["NServiceBus.MessageId"]
        for (h,) in pg_rows(receiver, f"SELECT headers FROM {RECEIVER}")
    )
    assert arrived == Counter(ids)
