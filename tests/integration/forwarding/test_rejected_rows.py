"""One row the destination rejects inside a 1000-message batch (the psycopg `unnest`
array statement, or ODBC's chunked VALUES) fails that message alone; the other 999 arrive
exactly once, and the rejected one, once the DBA relents, arrives too (its ledger row was
rolled back with its failed attempt, so it is not taken for a duplicate)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import (
    FORWARD,
    nsb_message_headers,
    pg_connect,
    pg_create_queue,
    pg_nsb_send,
    pg_rows,
    sfbridge,
    write_config,
)

from bridge.config import load_config
from bridge.connections import Connections
from bridge.forwarding.spine import BatchForwarder

pytestmark = pytest.mark.integration


def build(tmp_path: Path, sender: str, receiver: str, driver: str) -> Any:
    path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": sender, "driver": driver},
                "receiver": {"dialect": "postgresql", "connection": receiver, "driver": driver},
            },
            "forwarders": [{"name": "s", "database": "sender", "queue": "forward"}],
            "routes": [
                {"match": "Local*", "database": "sender"},
                {"match": "*", "database": "receiver"},
            ],
        },
    )
    assert sfbridge("-c", str(path), "install").returncode == 0
    config, _ = load_config(path)
    return config


@pytest.mark.parametrize("driver", ["psycopg", "odbc"])
@pytest.mark.parametrize("prefix", ["", "Local"], ids=["remote", "local"])
def test_one_rejected_row_in_a_thousand_fails_alone_and_is_delivered_later(
    tmp_path: Path, new_pg_database: Any, driver: str, prefix: str
) -> None:
    sender, receiver = new_pg_database(), new_pg_database()
    config = build(tmp_path, sender, receiver, driver)
    destination_db = sender if prefix else receiver
    table = f'"public"."{prefix}Good"'
    pg_create_queue(destination_db, table)
    with pg_connect(destination_db) as connection:
        connection.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT small_bodies "
            "CHECK (body IS NULL OR octet_length(body) < 1000)"
        )
        connection.commit()
    ids = []
    with pg_connect(sender) as connection:
        for index in range(1000):
            headers = nsb_message_headers(f'"{prefix}Good"')
            ids.append(headers["NServiceBus.MessageId"])
            body = b"x" * 5000 if index == 637 else b"ok %d" % index
            pg_nsb_send(connection, FORWARD, headers, body)
        connection.commit()

    connections = Connections(config.databases)
    try:
        forwarder = BatchForwarder(config, config.forwarders[0], connections)
        report = forwarder.forward_batch()
        assert report.claimed == 1000
        assert report.counts == Counter({"delivered": 999, "retries-scheduled": 1})
        [(retried_id, last_error)] = pg_rows(
            sender, 'SELECT headers, last_error FROM "public"."sfbridge_retry"'
        )
        assert json.loads(retried_id)["NServiceBus.MessageId"] == ids[637]
        assert "small_bodies" in last_error

        with pg_connect(destination_db) as connection:
            connection.execute(f"ALTER TABLE {table} DROP CONSTRAINT small_bodies")
            connection.commit()
        with pg_connect(sender) as connection:  # make the retry due now
            connection.execute(
                'UPDATE "public"."sfbridge_retry" SET next_attempt_at = \'2000-01-01\''
            )
            connection.commit()
        assert forwarder.forward_batch("retry").counts == Counter({"delivered": 1})
    finally:
        connections.close()

    arrived = Counter(
        json.loads(h)["NServiceBus.MessageId"]
        for (h,) in pg_rows(destination_db, f"SELECT headers FROM {table}")
    )
    assert arrived == Counter(ids)
    assert pg_rows(sender, f"SELECT count(*) FROM {FORWARD}") == [(0,)]
    assert pg_rows(sender, 'SELECT count(*) FROM "public"."sfbridge_retry"') == [(0,)]
