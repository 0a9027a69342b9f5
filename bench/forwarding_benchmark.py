"""Forwarding throughput of sfbridge, as ratios to baselines measured in the same run.

Per scenario (PG -> PG, SQLite -> PG, PG -> SQLite) and body size: the daemon at its previous
defaults, at its defaults and at the best configuration, the naive per-message relay and the
server-side ceiling, with CPU per message, peak RSS and an exactly-once check of every run;
then idle pickup latency, and with --large 200 messages of 8 MiB. Fresh databases per run,
dropped at the end even on failure or Ctrl-C. Only prints, no timed assertions; exit status 1
means a correctness check failed. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput.daemon import sfbridge_accepts, write_config
from throughput.databases import (
    DEFAULT_PG_PREFIX,
    RECEIVER,
    BenchDatabase,
    PgDatabase,
    SqliteDatabase,
    create_pg_databases,
    drop_pg_databases,
    pg_connection_string,
    pg_server_version,
)
from throughput.fan_out import DESTINATIONS, FanOutScenario, fan_out_rows
from throughput.idle import (
    measure_idle_cost,
    measure_latency_modes,
    measure_traffic_on_few,
    print_idle_cost,
    print_latency_modes,
    print_traffic_on_few,
)
from throughput.report import print_header, print_latency, print_scenario, summarize_rows
from throughput.scenarios import (
    Scenario,
    catch_up_row,
    run_scenario,
    standard_rows,
    stderr,
    tracing_row,
    transaction_mode_rows,
)

SCENARIOS = {
    "pg-pg": ("PG", "PG"),
    "sqlite-pg": ("SQLite", "PG"),
    "pg-sqlite": ("PG", "SQLite"),
    "pg-10pg": ("PG", f"{DESTINATIONS} PG"),
}
UNITS = {"": 1, "B": 1, "KIB": 1024, "MIB": 1024**2}
QUICK_MESSAGES = 2000
LARGE_BODY = 8 * 1024**2


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*(KiB|MiB|B)?\s*", text, re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1KiB, 64KiB, 8MiB)")
    return int(match.group(1)) * UNITS[(match.group(2) or "").upper()]


def format_size(size: int) -> str:
    for unit, factor in (("MiB", 1024**2), ("KiB", 1024)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} B"


def parse_overrides(text: str) -> dict[str, Any]:
    """'batch_size=2000,concurrency=4' -> {'batch_size': 2000, 'concurrency': 4} (YAML values)."""
    overrides = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"--best wants KEY=VALUE items, not {item!r}")
        overrides[key.strip()] = yaml.safe_load(value.strip())
    return overrides


def default_messages(args: argparse.Namespace, body: int) -> int:
    if args.messages:
        return int(args.messages)
    if args.quick:
        return QUICK_MESSAGES
    return 20_000 if body <= 16 * 1024 else 5_000


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--bodies", default="1KiB,64KiB", help="body sizes (default 1KiB,64KiB)")
    parser.add_argument(
        "--messages",
        type=int,
        help="messages per run (default 20000 up to 16 KiB bodies, 5000 above; 2000 with --quick)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per row (medians)")
    parser.add_argument(
        "--transaction-modes",
        action="store_true",
        help="add rows for the defaults with transaction: two-phase (PG -> PG only; the "
        "server needs max_prepared_transactions > 0) and at-least-once on the route",
    )
    parser.add_argument(
        "--catch-up-rate",
        type=int,
        default=2000,
        help="PG -> PG: a row with this catch-up limit (max_messages_per_second) on the "
        "destination, whose steady drain rate must be within 10%% of it (0: no such row)",
    )
    parser.add_argument(
        "--best",
        type=parse_overrides,
        default="concurrency=4",
        help="the best row's keys, e.g. 'batch_size=2000,concurrency=4' "
        "(driver=... goes to every PostgreSQL database)",
    )
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help="of " + ", ".join(SCENARIOS)
    )
    parser.add_argument("--latency-messages", type=int, default=30, help="pickup latency sends")
    parser.add_argument("--idle-seconds", type=float, default=10, help="idle CPU window")
    parser.add_argument(
        "--forwarders",
        default="1,10,50",
        help="idle cost with this many forwarders on one database (default 1,10,50; '' for none)",
    )
    parser.add_argument(
        "--traffic-per-queue",
        type=int,
        default=2000,
        help="50 forwarders with traffic on 5: messages per busy queue (default 2000; 0: skip)",
    )
    parser.add_argument("--large", action="store_true", help="add 200 messages x 8 MiB, PG -> PG")
    parser.add_argument("--large-messages", type=int, default=200)
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 2000 messages, 1 KiB, fewer latency sends"
    )
    parser.add_argument(
        "--previous-code",
        metavar="DIR",
        help="run the 'previous' row with the sfbridge checked out in DIR, at its own defaults "
        "(e.g. `git worktree add /tmp/sfbridge-before <commit>`), so that 'x previous' is against "
        "that code measured in this run",
    )
    parser.add_argument(
        "--previous-rev",
        metavar="REV",
        help="as --previous-code, with the sfbridge of git revision REV of this repository "
        "(e.g. main, HEAD~3), extracted with `git archive` into the run's temp folder",
    )
    parser.add_argument(
        "--rows",
        help="only these rows of pg-pg, sqlite-pg and pg-sqlite, e.g. 'previous,defaults' (of "
        "previous, previous-settings, defaults, best, naive, catch-up, tracing); the ceiling "
        "always runs, since "
        "every ratio is to it",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args()
    args.row_keys = None if args.rows is None else {k.strip() for k in args.rows.split(",")}
    if args.previous_code is not None and args.previous_rev is not None:
        parser.error("give --previous-code or --previous-rev, not both")
    if args.previous_code is not None:
        args.previous_code = str(Path(args.previous_code).resolve())
        if not (Path(args.previous_code) / "bridge" / "__main__.py").is_file():
            parser.error(f"--previous-code {args.previous_code}: no sfbridge checkout there")
    if args.quick:
        args.bodies = args.bodies if "--bodies" in sys.argv else "1KiB"
        args.latency_messages = min(args.latency_messages, 12)
        args.idle_seconds = min(args.idle_seconds, 3)
        args.traffic_per_queue = min(args.traffic_per_queue, 200)
    args.body_sizes = [parse_size(size) for size in args.bodies.split(",")]
    args.scenario_keys = [key.strip() for key in args.scenarios.split(",")]
    unknown = set(args.scenario_keys) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {sorted(SCENARIOS)}")
    return args


class Progress:
    """Progress lines on stderr, prefixed with what is being measured."""

    def __init__(self, label: str) -> None:
        self.label = label

    def __call__(self, text: str) -> None:
        stderr(f"[{self.label}] {text}")


class Run:
    """Databases and files of one benchmark run; `close()` drops and deletes them all."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.tag = f"sfbench_{secrets.token_hex(4)}"
        self.workdir = Path(tempfile.mkdtemp(prefix="sfbench-"))
        self.created: list[str] = []
        self.stack = ExitStack()

    def database(self, kind: str, label: str) -> BenchDatabase:
        database: BenchDatabase
        if kind == "PG":
            name = f"{self.tag}_{len(self.created)}"
            create_pg_databases(self.prefix, [name], self.created)
            database = PgDatabase(
                self.prefix, name, f"SFBENCH_{label.upper().replace('-', '_')}_ODBC"
            )
        else:
            database = SqliteDatabase(self.workdir / f"{label}-{secrets.token_hex(3)}.db")
        self.stack.callback(database.close)
        return database

    def pg_pg_defaults(self) -> tuple[Scenario, Path]:
        """A PG -> PG scenario on two fresh databases (progress to stderr) and the YAML of
        its daemon at the defaults, for the scripts that time one thing in detail."""
        scenario = Scenario(
            "pg-pg",
            self.database("PG", "source"),
            self.database("PG", "destination"),
            self.workdir,
            False,
            stderr,
        )
        return scenario, write_config(
            self.workdir / "defaults.yaml", scenario.daemon_config({}, {})
        )

    def driver_key_supported(self) -> bool:
        """Validate a tiny YAML with `driver: odbc` once with `sfbridge check`."""
        config = {
            "databases": {
                "db": {
                    "dialect": "postgresql",
                    "connection": "${SFBENCH_CHECK_ODBC}",
                    "driver": "odbc",
                }
            },
            "forwarders": [{"name": "check", "database": "db", "queue": "bench_check"}],
            "routes": [{"match": "*", "database": "db"}],
        }
        path = write_config(self.workdir / "driver-check.yaml", config)
        environment = {"SFBENCH_CHECK_ODBC": pg_connection_string(self.prefix, "postgres")}
        return sfbridge_accepts(path, "driver", environment)

    def close(self) -> None:
        self.stack.close()
        for problem in drop_pg_databases(self.prefix, self.created) if self.created else []:
            stderr(problem)
        shutil.rmtree(self.workdir, ignore_errors=True)


