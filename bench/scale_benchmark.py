"""Configs of production size (issue 37): many forwarders on one forwarding database, and
many destination databases in one config.

PG -> PG, 1 KiB bodies, `sfbridge run` at its defaults in a subprocess (`Daemon`). Per row:

- **READY s**: from the process's start to its READY=1;
- **idle CPU**: the daemon's CPU (% of one core, all its processes) over `--idle-seconds`, no
  traffic, 2 s after READY;
- **pickup**: `--messages` single messages, one every `--gap` seconds, each to a forwarder (or
  destination) drawn at random, in its own transaction as an endpoint sends; each timed from
  its commit until the destination's commit is told (a statement trigger on each destination
  queue that the benchmark adds, `NOTIFY`, and a `LISTEN` here: `Arrivals`), or, with more
  than `LISTENERS_KEPT` destination databases, until a count of its queue (every 0.5 ms) sees
  it: p50, p95, p99, max in ms;
- **reload s**: SIGHUP to the next READY=1, the most of `--reloads`, with one more message
  sent and picked up after each;
- **connections**: the most the daemon held at once (`pg_stat_activity`, `application_name`
  sfbridge, sampled every 0.25 s while idle, and around every send) to the forwarding database,
  and to all the databases together;
- **RSS MB**: its peak resident memory (VmHWM, all its processes);
- **exactly-once**: every message sent arrived once in its destination queue, nothing else
  did, the forwarding queues, error queue and retry storage are empty, and SIGTERM ended it
  with exit code 0.

Scenarios: `--forwarders 50,500` (that many forwarders, one queue each, on one forwarding
database; one destination) and `--destinations 50` (one forwarding database with
`--destination-forwarders` forwarders, 50 destination databases with a route each). With
`--previous-rev REV` (or `--previous-code DIR`) each row runs that code too, right before this
one, on the same databases: compare within a row. Nothing is asserted on timings; the exit
status is 1 when an exactly-once check failed.

    .venv/bin/python bench/scale_benchmark.py --previous-rev main
    .venv/bin/python bench/scale_benchmark.py --forwarders 500 --destinations 0 --messages 300
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from forwarding_benchmark import Run, extract_revision
from throughput.daemon import Daemon, cpu_seconds, peak_rss_mb, write_config
from throughput.databases import (
    DEFAULT_PG_PREFIX,
    ERROR_QUEUE,
    LEDGER_TABLE,
    RECEIVER,
    RETRY_TABLE,
    PgDatabase,
    new_messages,
    pg_connect,
    pg_connection_string,
)
from throughput.idle import _install

SETTLE = 2.0  # seconds after READY before the idle window
SAMPLE = 0.25  # seconds between connection counts while idle
ARRIVAL_CHANNEL = "sfbench_arrival"
ARRIVAL_TRIGGER = """
CREATE OR REPLACE FUNCTION sfbench_arrived() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_notify('{channel}', ''); RETURN NULL; END $$;
DROP TRIGGER IF EXISTS sfbench_arrival ON {table};
CREATE TRIGGER sfbench_arrival AFTER INSERT ON {table}
FOR EACH STATEMENT EXECUTE FUNCTION sfbench_arrived()"""
# Destination databases up to this many get a listening connection each; with more, arrivals
# are counted (every `POLL`): a connection more per database would take the server's
# connections from the daemon (a destination it cannot reach delays its messages by retries).
LISTENERS_KEPT = 10
POLL = 0.0005
BODY = os.urandom(1024)


class Connections:
    """The daemon's connections per database, read from the server's 'postgres' database."""

    def __init__(self, prefix: str, names: Sequence[str]) -> None:
        self.names = list(names)
        self.connection = pg_connect(pg_connection_string(prefix, "postgres"), autocommit=True)
        self.most: dict[str, int] = {}
        self.most_total = 0

    def sample(self) -> None:
        rows = self.connection.execute(
            "SELECT datname, count(*) FROM pg_stat_activity WHERE application_name = 'sfbridge' "
            "GROUP BY datname"
        ).fetchall()
        held = {name: int(count) for name, count in rows if name in self.names}
        for name, count in held.items():
            self.most[name] = max(self.most.get(name, 0), count)
        self.most_total = max(self.most_total, sum(held.values()))

    def close(self) -> None:
        self.connection.close()


class Arrivals:
    """Tells when a message has arrived in a destination queue, from a `NOTIFY` its insert's
    statement trigger sends at commit: nothing polls while the daemon picks up.

    The earlier way, a `count(*)` of the destination queue every 0.5 ms, took a good share of
    one of the machine's two cores from the daemon being timed (its loop and the server's
    backend), and made every pickup slower by what it took."""

    def __init__(self, destinations: Sequence[tuple[str, PgDatabase, str]]) -> None:
        self.told = len({database.name for _, database, _ in destinations}) <= LISTENERS_KEPT
        self._listeners: dict[str, Any] = {}
        for _, database, queue in destinations if self.told else ():
            database.connection.execute(
                ARRIVAL_TRIGGER.format(channel=ARRIVAL_CHANNEL, table=f'"{queue}"')
            )

    def listen(self, database: PgDatabase) -> Any:
        """A connection listening for `database`'s arrivals (before the send); None where
        arrivals are counted."""
        if not self.told:
            return None
        listener = self._listeners.get(database.name)
        if listener is None:
            import psycopg
            from psycopg.conninfo import make_conninfo

            from bridge.drivers.libpq import libpq_parameters

            conninfo = make_conninfo("", **libpq_parameters(database.connection_string))
            listener = psycopg.connect(conninfo, autocommit=True)
            listener.execute(f"LISTEN {ARRIVAL_CHANNEL}")
            self._listeners[database.name] = listener
        return listener

    def wait(
        self, listener: Any, database: PgDatabase, queue: str, expected: int, daemon: Daemon
    ) -> float:
        """Until `queue` holds `expected` rows (counted only when an insert into it is told);
        returns `time.perf_counter()` when that insert was told (or counted)."""
        deadline = time.monotonic() + 60
        while True:
            if listener is None:
                if database.count(queue) >= expected:
                    return time.perf_counter()
                time.sleep(POLL)
            else:
                for _ in listener.notifies(timeout=1.0, stop_after=1):
                    told = time.perf_counter()
                    if database.count(queue) >= expected:
                        return told
            daemon.check_alive(1)
            if time.monotonic() > deadline:
                raise RuntimeError(f"a message for {queue} not picked up within 60 s")

    def close(self) -> None:
        for listener in self._listeners.values():
            listener.close()


class Layout:
    """One forwarding database, its forwarders' queues, and destination queues."""

    def __init__(
        self,
        source: PgDatabase,
        forwarders: list[str],
        destinations: list[tuple[str, PgDatabase, str]],  # (config name, database, queue)
    ) -> None:
        self.source, self.forwarders, self.destinations = source, forwarders, destinations

    def config(self) -> dict[str, Any]:
        databases = {"source": self.source.config_entry()}
        routes = []
        for name, database, queue in self.destinations:
            databases[name] = database.config_entry()
            routes.append({"match": queue, "database": name})
        forwarders = [{"name": q, "database": "source", "queue": q} for q in self.forwarders]
        return {"databases": databases, "forwarders": forwarders, "routes": routes}

    def environment(self) -> dict[str, str]:
        environment = dict(self.source.environment())
        for _, database, _ in self.destinations:
            environment.update(database.environment())
        return environment

    def clear(self) -> None:
        for _, database, queue in self.destinations:
            database.clear([queue, LEDGER_TABLE])
        self.source.clear([ERROR_QUEUE, RETRY_TABLE])

    def exactly_once(self, sent: dict[str, set[str]], exit_code: int) -> str:
        problems = []
        for _, database, queue in self.destinations:
            got = database.message_ids(queue)
            expected = sent.get(queue, set())
            if len(got) != len(set(got)):
                problems.append(f"{len(got) - len(set(got))} duplicated in {queue}")
            if set(got) != expected:
                problems.append(f"{len(expected ^ set(got))} ids differ in {queue}")
        tables = [*self.forwarders, ERROR_QUEUE, RETRY_TABLE]
        left = sum(self.source.count(table) for table in tables)
        if left:
            problems.append(f"{left} rows left in the forwarding database")
        if exit_code != 0:
            problems.append(f"exit code {exit_code} after SIGTERM")
        return "ok" if not problems else "FAILED: " + ", ".join(problems)


