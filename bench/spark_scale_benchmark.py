"""Spark reconcile and report as the rows grow: wall time and the driver's peak memory.

For each size N: a destination database holds N delivered messages (queue rows and their ledger
entries) and a forwarding database's error queue N failed messages, written server-side; then
`sfbridge spark reconcile` and `sfbridge spark report` run on `--master` (default local[2]) as a
user runs them. Printed per command and size: the wall time, and the peak resident memory
(the kernel's high-water mark, VmHWM) of the driver's Python process, of the driver's JVM (in
local mode it also runs the executors' JVM side) and of the largest Python worker, with each
figure's ratio to the smallest size measured in the same run, so growth shows. Before each
reconcile one ledger entry and one queue row are deleted: the reconcile must exit 1 naming both
ids, and the report must count N failed messages, else this script exits 1. Nothing is asserted
on timings.

The databases live in a private PostgreSQL cluster this script starts (initdb in a temp folder,
a free port, fsync off) and removes at the end, so millions of rows neither starve nor are
disturbed by other users of the machine's server.

    .venv/bin/python bench/spark_scale_benchmark.py --rows 100000,1000000,3000000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from outage_soak import Cluster

RECEIVER, FORWARD, ERROR = "Receiver", "forward", "error"
CANONICAL_RECEIVER = '"public"."Receiver"'
QUEUE_DDL = (
    'CREATE TABLE IF NOT EXISTS "public"."{}" (Id uuid NOT NULL PRIMARY KEY, Expires timestamp, '
    "Headers text NOT NULL, Body bytea, Seq serial NOT NULL UNIQUE)"
)
# The headers an NServiceBus endpoint writes (about 600 bytes), the message id from `m.id`.
HEADERS_SQL = """json_build_object(
    'NServiceBus.MessageId', m.id,
    'NServiceBus.MessageIntent', 'Send',
    'NServiceBus.ConversationId', gen_random_uuid()::text,
    'NServiceBus.CorrelationId', m.id,
    'NServiceBus.OriginatingEndpoint', 'Sales',
    'NServiceBus.OriginatingMachine', 'sales-host-01',
    'NServiceBus.OriginatingHostId', gen_random_uuid()::text,
    'NServiceBus.ReplyToAddress', 'Sales@public',
    'NServiceBus.ContentType', 'application/json',
    'NServiceBus.EnclosedMessageTypes',
        'Sales.Messages.OrderPlaced, Sales.Messages, Version=1.0.0.0, Culture=neutral, '
        || 'PublicKeyToken=null',
    'NServiceBus.Version', '9.2.3',
    'NServiceBus.TimeSent', '2026-11-23 10:00:00:000000 Z'
    {extra})::text"""
FAILURE_SQL = """,
    '$.sfbridge.failure-reason', (ARRAY['missing-queue', 'unroutable', 'poison',
                                        'retries-exhausted'])[1 + m.n %% 4],
    '$.store-and-forward.destination', 'Shipping' || (m.n %% 7),
    'NServiceBus.ExceptionInfo.ExceptionType', 'SFBridge.DeliveryFailed' || (m.n %% 3),
    '$.sfbridge.attempts', (m.n %% 5)::text,
    'NServiceBus.TimeOfFailure', to_char(now() AT TIME ZONE 'UTC' - (m.n %% 200) * interval
                                         '17 minutes', 'YYYY-MM-DD HH24:MI:SS:US') || ' Z'"""


@dataclass
class Peaks:
    """Peak resident memory (MB) by role, sampled from /proc while a command runs."""

    driver_python: float = 0.0
    driver_jvm: float = 0.0
    worker_python: float = 0.0
    seen: dict[int, str] = field(default_factory=dict)


def _children(pid: int) -> list[int]:
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        found: list[int] = []
        for task in tasks:
            text = (task / "children").read_text()
            found += [int(child) for child in text.split()]
        return found
    except OSError:
        return []


def _hwm_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _sample(root: int, peaks: Peaks, done: threading.Event) -> None:
    while not done.wait(0.1):
        pending, tree = [root], []
        while pending:
            pid = pending.pop()
            tree.append(pid)
            pending += _children(pid)
        for pid in tree:
            # Read each time: the launcher scripts exec the JVM under their own pid.
            try:
                peaks.seen[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            hwm = _hwm_mb(pid)
            if pid == root:
                peaks.driver_python = max(peaks.driver_python, hwm)
            elif peaks.seen[pid] == "java":
                peaks.driver_jvm = max(peaks.driver_jvm, hwm)
            elif peaks.seen[pid].startswith("python"):
                peaks.worker_python = max(peaks.worker_python, hwm)


def run_measured(
    command: list[str], env: dict[str, str], timeout: float
) -> tuple[int | None, str, float, Peaks]:
    """(exit status, None if killed at `timeout`; output, wall seconds, peaks) of a command,
    run outside this checkout (`python -m bridge` imports the sfbridge of its PYTHONPATH)."""
    peaks, done = Peaks(), threading.Event()
    started = time.monotonic()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    sampler = threading.Thread(target=_sample, args=(process.pid, peaks, done), daemon=True)
    sampler.start()
    status: int | None
    try:
        output, _ = process.communicate(timeout=timeout)
        status = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        status = None
    took = time.monotonic() - started
    done.set()
    sampler.join()
    return status, output, took, peaks


def fill(cluster: Cluster, rows: int) -> tuple[str, str]:
    """N delivered messages in the receiver, N failed ones in the sender's error queue; then one
    ledger entry and one queue row deleted. Returns (id without its queue row, id without its
    ledger entry)."""
    with psycopg.connect(f"host=127.0.0.1 port={cluster.port} user=postgres dbname=receiver",
                         autocommit=True) as receiver:  # fmt: skip
        receiver.execute(f'TRUNCATE "public"."{RECEIVER}", sfbridge_ledger')
        receiver.execute(
            "CREATE TEMP TABLE ids AS SELECT gen_random_uuid()::text AS id, n "
            "FROM generate_series(1, %s) AS n",
            (rows,),
        )
        headers = HEADERS_SQL.format(extra="")
        receiver.execute(
            f'INSERT INTO "public"."{RECEIVER}" (id, headers, body) '
            f"SELECT gen_random_uuid(), {headers}, '\\x7b7d'::bytea FROM ids AS m ORDER BY m.n"
        )
        receiver.execute(
            "INSERT INTO sfbridge_ledger (message_id, destination, forwarded_at) "
            "SELECT id, %s, now() AT TIME ZONE 'UTC' FROM ids",
            (CANONICAL_RECEIVER,),
        )
        [(gone,)] = receiver.execute(
            f'DELETE FROM "public"."{RECEIVER}" WHERE seq = (SELECT min(seq) + 7 FROM '
            f'"public"."{RECEIVER}") RETURNING headers::json->>\'NServiceBus.MessageId\''
        ).fetchall()
        [(unrecorded,)] = receiver.execute(
            "DELETE FROM sfbridge_ledger WHERE message_id = (SELECT max(message_id) FROM "
            "sfbridge_ledger) RETURNING message_id"
        ).fetchall()
        receiver.execute(f'VACUUM ANALYZE "public"."{RECEIVER}"')
        receiver.execute("VACUUM ANALYZE sfbridge_ledger")
    with psycopg.connect(f"host=127.0.0.1 port={cluster.port} user=postgres dbname=sender",
                         autocommit=True) as sender:  # fmt: skip
        sender.execute(f'TRUNCATE "public"."{ERROR}", sfbridge_counters')
        headers = HEADERS_SQL.format(extra=FAILURE_SQL)
        sender.execute(
            f'INSERT INTO "public"."{ERROR}" (id, headers, body) '
            f"SELECT gen_random_uuid(), {headers}, '\\x7b7d'::bytea "
            "FROM (SELECT gen_random_uuid()::text AS id, n FROM generate_series(1, %s) AS n) m",
            (rows,),
        )
        # What the batches that delivered those messages counted: the forwarder reconciles.
        sender.execute(
            "INSERT INTO sfbridge_counters (forwarder, counter, slot, value) VALUES "
            "('f', 'claimed', 0, %s), ('f', 'delivered', 0, %s)",
            (rows, rows),
        )
        sender.execute(f'VACUUM ANALYZE "public"."{ERROR}"')
    return gone, unrecorded


@dataclass(frozen=True)
class Measured:
    code: str  # "this" or "previous"
    command: str
    rows: int
    finished: bool
    seconds: float
    peaks: Peaks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="100000,1000000,3000000")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default=None, help="--driver-memory for sfbridge")
    parser.add_argument(
        "--previous-code", metavar="DIR",
        help="also run the sfbridge checked out in DIR (e.g. `git worktree add /tmp/before "
        "<commit>`), each command killed after --previous-timeout",
    )  # fmt: skip
    parser.add_argument("--previous-timeout", type=float, default=900.0)
    args = parser.parse_args()
    sizes = [int(size) for size in args.rows.split(",")]
    cluster = Cluster()
    workdir = Path(tempfile.mkdtemp(prefix="sfbench-spark-scale-"))
    failed = False
    results: list[Measured] = []
    try:
        config = _setup(cluster, workdir)
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
        codes = {"this": (env, [])}
        if args.driver_memory:
            codes["this"] = (env, ["--driver-memory", args.driver_memory])
        if args.previous_code:
            previous = {**env, "PYTHONPATH": str(Path(args.previous_code).resolve())}
            codes["previous"] = (previous, [])
        for rows in sizes:
            print(f"filling {rows:,} rows ...", file=sys.stderr, flush=True)
            gone, unrecorded = fill(cluster, rows)
            for code, (code_env, options) in codes.items():
                timeout = 7200.0 if code == "this" else args.previous_timeout
                sfbridge = [sys.executable, "-m", "bridge", "-c", str(config), "spark"]
                spark = ["--master", args.master, *options]
                print(f"{code}: spark reconcile, {rows:,} ...", file=sys.stderr, flush=True)
                status, output, took, peaks = run_measured(
                    [*sfbridge, "reconcile", *spark], code_env, timeout
                )
                named = (
                    f"not in the queue: {gone}" in output
                    and f"without a ledger entry: {unrecorded}" in output
                )
                if status is not None and (status != 1 or not named) and code == "this":
                    failed = True
                    print(f"reconcile at {rows}: exit {status}, named: {named}\n{output[-3000:]}")
                results.append(Measured(code, "reconcile", rows, status == 1, took, peaks))
                print(f"{code}: spark report, {rows:,} ...", file=sys.stderr, flush=True)
                report = workdir / f"report-{code}-{rows}"
                status, output, took, peaks = run_measured(
                    [*sfbridge, "report", *spark, "--report", str(report)], code_env, timeout
                )
                counted = (
                    json.loads(report.with_suffix(".json").read_text())["error_queue"]["messages"]
                    if status == 0
                    else None
                )
                if status is not None and counted != rows and code == "this":
                    failed = True
                    print(f"report at {rows}: exit {status}, counted {counted}\n{output[-3000:]}")
                results.append(Measured(code, "report", rows, counted == rows, took, peaks))
        print_table(results, args.master)
    finally:
        cluster.remove()
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


def _setup(cluster: Cluster, workdir: Path) -> Path:
    """The two databases, the bridge's tables and the destination queue; returns the YAML."""
    with psycopg.connect(f"host=127.0.0.1 port={cluster.port} user=postgres dbname=postgres",
                         autocommit=True) as admin:  # fmt: skip
        admin.execute("CREATE DATABASE sender")
        admin.execute("CREATE DATABASE receiver")
    config = workdir / "sfbridge.yaml"
    prefix = f"Server=127.0.0.1;Port={cluster.port};Uid=postgres;"
    databases = {
        name: {"dialect": "postgresql", "connection": f"{prefix}Database={name}"}
        for name in ("sender", "receiver")
    }
    config.write_text(
        json.dumps(
            {
                "databases": databases,
                "forwarders": [{"name": "f", "database": "sender", "queue": FORWARD}],
                "routes": [{"match": RECEIVER, "database": "receiver"}],
            }
        )
    )
    install = [sys.executable, "-m", "bridge", "-c", str(config), "install"]
    subprocess.run(install, check=True, capture_output=True)
    with psycopg.connect(f"host=127.0.0.1 port={cluster.port} user=postgres dbname=receiver",
                         autocommit=True) as receiver:  # fmt: skip
        receiver.execute(QUEUE_DDL.format(RECEIVER))
    return config


