"""Idle pickup latency: how long a single message waits when the daemon has nothing to do.

The daemon runs at its defaults on an empty queue. After READY and a quiet second its idle CPU
is read over `idle_seconds`; then single messages are sent one at a time at random gaps, each
timed from its send's commit to the moment it is visible in the destination queue (looked for
every 0.5 ms).
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

from throughput.daemon import Daemon, cpu_seconds, peak_rss_mb, write_config
from throughput.databases import QUEUE, RECEIVER, new_messages
from throughput.scenarios import Scenario

# How often arrival is looked for: finer than the pickup times to be told apart (push: a few
# ms), still a query at a time.
POLL = 0.0005
GAP = (0.2, 0.7)  # seconds between sends


def measure_pickup(
    scenario: Scenario, messages: int, idle_seconds: float, body: bytes, mode: str = "push"
) -> dict[str, Any]:
    """Latencies (median, p95, p99, max in ms), idle CPU (% of one core) and the exactly-once
    check; `mode` only labels the result (the caller arranges push or polling). Raises
    RuntimeError when the daemon dies or a message takes over 30 s."""
    scenario.prepare(0, body)
    config = write_config(scenario.workdir / "latency.yaml", scenario.daemon_config({}, {}))
    log = scenario.workdir / "latency.log"
    latencies: list[float] = []
    ids: set[str] = set()
    with Daemon(config, scenario.environment, log) as daemon:
        daemon.wait_ready()
        time.sleep(1.0)
        scenario.progress(f"pickup latency: daemon idle for {idle_seconds:.0f} s ...")
        cpu_start, idle_start = cpu_seconds(daemon.pid), time.perf_counter()
        time.sleep(idle_seconds)
        idle_cpu = cpu_seconds(daemon.pid) - cpu_start
        idle_elapsed = time.perf_counter() - idle_start
        for number in range(1, messages + 1):
            message_id, latency = send_one_and_wait(scenario, daemon, number, body, GAP)
            ids.add(message_id)
            latencies.append(latency)
            if number % 10 == 0:
                scenario.progress(f"pickup latency: {number}/{messages} messages")
        rss = peak_rss_mb(daemon.pid)
        code = daemon.stop()
    check = scenario.exactly_once(ids)
    if code != 0:
        check = f"FAILED: exit code {code} after SIGTERM; {check}"
    return {
        "scenario": scenario.name,
        "messages": messages,
        "gap": f"{GAP[0]}-{GAP[1]} s",
        "mode": mode,
        "median_ms": statistics.median(latencies),
        "p95_ms": statistics.quantiles(latencies, n=20, method="inclusive")[18],
        "p99_ms": statistics.quantiles(latencies, n=100, method="inclusive")[98],
        "max_ms": max(latencies),
        "latencies_ms": [round(value, 1) for value in latencies],
        "idle_seconds": idle_elapsed,
        "idle_cpu_percent": 100 * idle_cpu / idle_elapsed,
        "peak_rss_mb": rss,
        "exactly_once": check,
    }


def send_one_and_wait(
    scenario: Scenario, daemon: Daemon, number: int, body: bytes, gap: tuple[float, float]
) -> tuple[str, float]:
    """After a random pause within `gap` seconds, one message into the forwarding queue in
    its own transaction, waited for until it is the `number`th in the destination queue; its
    id and the ms from its commit to its arrival. Raises RuntimeError when the daemon dies or
    it takes over 30 s."""
    time.sleep(random.uniform(*gap))
    ((message_id, headers),) = new_messages(1)
    scenario.source.send_one(QUEUE, headers, body)
    sent = time.perf_counter()
    while scenario.destination.count(RECEIVER) < number:
        daemon.check_alive(number - 1)
        if time.perf_counter() - sent > 30:
            raise RuntimeError(f"message {number} not picked up within 30 s")
        time.sleep(POLL)
    return message_id, 1000 * (time.perf_counter() - sent)
