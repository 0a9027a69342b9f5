"""Single messages trickling in: what each costs the forwarding database, and how soon it
arrives, with the workers in one process and at the defaults (worker processes).

PG -> PG, 1 KiB bodies. Each round runs `sfbridge run` once with `daemon.processes: 1` and once
at the defaults, and sends N messages one at a time (each in its own transaction, as an
endpoint does, 50-150 ms apart), each timed from its commit to its arrival in the destination
queue. The forwarding database's transactions (`pg_stat_database`, read before the daemon
starts and after it stopped, so every one of its backends has reported), less the sends (what
N sends cost with no daemon running: psqlODBC's autocommit makes four of each) and less those of
a run of the same daemon as long with no messages (its start, stop, heartbeats and looks), per
message, say what each message cost the daemon: a worker process that races the daemon's
own workers for every message shows as a claim more per message. Every run is checked for
exactly-once delivery. Prints medians over the rounds and ratios to `processes: 1`;
`--previous-rev REV` adds a row for git revision REV of this repository at its defaults.

    .venv/bin/python bench/trickle_benchmark.py --messages 100 --rounds 3
    .venv/bin/python bench/trickle_benchmark.py --previous-rev c6106d0
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from forwarding_benchmark import Run, extract_revision
from throughput.daemon import Daemon, write_config
from throughput.databases import DEFAULT_PG_PREFIX, QUEUE, PgDatabase, new_messages
from throughput.latency import send_one_and_wait

MODES = ("1", "auto")
GAP = (0.05, 0.15)  # seconds between sends


def transactions(database: PgDatabase) -> int:
    """Transactions committed and rolled back in `database`, as reported so far (this
    session's own first)."""
    database.connection.execute("SELECT pg_stat_force_next_flush()")
    database.connection.execute("SELECT pg_stat_clear_snapshot()")
    return int(
        database.connection.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchval()
    )


def send_cost(scenario: Any, body: bytes, count: int = 50) -> float:
    """Transactions one send makes in the forwarding database, with no daemon running."""
    scenario.prepare(0, body)
    spent = []
    for sends in (0, count):  # reading costs transactions too: a read with no sends between
        before = transactions(scenario.source)
        for _ in range(sends):
            ((_, headers),) = new_messages(1)
            scenario.source.send_one(QUEUE, headers, body)
        spent.append(transactions(scenario.source) - before)
    return (spent[1] - spent[0]) / count


def one_run(
    scenario: Any,
    processes: str,
    messages: int,
    body: bytes,
    per_send: float,
    code: str | None = None,
) -> dict[str, Any]:
    """The trickle, and a run as long without it: transactions per message between them.
    `code`: the folder of another sfbridge to run (at its defaults)."""
    result = _trickle(scenario, processes, messages, body, None, code)
    idle = _trickle(scenario, processes, 0, body, result["seconds"], code)
    spent = result["spent"] - idle["spent"] - per_send * messages
    result["transactions_per_message"] = spent / messages
    return result


def _trickle(
    scenario: Any,
    processes: str,
    messages: int,
    body: bytes,
    seconds: float | None,
    code: str | None,
) -> dict[str, Any]:
    """`messages` single sends (or none, the daemon left running `seconds` after READY)."""
    scenario.prepare(0, body)
    config = scenario.daemon_config({}, {})
    if code is None:
        config["daemon"] = {"processes": processes}
    path = write_config(scenario.workdir / f"trickle-{processes}.yaml", config)
    source = scenario.source
    before = transactions(source)
    latencies: list[float] = []
    ids: set[str] = set()
    log = scenario.workdir / "trickle.log"
    with Daemon(path, scenario.environment, log, cwd=code) as daemon:
        daemon.wait_ready()
        ready = time.perf_counter()
        if seconds is not None:
            time.sleep(seconds)
        for number in range(1, messages + 1):
            message_id, latency = send_one_and_wait(scenario, daemon, number, body, GAP)
            ids.add(message_id)
            latencies.append(latency)
        elapsed = time.perf_counter() - ready
        code = daemon.stop()
    spent = transactions(source) - before
    check = scenario.exactly_once(ids)
    if code != 0:
        check = f"FAILED: exit code {code} after SIGTERM; {check}"
    return {
        "spent": spent,
        "seconds": elapsed,
        "median_ms": statistics.median(latencies) if latencies else 0.0,
        "p95_ms": statistics.quantiles(latencies, n=20, method="inclusive")[18]
        if len(latencies) > 1
        else 0.0,
        "exactly_once": check,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--previous-rev", help="also run this git revision at its defaults")
    args = parser.parse_args()
    run = Run(os.environ.get("SFBRIDGE_BENCH_PG", DEFAULT_PG_PREFIX))
    modes = [*MODES, *(["previous"] if args.previous_rev else [])]
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    failed = False
    try:
        previous = extract_revision(args.previous_rev, run.workdir) if args.previous_rev else None
        scenario, _ = run.pg_pg_defaults()
        body = os.urandom(1024)
        per_send = send_cost(scenario, body)
        print(f"a send: {per_send:.2f} transactions", file=sys.stderr, flush=True)
        for round_number in range(1, args.rounds + 1):
            for mode in modes:
                code = previous if mode == "previous" else None
                result = one_run(scenario, mode, args.messages, body, per_send, code)
                results[mode].append(result)
                failed |= result["exactly_once"] != "ok"
                print(
                    f"round {round_number}, {_label(mode, args.previous_rev)}: "
                    f"{result['transactions_per_message']:.2f} transactions per message, "
                    f"pickup median {result['median_ms']:.1f} ms, p95 {result['p95_ms']:.1f} ms, "
                    f"exactly-once {result['exactly_once']}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        run.close()
    print(f"{args.messages} single messages per run, medians of {args.rounds} rounds:")
    print(f"  {'daemon':<28}{'xact/msg':>10}{'x':>7}{'median ms':>11}{'x':>7}{'p95 ms':>8}")
    base = {key: _median(results["1"], key) for key in ("transactions_per_message", "median_ms")}
    for mode in modes:
        spent = _median(results[mode], "transactions_per_message")
        median = _median(results[mode], "median_ms")
        ratio = spent / base["transactions_per_message"]
        print(
            f"  {_label(mode, args.previous_rev):<28}{spent:>10.2f}{ratio:>7.2f}"
            f"{median:>11.1f}{median / base['median_ms']:>7.2f}"
            f"{_median(results[mode], 'p95_ms'):>8.1f}"
        )
    return 1 if failed else 0


def _label(mode: str, previous_rev: str | None) -> str:
    return f"previous code ({previous_rev})" if mode == "previous" else f"processes: {mode}"


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(row[key] for row in rows))


if __name__ == "__main__":
    sys.exit(main())
