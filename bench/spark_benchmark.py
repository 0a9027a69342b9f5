"""Spark drain throughput against the daemon and the server-side ceiling, as ratios in one run.

Reuses the throughput benchmark's databases, prefill, ceiling, daemon and exactly-once checks
(PostgreSQL -> PostgreSQL, NServiceBus-shaped messages, random 1 KiB bodies), and adds
`sfbridge spark drain` with 1, 2 and 4 partitions on `local[N]`. A drain is timed from the
moment its tasks start moving messages (its own progress lines) to the end of the drain, and
Spark's session start-up is reported on its own. Prints; asserts nothing on timings; exit 1
when an exactly-once check failed.

    .venv/bin/python bench/spark_benchmark.py --messages 200000
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput.daemon import write_config
from throughput.databases import (
    DEFAULT_PG_PREFIX,
    PgDatabase,
    create_pg_databases,
    drop_pg_databases,
    pg_server_version,
)
from throughput.scenarios import RowSpec, Scenario, run_scenario, stderr

STARTED = re.compile(r"Spark session started in ([0-9.]+) s")
FINISHED = re.compile(r"drain finished in ([0-9.]+) s")


def spark_drain(
    config: Path, partitions: int, environment: dict[str, str]
) -> tuple[float, float, str]:
    """(session start-up s, drain s, output) of one `sfbridge spark drain`."""
    command = [sys.executable, "-m", "bridge", "-c", str(config), "spark", "drain",
               "--master", f"local[{partitions}]", "--partitions", str(partitions)]  # fmt: skip
    env = {**os.environ, **environment, "SPARK_LOCAL_IP": "127.0.0.1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    output = result.stdout + result.stderr
    started, finished = STARTED.search(output), FINISHED.search(output)
    if result.returncode != 0 or not started or not finished:
        raise RuntimeError(f"spark drain failed (exit {result.returncode}):\n{output[-3000:]}")
    return float(started.group(1)), float(finished.group(1)), output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--partitions", default="1,2,4")
    args = parser.parse_args()
    prefix = os.environ.get("SFBRIDGE_BENCH_PG", DEFAULT_PG_PREFIX)
    tag = secrets.token_hex(4)
    names = [f"sfbench_{tag}_src", f"sfbench_{tag}_dst"]
    created: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="sfbench-spark-"))
    databases: list[PgDatabase] = []
    failed = False
    try:
        create_pg_databases(prefix, names, created)
        databases += [PgDatabase(prefix, names[0], "SFBENCH_SRC_ODBC")]
        databases += [PgDatabase(prefix, names[1], "SFBENCH_DST_ODBC")]
        scenario = Scenario("PG -> PG", *databases, workdir, True, stderr)
        forwarder_keys = {"batch_size": args.batch_size}
        config = write_config(workdir / "spark.yaml", scenario.daemon_config(forwarder_keys, {}))
        body = os.urandom(args.body_bytes)
        specs = [
            RowSpec("ceiling", "ceiling: one DELETE..INSERT", "ceiling"),
            RowSpec(
                "daemon", "daemon, concurrency 2", "daemon", {**forwarder_keys, "concurrency": 2}
            ),
        ]
        rates: dict[str, float] = {}
        startups: list[float] = []
        checks: dict[str, str] = {}
        for row in run_scenario(scenario, specs, args.messages, body, 1):
            if row.not_run or row.msg_per_s is None:
                raise RuntimeError(f"{row.spec.label}: {row.not_run}")
            rates[row.spec.key] = row.msg_per_s
            checks[row.spec.key] = row.checks[0]
        for partitions in (int(p) for p in args.partitions.split(",")):
            ids = scenario.prepare(args.messages, body)
            print(f"spark drain, {partitions} partition(s) ...", file=sys.stderr, flush=True)
            startup, seconds, _ = spark_drain(config, partitions, scenario.environment)
            startups.append(startup)
            key = f"spark-{partitions}"
            rates[key] = args.messages / seconds
            checks[key] = scenario.exactly_once(ids)
        failed = any(check not in ("ok", "-") for check in checks.values())
        print(
            f"sfbridge Spark drain: {args.messages} messages x {args.body_bytes} B, batch "
            f"{args.batch_size}, PostgreSQL {pg_server_version(prefix)}, {os.cpu_count()} CPUs, "
            "one run each"
        )
        print(f"{'measurement':34} {'msg/s':>8} {'vs daemon':>10} {'vs ceiling':>11}  exactly-once")
        labels = {spec.key: spec.label for spec in specs}
        for key, rate in rates.items():
            label = labels.get(key) or f"spark drain, {key.removeprefix('spark-')} partition(s)"
            print(
                f"{label:34} {rate:8.0f} {rate / rates['daemon']:10.2f} "
                f"{rate / rates['ceiling']:11.3f}  {checks[key]}"
            )
        print(
            f"Spark session start-up (not in the drain figures): median "
            f"{statistics.median(startups):.1f} s"
        )
    finally:
        for database in databases:
            database.close()
        for problem in drop_pg_databases(prefix, created) if created else []:
            stderr(problem)
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
