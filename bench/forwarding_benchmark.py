"""Forwarding throughput of sfbridge between two PostgreSQL databases, as ratios to baselines.

Two fresh databases per run (sfbench_<random>_src / _dst), dropped at the end even on failure or
Ctrl-C. Only prints, no timed assertions; exit status 1 means a correctness check failed.
See bench/README.md for how to run it and how to read it.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyodbc

from bridge.config.model import BridgeConfig, DatabaseConfig, ForwarderConfig, RouteConfig
from bridge.connections import Connections
from bridge.dialects.postgresql import POSTGRESQL_REQUIRED_OPTIONS
from bridge.drivers.odbc import with_required_options
from bridge.forwarding import BatchForwarder
from bridge.headers import serialize_headers
from bridge.install import run_install
from bridge.send import test_message_headers

DEFAULT_PREFIX = "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=5432;Uid=postgres;"
QUEUE, ERROR, CEILING, RECEIVER = "bench_forward", "bench_error", "bench_ceiling", "bench_receiver"
QUEUE_DDL = (
    'CREATE TABLE "public"."{}" (Id uuid NOT NULL PRIMARY KEY, Expires timestamp, '
    "Headers text NOT NULL, Body bytea, Seq serial NOT NULL UNIQUE)"
)
# For `sfbridge run`; the connection strings come from the environment, like a real deployment.
DAEMON_YAML = """\
databases:
  src: {dialect: postgresql, connection: "${SFBENCH_SRC_ODBC}"}
  dst: {dialect: postgresql, connection: "${SFBENCH_DST_ODBC}"}
forwarders:
  - {name: bench, database: src, queue: bench_forward, error_queue: bench_error,
     batch_size: BATCH, concurrency: 2}
routes:
  - {match: "*", database: dst}
