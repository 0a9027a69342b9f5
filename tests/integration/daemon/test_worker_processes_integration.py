"""`daemon.processes`: the workers dealt out over several processes under one `sfbridge run`.
Real daemons on real databases: both processes forward, the daemon reports for both, a worker
process killed is started again with nothing lost or doubled, and nothing outlives the daemon,
SIGKILLed or stopped."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from support import (
    ERROR_QUEUE,
    RETRY_TABLE,
    SAMPLES_RECEIVER,
    SENDER_FORWARD,
    DaemonProcess,
    nsb_message_headers,
    pg_connect,
    pg_count,
    pg_create_queue,
    pg_nsb_send,
    pg_rows,
    sfbridge,
    wait_until,
    write_config,
)
from support.metrics import free_port, scrape, value
from support.pairs import PgPair, message_ids, pg_send

pytestmark = pytest.mark.integration

BILLING_FORWARD = '"public"."Samples.Billing.Forward"'
STARTED = re.compile(r"worker process 2 started \(pid (\d+)\)")


def _pair(pg_pair_factory: Any, **sections: Any) -> PgPair:
    pair: PgPair = pg_pair_factory(
        forwarder={"concurrency": 4, "peek_interval": "50ms"},
        daemon={"processes": 2},
        **sections,
    )
    return pair


def _worker_pid(daemon: DaemonProcess, nth: int = 1) -> int:
    """The pid of worker process 2, as the daemon logged it the `nth` time it started it."""
    daemon.wait_for_output("worker process 2 started", count=nth)
    return int(STARTED.findall(daemon.output())[nth - 1])


def delivered(samples: dict[Any, float]) -> float | None:
    """`sfbridge_messages_total{outcome="delivered"}` of the forwarder `sender`."""
    return value(samples, "sfbridge_messages_total", forwarder="sender", outcome="delivered")


def _delivered_by(pair: PgPair, workers: set[int]) -> int:
    """Messages these workers (by number: counter slot) delivered since install."""
    rows = pg_rows(
        pair.sender, "SELECT slot, value FROM sfbridge_counters WHERE counter = 'delivered'"
    )
    return sum(int(value) for slot, value in rows if int(slot) in workers)


def _gone(pid: int) -> bool:
    """Whether `pid` has ended (a zombie nobody reaped yet has ended too)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_two_processes_share_the_work_and_the_daemon_reports_for_both(
    pg_pair_factory: Any,
) -> None:
    port = free_port()
    pair = _pair(pg_pair_factory, metrics={"listen": f"127.0.0.1:{port}"})
    with pair.daemon(pair.config.parent / "daemon.log") as daemon:
        daemon.wait_for_output("in process 2 of 2")
        sent = pg_send(pair.sender, pair.forward, 3000)
        wait_until(lambda: pair.delivered() == 3000, 60, "the deliveries")
        received = message_ids(pair.receiver, SAMPLES_RECEIVER)
        assert set(received) == sent and set(received.values()) == {1}
        # Worker numbers differ between the processes (0-1 here, 2-3 there): both forwarded.
        rows = pg_rows(
            pair.sender,
            "SELECT slot, value FROM sfbridge_counters WHERE counter = 'delivered'",
        )
        slots = {int(slot) for slot, count in rows if int(count) > 0}
        assert slots & {0, 1} and slots & {2, 3}, rows
        assert sum(int(count) for _, count in rows) == 3000

        wait_until(
            lambda: delivered(scrape(port)) == 3000,
            15,
            "every delivery, from both processes, in the daemon's metrics",
        )
        # Its memory and CPU are the worker process's own, not the daemon's.
        samples = scrape(port)
        pid = _worker_pid(daemon)
        with open(f"/proc/{pid}/status") as status:
            rss = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS"))
        shown = value(samples, "sfbridge_worker_process_resident_memory_bytes", process="2")
        assert shown is not None and 0.5 * rss < shown < 2 * rss, (shown, rss)
        assert shown != value(samples, "sfbridge_process_resident_memory_bytes")
        assert value(samples, "sfbridge_worker_process_cpu_seconds_total", process="2")
        assert value(samples, "sfbridge_worker_process_up", process="2") == 1
        assert value(samples, "sfbridge_worker_process_restarts_total", process="2") == 0
        assert not [key for key in samples if dict(key[1]).get("process") == "1"]
        log = daemon.output()
        assert "2 processes run the workers (daemon.processes: 2)" in log
        assert "up to 2 worker(s)" in log and "in process 1 of 2" in log
        assert daemon.stop() == 0
    assert _gone(pid)
    assert "forwarded since start: delivered 3000" in daemon.output()