def measure(
    layout: Layout, workdir: Path, label: str, code: str | None, args: argparse.Namespace
) -> dict[str, Any]:
    """One daemon run on `layout`, as the module docstring says."""
    environment = layout.environment()
    if code is not None:
        environment["PYTHONPATH"] = code
    config = write_config(workdir / f"{label}.yaml", layout.config())
    _install(config, environment, cwd=code)
    for _, database, queue in layout.destinations:
        database.create_queue(queue)
    layout.clear()
    arrivals = Arrivals(layout.destinations)
    names = [layout.source.name, *(database.name for _, database, _ in layout.destinations)]
    seen = Connections(layout.source.connection_string.split("Database=")[0], names)
    sent: dict[str, set[str]] = {}
    latencies: list[float] = []
    reloads: list[float] = []
    try:
        started = time.perf_counter()
        with Daemon(config, environment, workdir / f"{label}.log", code) as daemon:
            daemon.wait_ready(timeout=600)
            ready = time.perf_counter() - started
            if args.warm:
                warm_up(layout, daemon, sent)
            time.sleep(SETTLE)
            cpu, idle_from = cpu_seconds(daemon.pid), time.perf_counter()
            while time.perf_counter() - idle_from < args.idle_seconds:
                seen.sample()
                time.sleep(SAMPLE)
            idle = time.perf_counter() - idle_from
            idle_cpu = 100 * (cpu_seconds(daemon.pid) - cpu) / idle
            for number in range(args.messages):
                time.sleep(args.gap)
                latencies.append(send_and_wait(layout, daemon, sent, arrivals))
                if number % 10 == 0:
                    seen.sample()
            for _ in range(args.reloads):
                hup = time.perf_counter()
                daemon.process.send_signal(signal.SIGHUP)
                daemon.wait_ready(timeout=600)
                reloads.append(time.perf_counter() - hup)
                send_and_wait(layout, daemon, sent, arrivals)  # it still picks up
                seen.sample()
            rss = peak_rss_mb(daemon.pid)
            exit_code = daemon.stop()
    finally:
        seen.close()
        arrivals.close()
    percentile = statistics.quantiles(latencies, n=100, method="inclusive") if latencies else []
    return {
        "label": label,
        "forwarders": len(layout.forwarders),
        "destinations": len(layout.destinations),
        "ready_s": ready,
        "idle_cpu_percent": idle_cpu,
        "p50_ms": statistics.median(latencies) if latencies else None,
        "p95_ms": percentile[94] if percentile else None,
        "p99_ms": percentile[98] if percentile else None,
        "max_ms": max(latencies) if latencies else None,
        "reload_s": max(reloads) if reloads else None,
        "connections_source": seen.most.get(layout.source.name, 0),
        "connections_total": seen.most_total,
        "rss_mb": rss,
        "exactly_once": layout.exactly_once(sent, exit_code),
    }