logging: {level: WARNING}
"""
LABELS = {
    "ceiling": "A ceiling: one DELETE..INSERT statement",
    "naive": "B naive relay: 2 transactions/message",
    "worker": "sfbridge BatchForwarder, 1 worker",
    "daemon": "sfbridge daemon, concurrency 2",
}
PREFILL_CHUNK = 250  # rows per multi-row INSERT
POLL = 0.02  # seconds between the daemon measurement's count(*) polls
Outcome = tuple[float, str | None]  # (seconds, exactly-once check or None)


def q(table: str) -> str:
    return f'"public"."{table}"'


def connection_string(prefix: str, database: str) -> str:
    return f"{prefix.rstrip().rstrip(';')};Database={database};"


def odbc(connection_string: str, *, autocommit: bool = False) -> pyodbc.Connection:
    """A pyodbc connection with the psqlODBC options the bridge forces on its own (a fair match)."""
    pyodbc.native_uuid = True
    options = with_required_options(connection_string, POSTGRESQL_REQUIRED_OPTIONS)
    return pyodbc.connect(options, autocommit=autocommit)


class Bench:
    def __init__(self, args: argparse.Namespace, src_cs: str, dst_cs: str, workdir: Path) -> None:
        self.n: int = args.messages
        self.src_cs, self.dst_cs, self.workdir = src_cs, dst_cs, workdir
        self.body = os.urandom(args.body_bytes)  # incompressible: TOAST cannot shrink it
        self.daemon: subprocess.Popen[bytes] | None = None
        self.first_row: list[float] = []  # daemon: seconds from start to the first row
        self.after_first: list[float] = []  # daemon: msg/s from the first row on
        self.config = BridgeConfig(
            databases={
                "src": DatabaseConfig(name="src", dialect="postgresql", connection=src_cs),
                "dst": DatabaseConfig(name="dst", dialect="postgresql", connection=dst_cs),
            },
            forwarders=(ForwarderConfig("bench", "src", QUEUE, ERROR, args.batch_size, 1),),
            routes=(RouteConfig("*", "dst"),),
        )
        run_install(self.config)  # queue, error queue, retry, counters in src; ledger in dst
        yaml = DAEMON_YAML.replace("BATCH", str(args.batch_size))
        (workdir / "sfbridge.yaml").write_text(yaml)
        self.src = odbc(src_cs, autocommit=True)
        self.dst = odbc(dst_cs, autocommit=True)
        self.src.execute(QUEUE_DDL.format(CEILING))
        self.dst.execute(QUEUE_DDL.format(RECEIVER))
        self.version = str(self.src.execute("SHOW server_version").fetchval()).split()[0]

    def close(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.kill()
            self.daemon.wait()
        self.src.close()
        self.dst.close()

    def prefill(self) -> set[str]:
        """Not timed: empty every table, put N NServiceBus-shaped messages in the source queue."""
        self.src.execute(f"TRUNCATE {q(QUEUE)}, {q(ERROR)}, {q(CEILING)}, {q('sfbridge_retry')}")
        self.dst.execute(f"TRUNCATE {q(RECEIVER)}, {q('sfbridge_ledger')}")
        ids: set[str] = set()
        for start in range(0, self.n, PREFILL_CHUNK):
            count = min(PREFILL_CHUNK, self.n - start)
            params: list[Any] = []
            for _ in range(count):
                headers = test_message_headers(RECEIVER, "Bench.Message", {}, now=datetime.now(UTC))
                ids.add(str(headers["NServiceBus.MessageId"]))
                params += [uuid.uuid4(), serialize_headers(headers), self.body]
            values = ", ".join(["(?, ?, ?)"] * count)
            self.src.execute(f"INSERT INTO {q(QUEUE)} (id, headers, body) VALUES {values}", *params)
        self.src.execute(f"ANALYZE {q(QUEUE)}")  # as autovacuum would have, on a real queue
        return ids

    def exactly_once(self, ids: set[str]) -> str:
        """'ok' when the destination holds every sent message id exactly once and nothing is
        left in the source queue, error queue or retry storage."""
        sql = f"SELECT headers::json->>'NServiceBus.MessageId' FROM {q(RECEIVER)}"
        got = [row[0] for row in self.dst.execute(sql).fetchall()]
        left = sum(
            self.src.execute(f"SELECT count(*) FROM {q(table)}").fetchval()
            for table in (QUEUE, ERROR, "sfbridge_retry")
        )
        if len(got) == self.n and set(got) == ids and left == 0:
            return "ok"
        return f"FAILED: {len(got)} rows, {len(set(got))} distinct ids, {left} left in source"

    def ceiling(self, ids: set[str]) -> Outcome:
        """A: one server-side statement moves every row between two tables of one database."""
        sql = (
            f"WITH m AS (DELETE FROM {q(QUEUE)} RETURNING id, expires, headers, body) "
            f"INSERT INTO {q(CEILING)} (id, expires, headers, body) "
            "SELECT id, expires, headers, body FROM m"
        )
        with closing(odbc(self.src_cs)) as connection:
            start = time.perf_counter()
            moved = connection.execute(sql).rowcount
            connection.commit()
            elapsed = time.perf_counter() - start
        if moved != self.n:
            raise RuntimeError(f"the ceiling statement moved {moved} rows, not {self.n}")
        return elapsed, None

    def naive(self, ids: set[str]) -> Outcome:
        """B: per message, claim one row in a source transaction, insert it in a destination
        transaction, commit the destination, then the source (the seed sample's relay)."""
        claim = (
            f"DELETE FROM {q(QUEUE)} WHERE seq = (SELECT seq FROM {q(QUEUE)} ORDER BY seq "
            "LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id, expires, headers, body"
        )
        insert = f"INSERT INTO {q(RECEIVER)} (id, expires, headers, body) VALUES (?, ?, ?, ?)"
        moved = 0
        with closing(odbc(self.src_cs)) as src, closing(odbc(self.dst_cs)) as dst:
            start = time.perf_counter()
            while True:
                cursor = src.execute(claim)
                # psqlODBC returns no result set at all when RETURNING matched no row.
                row = cursor.fetchone() if cursor.description else None
                if row is None:
                    src.commit()
                    break
                dst.execute(insert, uuid.uuid4(), row[1], row[2], row[3])
                dst.commit()
                src.commit()
                moved += 1
            elapsed = time.perf_counter() - start
        if moved != self.n:
            raise RuntimeError(f"the naive relay moved {moved} messages, not {self.n}")
        return elapsed, None

    def one_worker(self, ids: set[str]) -> Outcome:
        """3: BatchForwarder.forward_batch in a loop until a batch comes back empty."""
        connections = Connections(self.config.databases)
        totals: Counter[str] = Counter()
        try:
            forwarder = BatchForwarder(self.config, self.config.forwarders[0], connections)
            connections.get("src")  # connect outside the timing
            connections.get("dst")
            start = time.perf_counter()
            while (report := forwarder.forward_batch()).claimed:
                totals.update(report.counts)
            elapsed = time.perf_counter() - start
        finally:
            connections.close()
        check = self.exactly_once(ids)
        if check == "ok" and totals != Counter(delivered=self.n):
            check = f"FAILED: counts {dict(totals)}"
        return elapsed, check

    def run_daemon(self, ids: set[str]) -> Outcome:
        """4: `sfbridge -c <yaml> run` (concurrency 2), from process start until the destination
        holds N rows; then SIGTERM, which must end it with exit code 0."""
        executable = shutil.which("sfbridge")
        command = [executable] if executable else [sys.executable, "-m", "bridge"]
        command += ["-c", str(self.workdir / "sfbridge.yaml"), "run"]
        env = {**os.environ, "SFBENCH_SRC_ODBC": self.src_cs, "SFBENCH_DST_ODBC": self.dst_cs}
        log_path = self.workdir / "daemon.log"
        first: tuple[float, int] | None = None  # (seconds, rows) at the first non-zero count
        with open(log_path, "wb") as log:
            start = time.perf_counter()
            self.daemon = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            deadline = start + 60 + self.n / 100
            while True:
                count = self.dst.execute(f"SELECT count(*) FROM {q(RECEIVER)}").fetchval()
                now = time.perf_counter()
                first = (now - start, count) if count and first is None else first
                if count >= self.n:
                    break
                if self.daemon.poll() is not None or now > deadline:
                    tail = log_path.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"daemon stopped or too slow at {count} rows:\n{tail}")
                time.sleep(POLL)
            self.daemon.send_signal(signal.SIGTERM)
            code = self.daemon.wait(timeout=60)
            self.daemon = None
        if first is not None and first[1] < self.n:
            self.first_row.append(first[0])
            self.after_first.append((self.n - first[1]) / (now - start - first[0]))
        check = self.exactly_once(ids)
        return now - start, check if code == 0 else f"FAILED: exit code {code}; {check}"