def extract_revision(revision: str, workdir: Path) -> str:
    """The sfbridge of git revision `revision` of this repository, extracted into a folder of
    `workdir` named after its commit; returns the folder."""
    repository = Path(__file__).resolve().parent.parent
    commit = subprocess.run(
        ["git", "-C", str(repository), "rev-parse", "--short", f"{revision}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    folder = workdir / f"sfbridge-{commit}"
    folder.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(repository), "archive", commit], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return str(folder)


def run_benchmark(args: argparse.Namespace, run: Run) -> dict[str, Any]:
    if args.previous_rev is not None:
        args.previous_code = extract_revision(args.previous_rev, run.workdir)
    driver_key = run.driver_key_supported()
    summary: dict[str, Any] = {
        "postgresql": pg_server_version(run.prefix),
        "cpus": os.cpu_count(),
        "driver_key": driver_key,
        "parameters": {k: getattr(args, k) for k in ("bodies", "repeat", "best", "quick")},
        "scenarios": [],
        "pickup_latency": None,
        "pickup_modes": None,
        "idle_cost": None,
        "traffic_on_few": None,
        "large": None,
    }
    for key in args.scenario_keys:
        source_kind, destination_kind = SCENARIOS[key]
        name = f"{source_kind} -> {destination_kind}"
        source = run.database(source_kind, f"{key}_source")
        workdir = run.workdir / key
        workdir.mkdir()
        progress = Progress(name)
        scenario: Scenario
        if key == "pg-10pg":
            destinations = [
                run.database("PG", f"{key}_destination{n}") for n in range(DESTINATIONS)
            ]
            scenario = FanOutScenario(name, source, destinations, workdir, driver_key, progress)
        else:
            destination = run.database(destination_kind, f"{key}_destination")
            scenario = Scenario(name, source, destination, workdir, driver_key, progress)
        for body_size in args.body_sizes:
            messages = default_messages(args, body_size)
            body = os.urandom(body_size)  # incompressible: TOAST cannot shrink it
            progress.label = f"{name}, {format_size(body_size)}"
            specs = [
                spec
                for spec in standard_rows(args.best, args.previous_code)
                if args.row_keys is None or spec.key in args.row_keys or spec.key == "ceiling"
            ]
            if key == "pg-10pg":
                specs = fan_out_rows(args.previous_code)
            elif args.transaction_modes:
                specs[-2:-2] = transaction_mode_rows(source_kind == destination_kind == "PG")
            wanted = args.row_keys is None or "catch-up" in args.row_keys
            if key == "pg-pg" and args.catch_up_rate > 0 and wanted:
                specs[-2:-2] = [catch_up_row(args.catch_up_rate)]
            if key == "pg-pg" and (args.row_keys is None or "tracing" in args.row_keys):
                specs[-2:-2] = [tracing_row()]
            rows = run_scenario(scenario, specs, messages, body, args.repeat)
            summary["scenarios"].append(
                {
                    "name": name,
                    "body": format_size(body_size),
                    "body_bytes": body_size,
                    "messages": messages,
                    "repeat": args.repeat,
                    "rows": summarize_rows(rows),
                }
            )
        if key == "pg-pg" and args.latency_messages > 0:
            progress.label = f"{name}, latency"
            body = os.urandom(1024)
            modes = measure_latency_modes(scenario, args.latency_messages, args.idle_seconds, body)
            summary["pickup_latency"], summary["pickup_modes"] = modes["push"], modes
        if key == "pg-pg" and args.large:
            progress.label = f"{name}, 8 MiB"
            defaults = [spec for spec in standard_rows({}) if spec.key == "defaults"]
            rows = run_scenario(scenario, defaults, args.large_messages, os.urandom(LARGE_BODY), 1)
            summary["large"] = {
                "name": name,
                "body": format_size(LARGE_BODY),
                "body_bytes": LARGE_BODY,
                "messages": args.large_messages,
                "repeat": 1,
                "rows": summarize_rows(rows),
            }
    if "pg-pg" in args.scenario_keys:
        run_many_forwarders(args, run, summary)
    return summary


def run_many_forwarders(args: argparse.Namespace, run: Run, summary: dict[str, Any]) -> None:
    """Idle cost with 1, 10 and 50 forwarders, and 50 forwarders with traffic on 5, on fresh
    PostgreSQL databases of their own."""
    counts = tuple(int(count) for count in args.forwarders.split(",") if count.strip())
    if not counts and args.traffic_per_queue <= 0:
        return
    source = run.database("PG", "many_source")
    destination = run.database("PG", "many_destination")
    assert isinstance(source, PgDatabase) and isinstance(destination, PgDatabase)
    destination.create_queue(RECEIVER)
    workdir = run.workdir / "many"
    workdir.mkdir()
    progress = Progress("many forwarders")
    if counts:
        summary["idle_cost"] = measure_idle_cost(
            source, destination, workdir, counts, args.idle_seconds, args.previous_code, progress
        )
    if args.traffic_per_queue > 0:
        summary["traffic_on_few"] = measure_traffic_on_few(
            source, destination, workdir, args.traffic_per_queue, os.urandom(1024), progress
        )


def failed(summary: dict[str, Any]) -> bool:
    tables = summary["scenarios"] + ([summary["large"]] if summary["large"] else [])
    checks = [check for table in tables for row in table["rows"] for check in row["exactly_once"]]
    modes = summary["pickup_modes"] or {}
    checks += [mode["exactly_once"] for mode in modes.values()]
    checks += [row["exactly_once"] for row in (summary["traffic_on_few"] or {}).get("rows", [])]
    idle = (summary["idle_cost"] or {}).get("rows", [])
    return any(check != "ok" for check in checks) or not all(row["clean_stop"] for row in idle)


def print_summary(summary: dict[str, Any]) -> None:
    print_header(summary)
    for scenario in summary["scenarios"]:
        print_scenario(scenario)
    if summary["pickup_latency"]:
        print_latency(summary["pickup_latency"])
    if summary["pickup_modes"]:
        print_latency_modes(summary["pickup_modes"])
    if summary["idle_cost"]:
        print_idle_cost(summary["idle_cost"])
    if summary["traffic_on_few"]:
        print_traffic_on_few(summary["traffic_on_few"])
    if summary["large"]:
        print_scenario(summary["large"])


def main() -> int:
    args = parse_args()
    run = Run(os.environ.get("SFBRIDGE_BENCH_PG", DEFAULT_PG_PREFIX))

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in background
    try:
        summary = run_benchmark(args, run)
        if args.json:
            print(json.dumps(summary, indent=2))
        else:
            print_summary(summary)
        return 1 if failed(summary) else 0
    except KeyboardInterrupt:
        stderr("interrupted; dropping the benchmark databases")
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        run.close()


if __name__ == "__main__":
    sys.exit(main())
