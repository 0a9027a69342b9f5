"""Spark drain throughput against the daemon and the server-side ceiling, as ratios in one run.

Reuses forwarding_benchmark.py's databases, prefill, ceiling, daemon and exactly-once checks
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

from forwarding_benchmark import (
    DEFAULT_PREFIX,
    Bench,
    connection_string,
    create_databases,
    drop_databases,
)

SPARK_YAML = """\
databases:
  src: {{dialect: postgresql, connection: "{src}"}}
  dst: {{dialect: postgresql, connection: "{dst}"}}
forwarders:
  - {{name: bench, database: src, queue: bench_forward, error_queue: bench_error,
     batch_size: {batch}}}
routes:
  - {{match: "*", database: dst}}
logging: {{level: WARNING}}
"""
STARTED = re.compile(r"Spark session started in ([0-9.]+) s")
FINISHED = re.compile(r"drain finished in ([0-9.]+) s")


def spark_drain(config: Path, partitions: int) -> tuple[float, float, str]:
    """(session start-up s, drain s, output) of one `sfbridge spark drain`."""
    command = [sys.executable, "-m", "bridge", "-c", str(config), "spark", "drain",
               "--master", f"local[{partitions}]", "--partitions", str(partitions)]  # fmt: skip
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
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
    args.repeat = 1
    prefix = os.environ.get("SFBRIDGE_BENCH_PG", DEFAULT_PREFIX)
    tag = secrets.token_hex(4)
    names = [f"sfbench_{tag}_src", f"sfbench_{tag}_dst"]
    created: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="sfbench-spark-"))
    failed = False
    try:
        create_databases(prefix, names, created)
        src, dst = (connection_string(prefix, name) for name in names)
        bench = Bench(args, src, dst, workdir)
        config = workdir / "spark.yaml"
        config.write_text(SPARK_YAML.format(src=src, dst=dst, batch=args.batch_size))
        rates: dict[str, float] = {}
        startups: list[float] = []
        checks: dict[str, str] = {}
        for key, run in (("ceiling", bench.ceiling), ("daemon", bench.run_daemon)):
            ids = bench.prefill()
            print(f"{key}: {args.messages} messages ...", file=sys.stderr, flush=True)
            seconds, check = run(ids)
            rates[key] = args.messages / seconds
            checks[key] = check or "-"
        for partitions in (int(p) for p in args.partitions.split(",")):
            ids = bench.prefill()
            print(f"spark drain, {partitions} partition(s) ...", file=sys.stderr, flush=True)
            startup, seconds, _ = spark_drain(config, partitions)
            startups.append(startup)
            key = f"spark-{partitions}"
            rates[key] = args.messages / seconds
            checks[key] = bench.exactly_once(ids)
        bench.close()
        failed = any(check not in ("ok", "-") for check in checks.values())
        print(
            f"sfbridge Spark drain: {args.messages} messages x {args.body_bytes} B, batch "
            f"{args.batch_size}, PostgreSQL {bench.version}, {os.cpu_count()} CPUs, one run each"
        )
        print(f"{'measurement':34} {'msg/s':>8} {'vs daemon':>10} {'vs ceiling':>11}  exactly-once")
        labels = {"ceiling": "ceiling: one DELETE..INSERT", "daemon": "daemon, concurrency 2"}
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
        drop_databases(prefix, created)
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