def print_table(results: list[Measured], master: str) -> None:
    print(
        f"sfbridge spark reconcile / report on {master}, {os.cpu_count()} CPUs. Peak resident "
        "memory (MB) of the driver's Python and JVM and of the largest Python worker, each x "
        "the same command's at the smallest size"
    )
    print(
        f"{'code':8} {'command':10} {'rows':>10} {'wall s':>8} {'driver Python':>15} "
        f"{'driver JVM':>15} {'largest worker':>15}"
    )
    smallest: dict[tuple[str, str], Peaks] = {}
    for result in results:
        peaks = result.peaks
        base = smallest.setdefault((result.code, result.command), peaks)

        def shown(value: float, reference: float) -> str:
            ratio = value / reference if reference else 0
            return f"{value:6.0f} (x{ratio:4.1f})"

        wall = f"{result.seconds:8.1f}" if result.finished else f"{'FAILED':>8}"
        print(
            f"{result.code:8} {result.command:10} {result.rows:>10,} {wall} "
            f"{shown(peaks.driver_python, base.driver_python):>15} "
            f"{shown(peaks.driver_jvm, base.driver_jvm):>15} "
            f"{shown(peaks.worker_python, base.worker_python):>15}"
        )


if __name__ == "__main__":
    sys.exit(main())