def create_databases(prefix: str, names: list[str], created: list[str]) -> None:
    with closing(odbc(connection_string(prefix, "postgres"), autocommit=True)) as admin:
        for name in names:
            admin.execute(f'CREATE DATABASE "{name}"')
            created.append(name)


def drop_databases(prefix: str, names: list[str]) -> None:
    """Terminate every other session on each database, then drop it (FORCE: PostgreSQL 13+)."""
    terminate = (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = ? AND pid <> pg_backend_pid()"
    )
    with closing(odbc(connection_string(prefix, "postgres"), autocommit=True)) as admin:
        for name in names:
            try:
                admin.execute(terminate, name)
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except pyodbc.Error as error:
                print(f"could not drop database {name}: {error}", file=sys.stderr)


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(
    args: argparse.Namespace,
    bench: Bench,
    seconds: dict[str, list[float]],
    checks: dict[str, list[str]],
) -> dict[str, Any]:
    rates = {key: [args.messages / s for s in runs] for key, runs in seconds.items()}
    median = {key: statistics.median(runs) for key, runs in rates.items()}
    rows = [
        {
            "key": key,
            "label": label,
            "msg_per_s_median": round(median[key], 1),
            "msg_per_s_runs": [round(rate, 1) for rate in rates[key]],
            "vs_naive": median[key] / median["naive"],
            "vs_ceiling": median[key] / median["ceiling"],
            "exactly_once": checks.get(key, []),
        }
        for key, label in LABELS.items()
    ]
    parameters = {k: getattr(args, k) for k in ("messages", "body_bytes", "batch_size", "repeat")}
    return {
        "parameters": parameters,
        "postgresql": bench.version,
        "cpus": os.cpu_count(),
        "daemon_first_row_seconds_median": median_or_none(bench.first_row),
        "daemon_after_first_row_msg_per_s_median": median_or_none(bench.after_first),
        "measurements": rows,
    }


