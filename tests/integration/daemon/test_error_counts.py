"""Error-queue counts that belong to their forwarder: two forwarders share one error queue with
the endpoints; `status`, `status --json` and the metric count each forwarder's own failures
(by NServiceBus.FailedQ), and the endpoints' own failures and poison apart, through the real
CLI and a running daemon against PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import (
    ERROR_QUEUE,
    SAMPLES_RECEIVER,
    SENDER_FORWARD,
    DaemonProcess,
    nsb_message_headers,
    pg_connect,
    pg_count,
    pg_create_queue,
    pg_nsb_send,
    pg_send,
    sfbridge,
    wait_until,
    write_config,
)
from support.metrics import free_port, scrape, value

from bridge.config import load_config
from bridge.connections import connect
from bridge.storage.error_counts import read_error_counts

pytestmark = pytest.mark.integration

BILLING_FORWARD = '"public"."Samples.Billing.Forward"'


def test_two_forwarders_sharing_an_error_queue_each_count_their_own(
    tmp_path: Path, new_pg_database: Any
) -> None:
    sender, receiver = new_pg_database(), new_pg_database()
    port = free_port()
    config = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": sender},
                "receiver": {"dialect": "postgresql", "connection": receiver},
            },
            "forwarders": [
                {"name": "orders", "database": "sender", "queue": SENDER_FORWARD},
                {"name": "billing", "database": "sender", "queue": BILLING_FORWARD},
            ],
            # Only the receiver's queue has a route: anything else is unroutable.
            "routes": [{"match": "Samples.Receiver", "database": "receiver"}],
            "metrics": {"listen": f"127.0.0.1:{port}"},
        },
    )
    assert sfbridge("-c", str(config), "install").returncode == 0
    pg_create_queue(receiver, SAMPLES_RECEIVER)
    # The endpoints' own failures in the same error queue: one failed in an endpoint's queue,
    # one without FailedQ, and a poison row whose headers are not JSON.
    with pg_connect(sender) as connection:
        failed_in_endpoint = nsb_message_headers(
            SAMPLES_RECEIVER, **{"NServiceBus.FailedQ": "Samples.Receiver@[public]"}
        )
        pg_nsb_send(connection, ERROR_QUEUE, failed_in_endpoint, b"{}")
        pg_nsb_send(connection, ERROR_QUEUE, nsb_message_headers(None), b"{}")
        connection.execute(
            f"INSERT INTO {ERROR_QUEUE} (Id, Headers, Body) VALUES (gen_random_uuid(), ?, ?)",
            '{"NServiceBus.FailedQ": "cut off',
            b"x",
        )
        connection.commit()

    with DaemonProcess(config, tmp_path / "daemon.log") as daemon:
        pg_send(sender, SENDER_FORWARD, 3, destination='"public"."Samples.Unknown"')
        pg_send(sender, BILLING_FORWARD, 2, destination='"public"."Samples.Other"')
        pg_send(sender, BILLING_FORWARD, 4, destination=SAMPLES_RECEIVER)  # delivered
        wait_until(lambda: pg_count(sender, ERROR_QUEUE) == 3 + 3 + 2, 30, "the failures")
        wait_until(lambda: pg_count(receiver, SAMPLES_RECEIVER) == 4, 30, "the deliveries")

        def counted() -> bool:
            samples = scrape(port)
            return (
                value(samples, "sfbridge_queue_messages", forwarder="orders", queue="error") == 3
                and value(samples, "sfbridge_queue_messages", forwarder="billing", queue="error")
                == 2
                and value(
                    samples,
                    "sfbridge_error_queue_other_messages",
                    database="sender",
                    error_queue=ERROR_QUEUE,
                )
                == 3
            )

        wait_until(counted, 20, "each forwarder's own error count in the metrics")
        assert daemon.process.poll() is None

    result = sfbridge("-c", str(config), "status", "--json")
    assert result.returncode in (0, 1), result.stderr  # 1: no daemon running (it was killed)
    status = json.loads(result.stdout)
    assert {f["forwarder"]: f["in_error"] for f in status["forwarders"]} == {
        "orders": 3,
        "billing": 2,
    }
    assert status["error_queues"] == [
        {
            "database": "sender",
            "error_queue": ERROR_QUEUE,
            "exists": True,
            "messages": 8,
            "forwarders": {"billing": 2, "orders": 3},
            "other": 3,
        }
    ]
    text = sfbridge("-c", str(config), "status").stdout
    assert "in error queue     3  (failed by this forwarder" in text
    assert "in error queue     2  (failed by this forwarder" in text
    assert (
        f"  {ERROR_QUEUE} in database 'sender': 8 message(s): billing 2, orders 3, other 3" in text
    )

    # One grouped read per error queue, whatever the number of forwarders writing to it.
    loaded, _ = load_config(config)
    connection = connect(loaded.databases["sender"])
    try:
        statements: list[str] = []
        query = connection.query_named

        def counting(sql: str, params: Any = ()) -> Any:
            statements.append(sql)
            return query(sql, params)

        connection.query_named = counting  # type: ignore[method-assign]
        [count] = read_error_counts(loaded, "sender", connection)
        assert len(statements) == 1 and count.total == 8
    finally:
        connection.close()