def test_a_trickle_is_claimed_by_the_daemons_own_workers_alone_and_a_burst_by_all(
    pg_pair_factory: Any,
) -> None:
    """A mark goes on to the worker process only where the daemon's own workers cannot start
    on it: single messages are claimed once, not once per process (which doubled the claims
    on the forwarding database); a full claim turns the queue into a backlog, and that brings
    the worker process in."""
    pair = _pair(pg_pair_factory)
    with pair.daemon(pair.config.parent / "daemon.log") as daemon:
        daemon.wait_for_output("in process 2 of 2", count=2)
        sent: set[str] = set()
        for number in range(1, 61):
            sent |= pg_send(pair.sender, pair.forward, 1)
            wait_until(lambda: pair.delivered() >= number, 30, "each message")  # noqa: B023
        assert pair.delivered() == 60
        # The daemon's two workers are idle whenever a message comes: the worker process
        # (workers 2 and 3) has nothing to do. Racing for every message, it took about half.
        assert _delivered_by(pair, {2, 3}) <= 6, _delivered_by(pair, {2, 3})
        assert _delivered_by(pair, {0, 1}) >= 54
        sent |= pg_send(pair.sender, pair.forward, 8000)
        wait_until(lambda: pair.delivered() == 8060, 60, "the burst")
        assert _delivered_by(pair, {2, 3}) > 0
        assert daemon.stop() == 0
    received = message_ids(pair.receiver, SAMPLES_RECEIVER)
    assert set(received) == sent and set(received.values()) == {1}


def test_a_killed_worker_process_is_started_again_and_nothing_is_lost_or_doubled(
    pg_pair_factory: Any,
) -> None:
    port = free_port()
    pair = _pair(pg_pair_factory, metrics={"listen": f"127.0.0.1:{port}"})
    with pair.daemon(pair.config.parent / "daemon.log") as daemon:
        first = _worker_pid(daemon)
        daemon.wait_for_output("in process 2 of 2")
        sent = pg_send(pair.sender, pair.forward, 2000)
        wait_until(lambda: pair.delivered() > 0, 30, "the first deliveries")
        os.kill(first, signal.SIGKILL)  # mid-traffic: it may hold a batch
        sent |= pg_send(pair.sender, pair.forward, 2000)
        daemon.wait_for_output("ended unexpectedly (exit code -9)")
        second = _worker_pid(daemon, nth=2)
        assert second != first
        restarts = "sfbridge_worker_process_restarts_total"
        assert value(scrape(port), restarts, process="2") == 1
        wait_until(lambda: pair.delivered() == 4000, 60, "every message")
        received = message_ids(pair.receiver, SAMPLES_RECEIVER)
        assert set(received) == sent and set(received.values()) == {1}
        assert pg_rows(pair.sender, f"SELECT count(*) FROM {ERROR_QUEUE}") == [(0,)]
        # The new one forwards: its workers (numbers 2 and 3) join in on a burst, once they
        # have started (it logs its share twice each time it starts).
        daemon.wait_for_output("in process 2 of 2", count=4)
        before = _delivered_by(pair, {2, 3})
        more = pg_send(pair.sender, pair.forward, 8000)  # what came before was received
        wait_until(lambda: pair.delivered() == 8000, 60, "the burst after the restart")
        assert set(message_ids(pair.receiver, SAMPLES_RECEIVER)) == more
        assert _delivered_by(pair, {2, 3}) > before
        assert daemon.stop() == 0
    assert _gone(second)


