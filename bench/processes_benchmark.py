"""The same two workers as threads of one process and in processes of their own, beside the
server-side move.

PG -> PG, 1 KiB bodies. Each round fills the forwarding queue with N messages four times: the
server-side move (as `forwarding_benchmark.py`'s ceiling); one `sfbridge run` with
`daemon.processes: 1` (two workers, threads of one process: the defaults before worker
processes); one `sfbridge run` at the defaults (`processes: auto`: on two CPUs or more, two
processes of one worker each); two `sfbridge run` with `concurrency: 1` (two workers in two
daemons, the workaround before worker processes). Competing workers never take the same row. A
daemon row is timed from the first message's arrival to the last (so two start-ups weigh no
more than one), and checked for exactly-once delivery. Prints msg/s and the ratio to the
server-side move of the same round, and each daemon row against the first. See bench/README.md.

    .venv/bin/python bench/processes_benchmark.py --messages 100000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from forwarding_benchmark import Run
from throughput.baselines import time_ceiling
from throughput.daemon import sfbridge_command, write_config
from throughput.databases import DEFAULT_PG_PREFIX, RECEIVER
from throughput.scenarios import Scenario

ROWS = ("server-side move", "1 daemon, 1 process", "1 daemon, defaults", "2 daemons, 1 worker each")


def daemons_rate(scenario: Scenario, config: Path, processes: int, messages: int) -> float:
    """msg/s of `processes` daemons from the first arrival to the last; raises AssertionError
    when a daemon did not stop cleanly or a message is missing or doubled."""
    environment = {**os.environ, **scenario.environment}
    running = [
        subprocess.Popen(
            sfbridge_command(config, "run"),
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(processes)
    ]
    try:
        deadline = time.monotonic() + 600
        while (first := scenario.destination.count(RECEIVER)) == 0:
            assert time.monotonic() < deadline, "nothing arrived"
            time.sleep(0.005)
        start = time.perf_counter()
        while scenario.arrived() < messages:
            assert time.monotonic() < deadline, "not everything arrived"
            time.sleep(0.02)
        return (messages - first) / (time.perf_counter() - start)
    finally:
        for process in running:
            process.send_signal(signal.SIGTERM)
        codes = [process.wait(60) for process in running]
        assert codes == [0] * processes, f"exit codes after SIGTERM: {codes}"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    run = Run(os.environ.get("SFBRIDGE_BENCH_PG", DEFAULT_PG_PREFIX))
    rates: dict[str, list[float]] = {row: [] for row in ROWS}
    try:
        scenario, config = run.pg_pg_defaults()
        one_worker = write_config(
            config.with_name("one-worker.yaml"), scenario.daemon_config({"concurrency": 1}, {})
        )
        one_process = write_config(
            config.with_name("one-process.yaml"),
            {**scenario.daemon_config({}, {}), "daemon": {"processes": 1}},
        )
        body = secrets.token_bytes(1024)
        for number in range(1, args.rounds + 1):
            ids = scenario.prepare(args.messages, body)
            rates[ROWS[0]].append(args.messages / time_ceiling(scenario.source, args.messages))
            assert scenario.exactly_once(ids, ceiling=True) == "ok"
            for processes, row, yaml in (
                (1, ROWS[1], one_process),
                (1, ROWS[2], config),
                (2, ROWS[3], one_worker),
            ):
                ids = scenario.prepare(args.messages, body)
                rates[row].append(daemons_rate(scenario, yaml, processes, args.messages))
                check = scenario.exactly_once(ids)
                assert check == "ok", f"{row}: {check}"
            move = rates[ROWS[0]][-1]
            print(
                f"round {number}: server-side move {move:,.0f} msg/s; "
                + "; ".join(
                    f"{row} {rates[row][-1]:,.0f} msg/s ({rates[row][-1] / move:.3f} of it)"
                    for row in ROWS[1:]
                ),
                flush=True,
            )
    finally:
        run.close()
    ratios = {
        row: [rate / move for rate, move in zip(rates[row], rates[ROWS[0]], strict=True)]
        for row in ROWS[1:]
    }
    one = statistics.median(rates[ROWS[1]])
    print(
        f"medians of {args.rounds}, every message exactly once: "
        + "; ".join(
            f"{row} {statistics.median(ratios[row]):.3f} of the server-side move "
            f"({min(ratios[row]):.3f}-{max(ratios[row]):.3f})"
            for row in ROWS[1:]
        )
        + f"; the defaults {statistics.median(rates[ROWS[2]]) / one:.2f}x one process"
        + f", two one-worker daemons {statistics.median(rates[ROWS[3]]) / one:.2f}x one process"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