def print_table(summary: dict[str, Any]) -> None:
    p = summary["parameters"]
    print(
        f"sfbridge forwarding: {p['messages']} messages x {p['body_bytes']} B body, batch "
        f"{p['batch_size']}, median of {p['repeat']} (PostgreSQL {summary['postgresql']}, "
        f"{summary['cpus']} CPUs)\n"
        f"{'measurement':<40}{'msg/s':>8}{'min-max':>14}{'vs B naive':>12}{'vs A ceiling':>14}"
        "  exactly-once"
    )
    for m in summary["measurements"]:
        runs, checks = m["msg_per_s_runs"], m["exactly_once"]
        spread = f"{min(runs):.0f}-{max(runs):.0f}"
        check = f"{checks.count('ok')}/{len(checks)} ok" if checks else "-"
        print(
            f"{m['label']:<40}{m['msg_per_s_median']:>8.0f}{spread:>14}{m['vs_naive']:>12.3g}"
            f"{m['vs_ceiling']:>14.3g}  {check}"
        )
        for failure in sorted({c for c in checks if c != "ok"}):
            print(f"    {failure}")
    first_row = summary["daemon_first_row_seconds_median"]
    if first_row is not None:
        print(
            f"(daemon: {first_row:.2f} s from process start to the first delivered row, then "
            f"{summary['daemon_after_first_row_msg_per_s_median']:.0f} msg/s; medians)"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=5000, help="messages per run")
    parser.add_argument("--body-bytes", type=int, default=1024, help="body size in bytes")
    parser.add_argument("--batch-size", type=int, default=100, help="sfbridge batch_size")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args()
    prefix = os.environ.get("SFBRIDGE_BENCH_PG", DEFAULT_PREFIX)
    tag = f"sfbench_{secrets.token_hex(4)}"
    created: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="sfbench-"))
    bench: Bench | None = None

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        create_databases(prefix, [f"{tag}_src", f"{tag}_dst"], created)
        src, dst = (connection_string(prefix, name) for name in created)
        bench = Bench(args, src, dst, workdir)
        runs = {"ceiling": bench.ceiling, "naive": bench.naive}
        runs |= {"worker": bench.one_worker, "daemon": bench.run_daemon}
        seconds: dict[str, list[float]] = defaultdict(list)
        checks: dict[str, list[str]] = defaultdict(list)
        for round_number in range(1, args.repeat + 1):  # interleaved: drift hits all alike
            for key, run in runs.items():
                elapsed, check = run(bench.prefill())
                seconds[key].append(elapsed)
                checks[key] += [check] if check else []
                print(
                    f"round {round_number}/{args.repeat} {key:<8}{args.messages / elapsed:>9.0f}"
                    f" msg/s  {check or ''}",
                    file=sys.stderr,
                )
        summary = summarize(args, bench, seconds, checks)
        if args.json:
            print(json.dumps(summary, indent=2))
        else:
            print_table(summary)
        return 0 if all(c == "ok" for found in checks.values() for c in found) else 1
    except KeyboardInterrupt:
        print("interrupted; dropping the benchmark databases", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if bench is not None:
            bench.close()
        if created:
            drop_databases(prefix, created)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
