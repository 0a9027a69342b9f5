"""Where the bridge's CPU goes, in-process: one worker forwards N messages PG -> PG.

Fresh source and destination databases (installed by `sfbridge install`, the destination queue
as its transport creates it), the source queue filled with N 1 KiB messages as the forwarding
benchmark fills it; then one `BatchForwarder` in this process forwards batches until the queue
is empty. Prints per message: wall time, this process's CPU and the two server backends' CPU
(from /proc, so PostgreSQL must run on this machine), and checks every message arrived exactly
once. With `--profile`, the top of a cProfile of the forwarding loop. Databases are dropped at
the end. See bench/README.md.

    .venv/bin/python bench/profile_forwarding.py --messages 100000 --repeat 3 [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import secrets
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from forwarding_benchmark import Run
from throughput.databases import DEFAULT_PG_PREFIX
from throughput.scenarios import Scenario

from bridge.config import load_config
from bridge.connections import Connections
from bridge.forwarding import spine
from bridge.forwarding.spine import BatchForwarder


def backend_cpu(pid: int) -> float:
    """User + system seconds of one PostgreSQL backend."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def backend_pid(connections: Connections, database: str) -> int:
    connection = connections.get(database)
    pid = int(connection.query("SELECT pg_backend_pid()")[0][0])
    connection.commit()
    return pid


STEPS = ("_claim", "_classify", "_deliver", "_settle", "_commit")


@contextmanager
def timed_steps(enabled: bool) -> Iterator[dict[str, list[float]]]:
    """While open, each step of the spine adds up its wall time and this thread's CPU time."""
    spent = {step: [0.0, 0.0] for step in STEPS}
    originals = {step: getattr(BatchForwarder, step) for step in STEPS}
    for step, original in originals.items() if enabled else ():

        def timed(self: Any, *args: Any, _original: Any = original, _step: str = step) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return _original(self, *args)
            finally:
                spent[_step][0] += time.perf_counter() - wall
                spent[_step][1] += time.thread_time() - cpu

        setattr(BatchForwarder, step, timed)
    try:
        yield spent
    finally:
        for step, original in originals.items():
            setattr(BatchForwarder, step, original)


def forward_all(scenario: Scenario, config_path: Path, messages: int, profile: bool) -> str:
    ids = scenario.prepare(messages, secrets.token_bytes(1024))
    for name, value in scenario.environment.items():
        os.environ[name] = value
    config, _ = load_config(config_path)
    connections = Connections(config.databases)
    try:
        forwarder = BatchForwarder(config, config.forwarders[0], connections)
        pids = [backend_pid(connections, name) for name in ("source", "dest")]
        backends = [backend_cpu(pid) for pid in pids]
        profiler = cProfile.Profile() if profile else None
        with timed_steps(not profile) as spent:
            wall, cpu = time.perf_counter(), time.process_time()
            if profiler:
                profiler.enable()
            while forwarder.forward_batch().claimed:
                pass
            if profiler:
                profiler.disable()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        backends = [backend_cpu(pid) - before for pid, before in zip(pids, backends, strict=True)]
    finally:
        connections.close()
    check = scenario.exactly_once(ids)
    per = 1e6 / messages
    print(
        f"{messages} msgs: {messages / wall:,.0f} msg/s; per message: wall {wall * per:.1f} us, "
        f"bridge CPU {cpu * per:.1f} us, source backend {backends[0] * per:.1f} us, "
        f"destination backend {backends[1] * per:.1f} us; exactly once: {check}",
        flush=True,
    )
    if not profiler:
        print(
            "  per step, wall/CPU us: "
            + ", ".join(
                f"{step[1:]} {spent[step][0] * per:.1f}/{spent[step][1] * per:.1f}"
                for step in STEPS
            ),
            flush=True,
        )
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    return check


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--python-gc",
        action="store_true",
        help="keep Python's garbage collection thresholds (`sfbridge run` raises them)",
    )
    args = parser.parse_args()
    # An older sfbridge (PYTHONPATH=its checkout) has no tuning: it runs as it did.
    tune = getattr(spine, "tune_garbage_collection", None)
    if tune is not None and not args.python_gc:
        tune()
    prefix = os.environ.get("SFBRIDGE_BENCH_PG", DEFAULT_PG_PREFIX)
    run = Run(prefix)
    try:
        scenario, config_path = run.pg_pg_defaults()
        checks = [
            forward_all(scenario, config_path, args.messages, args.profile)
            for _ in range(args.repeat)
        ]
    finally:
        run.close()
    return 0 if all(check == "ok" for check in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
