"""`metrics.listen`: a running daemon scraped over HTTP and read with prometheus-client's own
text-format parser, as Prometheus would; the figures are held against the rows in the tables."""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import ERROR_QUEUE as ERROR
from support import (
    REPO,
    DaemonProcess,
    pg_connect,
    pg_count,
    pg_create_queue,
    pg_send,
    sfbridge,
    wait_until,
    write_config,
)
from support import RETRY_TABLE as RETRY
from support import SAMPLES_RECEIVER as RECEIVER
from support import SENDER_FORWARD as FORWARD
from support.metrics import SECRET, free_port, scrape, value

pytestmark = pytest.mark.integration

CONFIG = REPO / "config"


def exposed_names(port: int) -> set[str]:
    """Every family the page declares (with or without series) and every series name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        families = list(text_string_to_metric_families(response.read().decode()))
    return {f.name for f in families} | {s.name for f in families for s in f.samples}


def with_password(connection: str) -> str:
    # The test server trusts loopback, so the password is never checked, only carried.
    return connection + "Pwd=${PG_TEST_SECRET};"


def test_a_scrape_counts_what_arrived_what_failed_and_what_waits(
    tmp_path: Path, new_pg_database: Any, postgres: Any
) -> None:
    """Counters against the rows that arrived; depths against the tables; a database dropped
    while the daemon runs shows down, with what waits for it."""
    sender = new_pg_database()
    receiver_name = postgres.create_database()
    receiver = postgres.connection_string(receiver_name)
    port = free_port()
    config = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": with_password(sender)},
                "receiver": {"dialect": "postgresql", "connection": with_password(receiver)},
            },
            "forwarders": [
                {"name": "orders", "database": "sender", "queue": FORWARD, "peek_interval": "200ms"}
            ],
            "routes": [{"match": "Samples.Receiver", "database": "receiver"}],
            "retries": {"delay": "1s", "during_outage": "wait"},
            "metrics": {"listen": f"127.0.0.1:{port}"},
        },
    )
    env = {"PG_TEST_SECRET": SECRET}
    assert sfbridge("-c", str(config), "install", env=env).returncode == 0
    pg_create_queue(receiver, RECEIVER)

    with DaemonProcess(config, tmp_path / "daemon.log", env=env) as daemon:
        pg_send(sender, FORWARD, 40, destination=RECEIVER, body=b"{}")
        pg_send(
            sender, FORWARD, 5, destination='"public"."Samples.Unknown"', body=b"{}"
        )  # no route: the error queue
        with pg_connect(sender) as connection:  # poison: headers that are not JSON
            connection.execute(
                f"INSERT INTO {FORWARD} (Id, Headers, Body) VALUES (gen_random_uuid(), ?, ?)",
                "{not json",
                b"x",
            )
            connection.commit()
        wait_until(lambda: pg_count(receiver, RECEIVER) == 40, 30, "the deliveries")
        wait_until(lambda: pg_count(sender, ERROR) == 6, 30, "the unroutable messages")

        def sampled_errors() -> bool:
            return (
                value(scrape(port), "sfbridge_queue_messages", forwarder="orders", queue="error")
                == 5
            )

        wait_until(sampled_errors, 15, "the error queue depth in the metrics")
        samples = scrape(port)
        outcome = {
            name: value(samples, "sfbridge_messages_total", forwarder="orders", outcome=name)
            for name in ("delivered", "error_queue", "retry_scheduled", "duplicate_skipped")
        }
        assert outcome == {
            "delivered": 40,
            "error_queue": 6,
            "retry_scheduled": 0,
            "duplicate_skipped": 0,
        }
        assert value(samples, "sfbridge_destination_deliveries_total", database="receiver") == 40
        assert (
            value(samples, "sfbridge_messages_claimed_total", forwarder="orders", source="queue")
            == 46
        )
        batches = value(samples, "sfbridge_delivery_latency_seconds_count", database="receiver")
        assert batches is not None and 1 <= batches <= 40
        assert (
            value(samples, "sfbridge_delivery_latency_seconds_sum", database="receiver") or 0
        ) > 0
        assert (
            value(samples, "sfbridge_queue_messages", forwarder="orders", queue="forwarding") == 0
        )
        assert value(samples, "sfbridge_queue_messages", forwarder="orders", queue="retry") == 0
        # The poison row names no FailedQ (the error-queue gauge cannot charge it to the
        # forwarder); its own counter does.
        assert value(samples, "sfbridge_poison_messages_total", forwarder="orders") == 1
        assert value(samples, "sfbridge_retries_paused", forwarder="orders") == 0
        assert value(samples, "sfbridge_database_up", database="receiver") == 1
        assert value(samples, "sfbridge_workers", forwarder="orders") == 2
        # What the shipped alert rules and dashboard query exists on a real page.
        monitoring = (CONFIG / "prometheus-alerts.yaml").read_text() + json.dumps(
            json.loads((CONFIG / "grafana-dashboard.json").read_text())
        )
        used = set(re.findall(r"sfbridge_[a-z_]+", monitoring))
        assert used - exposed_names(port) == set()
        build = [labels for (name, labels) in samples if name == "sfbridge_build_info"]
        assert len(build) == 1 and ("version", "0.1.0") in build[0]
        assert (value(samples, "sfbridge_process_resident_memory_bytes") or 0) > 0

        # The receiver database goes away: it is down in the metrics, and what is sent now
        # waits in retry storage, which the metrics count too.
        with postgres.admin() as admin:
            admin.execute(f'DROP DATABASE "{receiver_name}" WITH (FORCE)')
        pg_send(sender, FORWARD, 3, destination=RECEIVER, body=b"{}")

        def down_and_waiting() -> bool:
            now = scrape(port)
            return (
                value(now, "sfbridge_database_up", database="receiver") == 0
                and value(now, "sfbridge_queue_messages", forwarder="orders", queue="retry") == 3
            )

        wait_until(down_and_waiting, 30, "the receiver to show down with 3 waiting")
        assert pg_count(sender, RETRY) == 3
        assert daemon.stop() == 0, daemon.output()
    assert SECRET not in daemon.output()


def test_a_port_in_use_stops_the_daemon_with_a_clear_error(
    tmp_path: Path, new_pg_database: Any
) -> None:
    sender, receiver = new_pg_database(), new_pg_database()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(
            tmp_path / "sfbridge.yaml",
            {
                "databases": {
                    "sender": {"dialect": "postgresql", "connection": sender},
                    "receiver": {"dialect": "postgresql", "connection": receiver},
                },
                "forwarders": [{"name": "orders", "database": "sender", "queue": FORWARD}],
                "routes": [{"match": "*", "database": "receiver"}],
                "metrics": {"listen": f"127.0.0.1:{port}"},
            },
        )
        result = sfbridge("-c", str(config), "run", timeout=30)
    assert result.returncode == 1
    output = result.stdout + result.stderr
    assert (
        f"metrics.listen 127.0.0.1:{port}: cannot listen there (Address already in use)" in output
    )
    assert "Traceback" not in output


def test_a_bad_listen_address_is_a_validation_error_with_its_key_path(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "a": {"dialect": "sqlite", "path": str(tmp_path / "a.db")},
                "b": {"dialect": "sqlite", "path": str(tmp_path / "b.db")},
            },
            "forwarders": [{"name": "f", "database": "a", "queue": "q"}],
            "routes": [{"match": "*", "database": "b"}],
            "metrics": {"listen": "127.0.0.1:99999"},
        },
    )
    result = sfbridge("-c", str(config), "check")
    assert result.returncode == 2
    assert (
        "metrics.listen: '127.0.0.1:99999': the port must be between 1 and 65535, got 99999"
        in result.stderr
    )
