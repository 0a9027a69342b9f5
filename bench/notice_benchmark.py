"""Where polling is the only way (SQLite, SQL Server, a PostgreSQL table without the push
trigger): how soon the daemon's watcher notices one message in one of N queues.

In this process, the real `WorkWatcher` of the sfbridge on `PYTHONPATH` (so the same script
measures another checkout: `PYTHONPATH=DIR`) watches a database of N forwarders at the default
`peek_interval` (50 ms). One message at a time goes into a queue drawn at random, committed;
the time from its commit until the watcher has marked that forwarder on its board (what a
pool worker waits for) is the notice time. The row is then deleted, as a worker would. Per
dialect and N: notice p50 / p95 / max in ms, the watcher's statements per second (its cost
on the server) and this process's CPU (the watcher's, and the sends': % of one core). On
PostgreSQL every forwarding queue's push trigger is dropped, so that every queue is polled;
retry storage keeps its trigger, as `sfbridge install` leaves it.

    .venv/bin/python bench/notice_benchmark.py --forwarders 50,500 --messages 100
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from forwarding_benchmark import Run
from throughput.daemon import write_config
from throughput.databases import DEFAULT_PG_PREFIX, PgDatabase, SqliteDatabase, new_messages

from bridge.commands.install import run_install
from bridge.config import load_config
from bridge.daemon.board import WorkBoard
from bridge.daemon.forwarder_health import ForwarderHealth
from bridge.daemon.watcher import WorkWatcher


def measure(
    config_entry: dict[str, Any],
    environment: dict[str, str],
    count: int,
    messages: int,
    workdir: Path,
    send: Any,
    remove: Any,
    prepare: Any,
) -> dict[str, Any]:
    names = [f"notice_{index}" for index in range(count)]
    path = write_config(
        workdir / f"notice-{count}.yaml",
        {
            "databases": {"source": config_entry, "dest": config_entry},
            "forwarders": [{"name": n, "database": "source", "queue": n} for n in names],
            "routes": [{"match": "*", "database": "dest"}],
        },
    )
    os.environ.update(environment)
    config, _ = load_config(path)
    run_install(config)
    prepare(names)
    board = WorkBoard({name: 1 for name in names})
    stop = threading.Event()
    watcher = WorkWatcher(config, "source", board, stop, ForwarderHealth())
    watcher.start()
    latencies = []
    try:
        time.sleep(2.0)  # the first looks (and on PostgreSQL, listening) are done
        while (entry := board.take(0)) is not None:
            board.finish(entry)
        queries, started = watcher.queries, time.perf_counter()
        cpu = time.process_time()
        for _ in range(messages):
            time.sleep(random.uniform(0.05, 0.15))
            name = random.choice(names)
            send(name)
            committed = time.perf_counter()
            while True:
                entry = board.take(10)
                if entry is None:
                    raise RuntimeError(f"{name} not noticed within 10 s")
                if entry.key == (name, "queue"):
                    break
                board.finish(entry)
            latencies.append(1000 * (time.perf_counter() - committed))
            remove(name)
            board.finish(entry)
        elapsed = time.perf_counter() - started
        per_second = (watcher.queries - queries) / elapsed
        cpu_percent = 100 * (time.process_time() - cpu) / elapsed
    finally:
        stop.set()
        board.close()
        watcher.wake()
        watcher.join(10)
    return {
        "forwarders": count,
        "p50_ms": statistics.median(latencies),
        "p95_ms": statistics.quantiles(latencies, n=20, method="inclusive")[18],
        "max_ms": max(latencies),
        "statements_per_s": per_second,
        "cpu_percent": cpu_percent,
    }


def sqlite_rows(counts: list[int], messages: int) -> list[dict[str, Any]]:
    rows = []
    for count in counts:
        with tempfile.TemporaryDirectory(prefix="sfnotice-") as folder:
            database = SqliteDatabase(Path(folder) / "source.db")

            def send(table: str, database: SqliteDatabase = database) -> None:
                ((_, headers),) = new_messages(1)
                database.send_one(table, headers, b"x")

            def remove(table: str, database: SqliteDatabase = database) -> None:
                database.clear([table])

            entry = {"dialect": "sqlite", "path": str(database.path)}
            row = measure(entry, {}, count, messages, Path(folder), send, remove, _nothing)
            rows.append({"dialect": "SQLite", **row})
            database.close()
    return rows


def postgresql_rows(run: Run, counts: list[int], messages: int) -> list[dict[str, Any]]:
    rows = []
    for count in counts:
        database = run.database("PG", f"notice-{count}")
        assert isinstance(database, PgDatabase)

        def send(table: str, database: PgDatabase = database) -> None:
            ((_, headers),) = new_messages(1)
            database.send_one(table, headers, b"x")

        def remove(table: str, database: PgDatabase = database) -> None:
            database.clear([table])

        def drop_triggers(names: list[str], database: PgDatabase = database) -> None:
            for name in names:
                database.connection.execute(f'DROP TRIGGER sfbridge_notify ON "{name}"')

        row = measure(
            database.config_entry(),
            database.environment(),
            count,
            messages,
            run.workdir,
            send,
            remove,
            drop_triggers,
        )
        rows.append({"dialect": "PostgreSQL, no push trigger", **row})
    return rows


def _nothing(names: list[str]) -> None:
    """SQLite needs no preparing: it has no push."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forwarders", default="50,500")
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--dialects", default="sqlite,postgresql")
    args = parser.parse_args()
    counts = [int(value) for value in args.forwarders.split(",") if value.strip()]
    dialects = args.dialects.split(",")
    rows = sqlite_rows(counts, args.messages) if "sqlite" in dialects else []
    if "postgresql" in dialects:
        run = Run(os.environ.get("SFBENCH_PG", DEFAULT_PG_PREFIX))
        try:
            rows += postgresql_rows(run, counts, args.messages)
        finally:
            run.close()
    print(
        f"time to notice one message, peek_interval 50 ms, {args.messages} messages; load "
        f"average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    for row in rows:
        print(
            f"  {row['dialect']:<28} {row['forwarders']:>4} forwarders  p50 {row['p50_ms']:6.1f}"
            f" ms  p95 {row['p95_ms']:6.1f} ms  max {row['max_ms']:6.1f} ms  "
            f"{row['statements_per_s']:6.1f} statements/s  CPU {row['cpu_percent']:5.1f} % of a "
            "core (this process: the watcher, and the sends)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