def test_worker_processes_leave_when_the_daemon_is_killed(pg_pair_factory: Any) -> None:
    pair = _pair(pg_pair_factory)
    with pair.daemon(pair.config.parent / "daemon.log") as daemon:
        pid = _worker_pid(daemon)
        daemon.wait_for_output("in process 2 of 2")
        sent = pg_send(pair.sender, pair.forward, 2000)
        wait_until(lambda: pair.delivered() > 0, 30, "the first deliveries")
        daemon.kill()
        wait_until(lambda: _gone(pid), 20, "the worker process to leave after its daemon")
        assert "the daemon is gone; stopping after the batches in flight" in daemon.output()
    # What the killed daemon's own workers held was rolled back; the next daemon sends it.
    with pair.daemon(pair.config.parent / "again.log") as again:
        wait_until(lambda: pair.delivered() == 2000, 60, "every message")
        received = message_ids(pair.receiver, SAMPLES_RECEIVER)
        assert set(received) == sent and set(received.values()) == {1}
        assert again.stop() == 0


def test_an_outage_only_a_worker_process_sees_is_said_and_probed_by_the_daemon(
    tmp_path: Path, new_pg_database: Any, postgres: Any
) -> None:
    """Two forwarders of `concurrency: 1`, one per process; only the worker process's sends to
    a receiver database that is dropped and created again. The daemon says the outage (once),
    probes it, and tells the worker process, which never probes, when it is back."""
    sender, receiver = new_pg_database(), new_pg_database()
    found = re.search(r"Database=([^;]+);", receiver)
    assert found is not None
    config = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": sender},
                "receiver": {"dialect": "postgresql", "connection": receiver},
            },
            "forwarders": [
                {"name": "alpha", "database": "sender", "queue": SENDER_FORWARD, "concurrency": 1},
                {"name": "beta", "database": "sender", "queue": BILLING_FORWARD, "concurrency": 1},
            ],
            "routes": [{"match": "*", "database": "receiver"}],
            "retries": {"delay": "1s", "max_attempts": 1000},
            "daemon": {"processes": 2},
        },
    )
    assert sfbridge("-c", str(config), "install").returncode == 0
    with DaemonProcess(config, tmp_path / "daemon.log") as daemon:
        daemon.wait_for_output("forwarder 'beta': up to 1 worker(s)")
        beta = f"on {BILLING_FORWARD} in database 'sender' in process 2 of 2"
        assert beta in daemon.output()
        with postgres.admin() as admin:
            admin.execute(f'DROP DATABASE "{found.group(1)}" WITH (FORCE)')
        sent = pg_send(sender, BILLING_FORWARD, 500)
        daemon.wait_for_output("cannot be reached")
        wait_until(lambda: pg_count(sender, RETRY_TABLE) == 500, 60, "all in retry storage")
        with postgres.admin() as admin:
            admin.execute(f'CREATE DATABASE "{found.group(1)}"')
        pg_create_queue(receiver, SAMPLES_RECEIVER)
        wait_until(lambda: pg_count(receiver, SAMPLES_RECEIVER) == 500, 60, "every message")
        received = message_ids(receiver, SAMPLES_RECEIVER)
        assert set(received) == sent and set(received.values()) == {1}
        log = daemon.output()
        assert log.count("cannot be reached") == 1, log
        assert log.count("is usable again") == 1, log
        assert daemon.stop() == 0


def test_a_frozen_worker_process_holds_up_nothing_and_sigterm_still_ends(
    pg_pair_factory: Any,
) -> None:
    """A worker process frozen (SIGSTOP: a host that stops scheduling it) while thousands of
    sends each notify the daemon: the daemon's own workers forward everything, what is meant
    for the frozen process piles up nowhere, and SIGTERM ends the daemon, the frozen process
    killed after the grace."""
    pair = _pair(pg_pair_factory)
    with pair.daemon(pair.config.parent / "daemon.log") as daemon:
        pid = _worker_pid(daemon)
        daemon.wait_for_output("in process 2 of 2")
        os.kill(pid, signal.SIGSTOP)
        sent: set[str] = set()
        with pg_connect(pair.sender) as connection:
            for _ in range(3000):  # one transaction, so one notification, each
                headers = nsb_message_headers(SAMPLES_RECEIVER)
                sent.add(str(headers["NServiceBus.MessageId"]))
                pg_nsb_send(connection, pair.forward, headers, b"x")
                connection.commit()
        wait_until(lambda: pair.delivered() == 3000, 60, "every message, by the daemon alone")
        assert daemon.stop(timeout=60) == 0
        assert "worker(s) worker process 2 still waiting" in daemon.output()
    assert _gone(pid)
    received = message_ids(pair.receiver, SAMPLES_RECEIVER)
    assert set(received) == sent and set(received.values()) == {1}