def warm_up(layout: Layout, daemon: Daemon, sent: dict[str, set[str]]) -> None:
    """A message through every forwarder and to every destination, not timed: what a
    forwarder's first batch costs in a daemon (its statements, its tables looked at) is left
    out of the pickup times."""
    for index, forwarder in enumerate(layout.forwarders):
        _, _, queue = layout.destinations[index % len(layout.destinations)]
        ((message_id, headers),) = new_messages(1, [queue])
        layout.source.send_one(forwarder, headers, BODY)
        sent.setdefault(queue, set()).add(message_id)
    deadline = time.monotonic() + 300
    while any(
        database.count(queue) < len(sent.get(queue, ()))
        for _, database, queue in layout.destinations
    ):
        daemon.check_alive(1)
        if time.monotonic() > deadline:
            raise RuntimeError("the warm-up messages were not all delivered within 300 s")
        time.sleep(0.05)


def send_and_wait(
    layout: Layout, daemon: Daemon, sent: dict[str, set[str]], arrivals: Arrivals
) -> float:
    """One message into a random forwarder's queue, for a random destination; the ms from
    its commit until its destination's commit is told."""
    _, database, queue = random.choice(layout.destinations)
    ((message_id, headers),) = new_messages(1, [queue])
    expected = len(sent.setdefault(queue, set())) + 1
    listener = arrivals.listen(database)
    layout.source.send_one(random.choice(layout.forwarders), headers, BODY)
    committed = time.perf_counter()
    sent[queue].add(message_id)
    arrived = arrivals.wait(listener, database, queue, expected, daemon)
    return 1000 * (arrived - committed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forwarders", default="50,500", help="counts, comma-separated ('' skips)")
    parser.add_argument("--destinations", type=int, default=50, help="0 skips")
    parser.add_argument("--destination-forwarders", type=int, default=50)
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.15, help="seconds between sends")
    parser.add_argument("--idle-seconds", type=float, default=10)
    parser.add_argument("--reloads", type=int, default=3)
    parser.add_argument(
        "--warm", action="store_true", help="first a message through every forwarder, untimed"
    )
    parser.add_argument("--previous-rev", help="also run this git revision, before each row")
    parser.add_argument("--previous-code", help="also run the sfbridge in this folder")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    run = Run(os.environ.get("SFBENCH_PG", os.environ.get("SFBRIDGE_BENCH_PG", DEFAULT_PG_PREFIX)))
    rows: list[dict[str, Any]] = []
    try:
        previous = args.previous_code
        if args.previous_rev:
            previous = extract_revision(args.previous_rev, run.workdir)
        codes: list[tuple[str, str | None]] = [*([("previous", previous)] if previous else [])]
        codes.append(("this code", None))
        layouts = _layouts(run, args)
        for name, layout in layouts:
            for code_label, code in codes:
                progress(f"{name}, {code_label} ...")
                label = f"{name}-{code_label}".replace(" ", "-")
                row = measure(layout, run.workdir, label, code, args)
                row["code"] = code_label
                row["scenario"] = name
                rows.append(row)
                progress(_line(row))
    finally:
        run.close()
    if args.json:
        print(json.dumps({"rows": rows, "parameters": vars(args)}, indent=2))
    else:
        print(
            f"{args.messages} single messages per row, one every {args.gap:g} s; "
            f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        for row in rows:
            print(_line(row))
    return 0 if all(row["exactly_once"] == "ok" for row in rows) else 1


def _layouts(run: Run, args: argparse.Namespace) -> list[tuple[str, Layout]]:
    layouts = []
    counts = [int(value) for value in args.forwarders.split(",") if value.strip()]
    if counts:
        source = _pg(run, "source")
        destination = _pg(run, "dest")
        for count in counts:
            forwarders = [f"scale_{index}" for index in range(count)]
            only = [("dest", destination, RECEIVER)]
            layouts.append((f"{count} forwarders", Layout(source, forwarders, only)))
    if args.destinations:
        source = _pg(run, "fan-source")
        destinations = [
            (f"dest{index}", _pg(run, f"dest-{index}"), f"{RECEIVER}_{index}")
            for index in range(args.destinations)
        ]
        forwarders = [f"fan_{index}" for index in range(args.destination_forwarders)]
        layouts.append(
            (f"{args.destinations} destinations", Layout(source, forwarders, destinations))
        )
    return layouts


def _pg(run: Run, label: str) -> PgDatabase:
    database = run.database("PG", label)
    assert isinstance(database, PgDatabase)
    return database


def _line(row: dict[str, Any]) -> str:
    def ms(key: str) -> str:
        return "-" if row[key] is None else f"{row[key]:.1f}"

    return (
        f"  {row['scenario']:<16} {row['code']:<10} READY {row['ready_s']:5.1f} s  idle CPU "
        f"{row['idle_cpu_percent']:5.2f} %  pickup p50 {ms('p50_ms')} p95 {ms('p95_ms')} "
        f"p99 {ms('p99_ms')} max {ms('max_ms')} ms  reload {row['reload_s'] or 0:.1f} s  "
        f"connections {row['connections_source']} (all {row['connections_total']})  "
        f"RSS {row['rss_mb']:.0f} MB  exactly-once {row['exactly_once']}"
    )


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
