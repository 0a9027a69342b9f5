"""What the daemon costs with many forwarders, and how fast it picks a message up.

- Pickup latency with push and with polling (issue 24): the same daemon, the same databases;
  for polling the forwarding queue's push trigger is dropped (as a DBA who refused it leaves
  it), so the daemon polls that queue every peek interval (50 ms by default). Baseline:
  polling.
- Idle cost with 1, 10 and 50 forwarders on one PostgreSQL database (one queue each) and no
  traffic: the daemon's CPU (fraction of one core, from /proc/PID/stat), the most connections
  it holds to the forwarding database (pg_stat_activity, application_name 'sfbridge') and the
  transactions it commits there per second (pg_stat_database.xact_commit). Baseline: 1
  forwarder of this code; with --previous-code also that code with 1 and 10 forwarders (not
  50: it opens two connections per forwarder, and the server is shared).
- 50 forwarders with traffic on 5 of them: the 5 queues filled, then timed from READY until
  every message arrived, each exactly once. Baseline: only those 5 forwarders configured.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from throughput.daemon import Daemon, cpu_seconds, peak_rss_mb, sfbridge_command, write_config
from throughput.databases import (
    ERROR_QUEUE,
    LEDGER_TABLE,
    QUEUE,
    RECEIVER,
    RETRY_TABLE,
    PgDatabase,
    new_messages,
    pg_connect,
)
from throughput.latency import measure_pickup
from throughput.scenarios import Scenario

SETTLE = 2.0  # seconds after READY before an idle window starts
SAMPLE = 0.25  # seconds between connection counts


def measure_latency_modes(
    scenario: Scenario, messages: int, idle_seconds: float, body: bytes
) -> dict[str, Any]:
    """Pickup latency with push, then with polling (the trigger dropped, then put back)."""
    push = measure_pickup(scenario, messages, idle_seconds, body, "push")
    source = scenario.source
    assert isinstance(source, PgDatabase)
    source.connection.execute(f'DROP TRIGGER IF EXISTS sfbridge_notify ON "{QUEUE}"')
    try:
        polling = measure_pickup(scenario, messages, idle_seconds, body, "polling")
    finally:
        _install(scenario.workdir / "install.yaml", scenario.environment)
    return {"push": push, "polling": polling}


def forwarders_config(
    source: PgDatabase, destination: PgDatabase, names: list[str]
) -> dict[str, Any]:
    return {
        "databases": {"source": source.config_entry(), "dest": destination.config_entry()},
        "forwarders": [{"name": name, "database": "source", "queue": name} for name in names],
        "routes": [{"match": "*", "database": "dest"}],
    }


def measure_idle_cost(
    source: PgDatabase,
    destination: PgDatabase,
    workdir: Path,
    counts: tuple[int, ...],
    seconds: float,
    previous_code: str | None,
    progress: Any,
) -> dict[str, Any]:
    """One row per (code, forwarders): idle CPU, connections, transactions per second."""
    rows = []
    environment = {**source.environment(), **destination.environment()}
    codes: list[tuple[str, str | None, tuple[int, ...]]] = [("this code", None, counts)]
    if previous_code is not None:
        codes.insert(0, ("previous code", previous_code, tuple(c for c in counts if c <= 10)))
    for label, code, numbers in codes:
        for count in numbers:
            names = [f"idle_{index}" for index in range(count)]
            config = write_config(
                workdir / f"idle-{count}-{code is None}.yaml",
                forwarders_config(source, destination, names),
            )
            env = environment if code is None else {**environment, "PYTHONPATH": code}
            _install(config, env, cwd=code)
            progress(f"idle cost: {label}, {count} forwarder(s), {seconds:.0f} s ...")
            rows.append(
                {
                    "code": label,
                    "forwarders": count,
                    **_idle_window(config, env, source, workdir, seconds, code),
                }
            )
    baseline = next(row for row in rows if row["code"] == "this code" and row["forwarders"] == 1)
    for row in rows:
        for key in ("cpu_percent", "connections", "transactions_per_s"):
            row[f"{key}_vs_baseline"] = _ratio(row[key], baseline[key])
    return {"seconds": seconds, "rows": rows}


def _idle_window(
    config: Path,
    env: dict[str, str],
    source: PgDatabase,
    workdir: Path,
    seconds: float,
    code: str | None,
) -> dict[str, Any]:
    observer = _Observer(source)
    try:
        with Daemon(config, env, workdir / f"{config.stem}.log", code) as daemon:
            daemon.wait_ready()
            time.sleep(SETTLE)
            before, started = observer.transactions(), time.perf_counter()
            cpu_start = cpu_seconds(daemon.pid)
            most = 0
            while time.perf_counter() - started < seconds:
                most = max(most, observer.connections())
                time.sleep(SAMPLE)
            elapsed = time.perf_counter() - started
            cpu = cpu_seconds(daemon.pid) - cpu_start
            transactions = observer.transactions() - before
            rss = peak_rss_mb(daemon.pid)
            code_after = daemon.stop()
    finally:
        observer.close()
    return {
        "cpu_percent": 100 * cpu / elapsed,
        "connections": most,
        "transactions_per_s": transactions / elapsed,
        "peak_rss_mb": rss,
        "clean_stop": code_after == 0,
    }


def measure_traffic_on_few(
    source: PgDatabase,
    destination: PgDatabase,
    workdir: Path,
    per_queue: int,
    body: bytes,
    progress: Any,
) -> dict[str, Any]:
    """5 busy queues among 50 forwarders, against the same 5 configured alone."""
    environment = {**source.environment(), **destination.environment()}
    busy = [f"busy_{index}" for index in range(5)]
    rows = []
    for label, names in (
        ("5 forwarders, traffic on all 5", busy),
        ("50 forwarders, traffic on 5", busy + [f"quiet_{index}" for index in range(45)]),
    ):
        config = write_config(
            workdir / f"traffic-{len(names)}.yaml", forwarders_config(source, destination, names)
        )
        _install(config, environment)
        source.clear([*busy, ERROR_QUEUE, RETRY_TABLE])
        destination.clear([RECEIVER, LEDGER_TABLE])
        ids: set[str] = set()
        for name in busy:
            batch = new_messages(per_queue)
            source.fill(name, batch, body)
            ids |= {message_id for message_id, _ in batch}
        progress(f"{label}: {len(ids)} messages ...")
        with Daemon(config, environment, workdir / f"traffic-{len(names)}.log") as daemon:
            daemon.wait_ready()
            started, cpu_start = time.perf_counter(), cpu_seconds(daemon.pid)
            deadline = time.monotonic() + 60 + len(ids) / 50
            while destination.count(RECEIVER) < len(ids):
                daemon.check_alive(0)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{label}: too slow:\n{daemon.log_tail()}")
                time.sleep(0.02)
            elapsed = time.perf_counter() - started
            cpu = cpu_seconds(daemon.pid) - cpu_start
            rss = peak_rss_mb(daemon.pid)
            exit_code = daemon.stop()
        got = destination.message_ids(RECEIVER)
        left = sum(source.count(name) for name in [*busy, ERROR_QUEUE, RETRY_TABLE])
        once = len(got) == len(set(got)) and set(got) == ids and left == 0 and exit_code == 0
        rows.append(
            {
                "label": label,
                "messages": len(ids),
                "msg_per_s": len(ids) / elapsed,
                "cpu_ms_per_msg": 1000 * cpu / len(ids),
                "peak_rss_mb": rss,
                "exactly_once": "ok"
                if once
                else f"FAILED: {len(got)} arrived for {len(ids)}, {left} left, exit {exit_code}",
            }
        )
    for row in rows:
        row["vs_baseline"] = _ratio(row["msg_per_s"], rows[0]["msg_per_s"])
    return {"rows": rows}


def _install(config: Path, environment: dict[str, str], cwd: str | None = None) -> None:
    result = subprocess.run(
        sfbridge_command(config, "install"),
        capture_output=True,
        text=True,
        env={**os.environ, **environment},
        timeout=300,
        cwd=cwd,
    )
    if result.returncode != 0:
        raise RuntimeError(f"sfbridge install failed:\n{result.stdout}{result.stderr}")


class _Observer:
    """Reads the server's statistics about a database from another database ('postgres'),
    so that reading them adds nothing to what is counted."""

    def __init__(self, database: PgDatabase) -> None:
        self.name = database.name
        admin = database.connection_string.replace(
            f"Database={database.name};", "Database=postgres;"
        )
        self.connection = pg_connect(admin, autocommit=True)

    def connections(self) -> int:
        return int(
            self.connection.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = 'sfbridge' AND datname = ?",
                self.name,
            ).fetchval()
        )

    def transactions(self) -> int:
        self.connection.execute("SELECT pg_stat_clear_snapshot()")
        return int(
            self.connection.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = ?", self.name
            ).fetchval()
        )

    def close(self) -> None:
        self.connection.close()


def _ratio(value: float, baseline: float) -> float | None:
    return value / baseline if baseline else None


def print_latency_modes(result: dict[str, Any]) -> None:
    polling = result["polling"]
    print("\npickup latency, PG -> PG, one idle daemon at its defaults (baseline: polling):")
    for mode in ("push", "polling"):
        row = result[mode]
        ratios = "  ".join(
            f"{key[:-3]} {_ratio(row[key], polling[key]):.2f}x"
            for key in ("median_ms", "p95_ms", "p99_ms")
        )
        print(
            f"  {mode:<8} median {row['median_ms']:6.1f} ms  p95 {row['p95_ms']:6.1f} ms  "
            f"p99 {row['p99_ms']:6.1f} ms  max {row['max_ms']:6.1f} ms  ({ratios})  "
            f"idle CPU {row['idle_cpu_percent']:.2f} %  exactly-once {row['exactly_once']}"
        )


def print_idle_cost(result: dict[str, Any]) -> None:
    print(
        f"\nidle cost over {result['seconds']:.0f} s, no traffic, forwarders on one PostgreSQL "
        "database (baseline: 1 forwarder of this code):"
    )
    print(
        f"  {'code':<15}{'forwarders':>11}{'CPU % core':>12}{'x':>7}{'connections':>13}{'x':>7}"
        f"{'xact/s':>9}{'x':>7}{'RSS MB':>8}"
    )
    for row in result["rows"]:
        print(
            f"  {row['code']:<15}{row['forwarders']:>11}{row['cpu_percent']:>12.2f}"
            f"{_x(row['cpu_percent_vs_baseline']):>7}{row['connections']:>13}"
            f"{_x(row['connections_vs_baseline']):>7}{row['transactions_per_s']:>9.1f}"
            f"{_x(row['transactions_per_s_vs_baseline']):>7}{row['peak_rss_mb']:>8.0f}"
        )


def print_traffic_on_few(result: dict[str, Any]) -> None:
    print("\n50 forwarders with traffic on 5, PG -> PG (baseline: the 5 configured alone):")
    for row in result["rows"]:
        print(
            f"  {row['label']:<34}{row['msg_per_s']:>9.0f} msg/s  {_x(row['vs_baseline']):>7}  "
            f"{row['cpu_ms_per_msg']:.3f} ms CPU/msg  {row['peak_rss_mb']:.0f} MB  "
            f"exactly-once {row['exactly_once']}"
        )


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
