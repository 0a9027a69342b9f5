"""A deadline one batch cannot meet, as the real daemon meets it: the receiver's queue table
writes slowly (a trigger sleeps 0.1 s per MiB of body, standing for a slow disk or a busy
server) and its `query_timeout` of 0.5 s (`statement_timeout` 1.5 s) cannot take a batch of 30
messages of 1 MiB, while it takes one. The batch is written in halves, everything arrives
exactly once, and the database is never called down; a message too large for the deadline
even alone spends its attempts and goes to the error queue with the reason, the others flow.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import (
    ERROR_QUEUE,
    RETRY_TABLE,
    DaemonProcess,
    pg_connect,
    pg_count,
    pg_rows,
    write_config,
)
from support import wait_until as wait_for
from support.metrics import free_port, scrape, value
from support.pairs import PgPair, make_pg_pair, pg_send

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
QUERY_TIMEOUT = "0.5s"  # the bridge's statement_timeout is a second more: 1.5 s
SECONDS_PER_MIB = 0.1  # 30 MiB in one statement: 3 s; 1 MiB: 0.1 s; 20 MiB: 2 s
SLOW_QUEUE = """
CREATE FUNCTION slow_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(octet_length(NEW.body) / 1048576.0 * {seconds});
    RETURN NEW;
END $$;
CREATE TRIGGER slow_write BEFORE INSERT ON {queue} FOR EACH ROW EXECUTE FUNCTION slow_write();
"""
OPTIONS: dict[str, Any] = {
    "receiver_database": {"query_timeout": QUERY_TIMEOUT},
    "forwarder": {"batch_bytes": "64MiB"},  # the 30 messages are claimed in one batch
    "retries": {"delay": "1s", "during_outage": "wait", "max_attempts": 2},
}


def slow_down(pair: PgPair) -> None:
    with pg_connect(pair.receiver) as connection:
        connection.execute(SLOW_QUEUE.format(seconds=SECONDS_PER_MIB, queue=pair.queue))
        connection.commit()


def with_metrics(pair: PgPair) -> int:
    """Give the pair's daemon a metrics page; its port."""
    port = free_port()
    config = yaml.safe_load(pair.config.read_text())
    config["metrics"] = {"listen": f"127.0.0.1:{port}"}
    write_config(pair.config, config)
    return port


@contextmanager
def watching_receiver_up(port: int) -> Iterator[list[float]]:
    """`sfbridge_database_up` of the receiver, read from the metrics page every 0.2 s while
    the block runs: every value seen (the page not up yet is no value)."""
    seen: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                up = value(scrape(port), "sfbridge_database_up", database="receiver")
            except OSError:
                up = None
            if up is not None:
                seen.append(up)
            stop.wait(0.2)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(timeout=10)


def settle_and_check(pair: PgPair, daemon: DaemonProcess, up_seen: list[float]) -> None:
    """What must hold once the messages are where they belong: the daemon never called the
    receiver down, says it is up now, and stops cleanly."""
    wait_for(lambda: pg_count(pair.sender, RETRY_TABLE) == 0, 30, "retry storage to empty")
    status = pair.cli("status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "DOWN" not in status.stdout, status.stdout
    assert daemon.stop() == 0, daemon.output()
    assert up_seen and set(up_seen) == {1.0}, up_seen
    log = daemon.output()
    assert "cannot be reached" not in log, log
    assert "missed the deadline" in log, log  # the fault was there


def received_ids(pair: PgPair) -> Counter[str]:
    """The message ids in the receiver's queue, each with how often (the headers only: reading
    the bodies back costs seconds)."""
    rows = pg_rows(pair.receiver, f"SELECT headers FROM {pair.queue}")
    return Counter(json.loads(headers)["NServiceBus.MessageId"] for (headers,) in rows)


def run_full_batch(pair: PgPair, tmp_path: Path) -> None:
    slow_down(pair)
    port = with_metrics(pair)
    ids = pg_send(pair.sender, pair.forward, 30, destination=pair.queue, body=b"m" * MIB)
    with pair.daemon(tmp_path / "daemon.log") as daemon, watching_receiver_up(port) as up:
        started = time.monotonic()
        wait_for(lambda: pair.delivered() == 30, 40, "the 30 messages of 1 MiB")
        took = time.monotonic() - started
        settle_and_check(pair, daemon, up)
    received = received_ids(pair)
    assert set(received) == ids and max(received.values()) == 1, received
    assert pg_count(pair.sender, ERROR_QUEUE) == 0
    print(f"30 messages of 1 MiB delivered {took:.1f} s after the daemon started")


def test_a_batch_that_cannot_meet_the_deadline_is_delivered_in_halves_exactly_once(
    pg_pair_factory: Callable[..., PgPair], tmp_path: Path
) -> None:
    run_full_batch(pg_pair_factory(**OPTIONS), tmp_path)


@pytest.mark.xdist_group("two-phase-servers")
def test_a_two_phase_batch_that_cannot_meet_the_deadline_is_delivered_in_halves_exactly_once(
    two_phase_postgres: Any, tmp_path: Path
) -> None:
    sender, receiver = (
        two_phase_postgres.connection_string(two_phase_postgres.create_database()) for _ in range(2)
    )
    pair = make_pg_pair(tmp_path, sender, receiver, **OPTIONS, route={"transaction": "two-phase"})
    run_full_batch(pair, tmp_path)
    assert pg_rows(receiver, "SELECT count(*) FROM pg_prepared_xacts")[0][0] == 0


def test_a_message_too_large_for_the_deadline_alone_goes_to_the_error_queue_and_the_rest_flow(
    pg_pair_factory: Callable[..., PgPair], tmp_path: Path
) -> None:
    pair = pg_pair_factory(**OPTIONS)
    slow_down(pair)
    port = with_metrics(pair)
    small = pg_send(pair.sender, pair.forward, 5, destination=pair.queue, body=b"s" * 1024)
    (large,) = pg_send(pair.sender, pair.forward, 1, destination=pair.queue, body=b"L" * 20 * MIB)
    small |= pg_send(pair.sender, pair.forward, 5, destination=pair.queue, body=b"s" * 1024)
    with pair.daemon(tmp_path / "daemon.log") as daemon, watching_receiver_up(port) as up:
        wait_for(lambda: pg_count(pair.sender, ERROR_QUEUE) == 1, 40, "the large message")
        settle_and_check(pair, daemon, up)
    received = received_ids(pair)
    assert set(received) == small and max(received.values()) == 1, received
    ((headers_text,),) = pg_rows(pair.sender, f"SELECT headers FROM {ERROR_QUEUE}")
    headers = json.loads(headers_text)
    assert headers["NServiceBus.MessageId"] == large
    reason = headers["NServiceBus.ExceptionInfo.Message"]
    assert "message of 20.0 MiB is larger than query_timeout allows" in reason, reason
    assert "0.5 s query_timeout of database 'receiver'" in reason, reason
    assert headers["$.sfbridge.failure-reason"] == "delivery-failed"
    assert headers["$.sfbridge.attempts"] == "2"  # max_attempts: it spent them all
