"""How fast the operator's queries answer on large tables (issue 35): `sfbridge errors summary`
over 100,000 failed messages, and `sfbridge where` with retry storage and the dedup ledger
holding 1,000,000 rows each.

It creates two PostgreSQL databases (a forwarding database and a receiver with a ledger),
installs the bridge's tables with `sfbridge install`, fills them with generate_series, and
prints the figures: the whole CLI command (a fresh Python process: startup, config, connect,
query, print) and, for `where`, the lookups themselves on open connections. `where` is timed
twice: before the error queue is filled (the tables the figure is about), and with the 100,000
failed messages in it (which `where` reads by headers: error queues are not indexed). Nothing
is asserted; rerun it to compare. The databases are dropped at the end.

    .venv/bin/python bench/operator_queries.py [--failed 100000] [--rows 1000000] [--repeat 5]
        [--baseline /path/to/another/checkout]

With `--baseline`, each whole command is also timed with that checkout's code (the same
databases and config, back to back), and the ratio printed.

PostgreSQL at 127.0.0.1:5432 (user postgres, trust) or SFBRIDGE_BENCH_PG (an ODBC prefix).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))

from throughput.daemon import write_config  # noqa: E402
from throughput.databases import (  # noqa: E402
    DEFAULT_PG_PREFIX,
    create_pg_databases,
    drop_pg_databases,
    pg_connect,
    pg_connection_string,
)

from bridge.commands.error_groups import count_groups  # noqa: E402
from bridge.commands.error_queues import error_queues  # noqa: E402
from bridge.commands.errors import read_error_queues  # noqa: E402
from bridge.commands.failure_groups import summarize  # noqa: E402
from bridge.commands.selection import Selection  # noqa: E402
from bridge.commands.where import find_everywhere  # noqa: E402
from bridge.config import load_config  # noqa: E402
from bridge.connections import Connections  # noqa: E402
from bridge.dialects import dialect_for  # noqa: E402
from bridge.exceptions import DatabaseError  # noqa: E402
from bridge.storage.tables import forwarder_tables  # noqa: E402

FORWARD = "Samples.Sender.Forward"

ERRORS_SQL = """
INSERT INTO public.error (id, expires, headers, body)
SELECT gen_random_uuid(), NULL, json_build_object(
    'NServiceBus.MessageId', gen_random_uuid()::text,
    'NServiceBus.MessageIntent', 'Send',
    'NServiceBus.EnclosedMessageTypes', 'Shared.Type' || (i % 7) || ', Shared, Version=1.0.0.0',
    'NServiceBus.TimeSent', '2026-11-21 10:06:20:123456 Z',
    '$.store-and-forward.destination', 'Samples.Destination' || (i % 13),
    'NServiceBus.FailedQ', ?::text,
    'NServiceBus.TimeOfFailure',
        to_char(now() AT TIME ZONE 'UTC' - (i || ' s')::interval, 'YYYY-MM-DD HH24:MI:SS:US')
        || ' Z',
    'NServiceBus.ExceptionInfo.ExceptionType', 'System.Exception' || (i % 5),
    'NServiceBus.ExceptionInfo.Message', 'the destination refused message ' || i,
    '$.sfbridge.failure-reason',
        (ARRAY['unroutable', 'delivery-failed', 'missing-queue', 'outage-too-long'])[1 + i % 4],
    '$.sfbridge.attempts', '3')::text, convert_to('{"order": 1}', 'UTF8')
FROM generate_series(1, ?::int) AS i"""

RETRY_SQL = """
INSERT INTO public.sfbridge_retry (id, forwarder, destination, destination_database, expires,
    headers, body, attempts, first_failure_at, next_attempt_at, last_error)
SELECT gen_random_uuid(), 'orders', '"public"."Samples.Receiver"', 'receiver', NULL,
    '{"NServiceBus.MessageId":"' || gen_random_uuid() || '","NServiceBus.MessageIntent":"Send",'
    || '"NServiceBus.EnclosedMessageTypes":"Shared.OrderSubmitted, Shared",'
    || '"$.store-and-forward.destination":"\\"public\\".\\"Samples.Receiver\\""}',
    convert_to('{"order": 1}', 'UTF8'), 1 + i % 5, now() AT TIME ZONE 'UTC',
    now() AT TIME ZONE 'UTC' + interval '1 day', 'receiver is down'
FROM generate_series(1, ?::int) AS i"""

LEDGER_SQL = """
INSERT INTO public.sfbridge_ledger (message_id, destination, forwarded_at)
SELECT gen_random_uuid()::text, '"public"."Samples.Receiver"', now() AT TIME ZONE 'UTC'
FROM generate_series(1, ?::int)"""


def median_ms(action: Callable[[], object], repeat: int) -> tuple[float, float, float]:
    """(median, min, max) milliseconds of `repeat` runs after one warm-up."""
    action()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), min(times), max(times)


def cli(config: Path, *args: str, repo: Path = REPO, expect: str = "") -> Callable[[], None]:
    """Run a command in a new process; `expect`: text its output must hold (its counts)."""
    environment = {**os.environ, "PYTHONPATH": str(repo)}

    def run() -> None:
        result = subprocess.run(
            [sys.executable, "-m", "bridge", "-c", str(config), *args],
            capture_output=True, text=True, env=environment, check=False,
        )  # fmt: skip
        if result.returncode not in (0, 1):
            raise SystemExit(f"sfbridge {' '.join(args)} failed: {result.stderr}")
        if expect not in result.stdout:
            raise SystemExit(f"sfbridge {' '.join(args)} did not say {expect!r}: {result.stdout}")

    return run


def whole(args: argparse.Namespace, config: Path, label: str, *command: str, expect: str) -> None:
    """Time a whole command, and with `--baseline` the same with the baseline's code."""
    figures = median_ms(cli(config, *command, expect=expect), args.repeat)
    show(label, figures)
    if args.baseline is not None:
        before = median_ms(cli(config, *command, repo=args.baseline, expect=expect), args.repeat)
        show(f"  baseline ({args.baseline}): {before[0] / figures[0]:.1f}x this", before)


def show(label: str, figures: tuple[float, float, float]) -> None:
    median, low, high = figures
    print(f"  {label:<58} {median:9.1f} ms  (min {low:.1f}, max {high:.1f})")


def one_value(connection_string: str, sql: str) -> str:
    with closing(pg_connect(connection_string, autocommit=True)) as connection:
        return str(connection.execute(sql).fetchone()[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--failed", type=int, default=100_000, help="failed messages")
    parser.add_argument("--rows", type=int, default=1_000_000, help="retry and ledger rows")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs (median)")
    parser.add_argument(
        "--baseline", type=Path, help="another checkout to time each whole command with too"
    )
    args = parser.parse_args()
    prefix = os.environ.get("SFBRIDGE_BENCH_PG", DEFAULT_PG_PREFIX)
    tag = uuid.uuid4().hex[:8]
    names = [f"sfbench_ops_sender_{tag}", f"sfbench_ops_receiver_{tag}"]
    created: list[str] = []
    try:
        create_pg_databases(prefix, names, created)
        sender, receiver = (pg_connection_string(prefix, name) for name in names)
        return _run(args, sender, receiver)
    finally:
        for problem in drop_pg_databases(prefix, created):
            print(problem, file=sys.stderr)


def _run(args: argparse.Namespace, sender: str, receiver: str) -> int:
    folder = Path(tempfile.mkdtemp(prefix="sfbench-ops-"))
    config_path = write_config(
        folder / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": sender},
                "receiver": {"dialect": "postgresql", "connection": receiver},
            },
            "forwarders": [{"name": "orders", "database": "sender", "queue": f'"{FORWARD}"'}],
            "routes": [{"match": "Samples.*", "database": "receiver"}],
        },
    )
    cli(config_path, "install")()
    config, _ = load_config(config_path)
    failed_queue = forwarder_tables(config, config.forwarders[0]).failed_queue

    print(f"filling retry storage and the ledger with {args.rows:,} rows each ...", flush=True)
    started = time.perf_counter()
    with closing(pg_connect(sender, autocommit=True)) as connection:
        connection.execute(RETRY_SQL, (args.rows,))
        connection.execute("ANALYZE public.sfbridge_retry")
    with closing(pg_connect(receiver, autocommit=True)) as connection:
        connection.execute(LEDGER_SQL, (args.rows,))
        connection.execute("ANALYZE public.sfbridge_ledger")
    print(f"  filled in {time.perf_counter() - started:.0f} s")
    retry_id = one_value(
        sender,
        'SELECT substring(headers from \'"NServiceBus.MessageId":"([^"]*)"\') '
        "FROM public.sfbridge_retry ORDER BY seq DESC LIMIT 1",
    )
    retry_row = one_value(sender, "SELECT id FROM public.sfbridge_retry ORDER BY seq LIMIT 1")
    ledger_id = one_value(receiver, "SELECT max(message_id) FROM public.sfbridge_ledger")
    absent = str(uuid.uuid4())

    connections = Connections(config.databases)

    def where_in_process(wanted: str) -> Callable[[], None]:
        def look() -> None:
            problems: list[DatabaseError] = []
            found = find_everywhere(config, connections, problems, wanted, scan=False)
            if problems:
                raise SystemExit(f"where failed: {problems}")
            assert wanted == absent or found, wanted

        return look

    def where_figures(when: str) -> None:
        print(f"sfbridge where, {when}:")
        for label, wanted in (
            ("a MessageId in retry storage (by the headers index)", retry_id),
            ("a row Id in retry storage", retry_row),
            ("a MessageId in the ledger", ledger_id),
            ("a MessageId that is nowhere", absent),
        ):
            show(f"lookups, {label}", median_ms(where_in_process(wanted), args.repeat))
        show("whole command (new process), a MessageId in retry storage",
             median_ms(cli(config_path, "where", retry_id), args.repeat))  # fmt: skip

    try:
        where_figures(f"retry storage and ledger {args.rows:,} rows each, error queue empty")
        # What every command costs before its query: a new Python process, the config, the
        # connections (nothing to read in an empty error queue).
        show("baseline: whole command 'errors summary', error queue empty",
             median_ms(cli(config_path, "errors", "summary"), args.repeat))  # fmt: skip
        print(f"filling the error queue with {args.failed:,} failed messages ...", flush=True)
        with closing(pg_connect(sender, autocommit=True)) as connection:
            connection.execute(ERRORS_SQL, (failed_queue, args.failed))
            connection.execute("ANALYZE public.error")
        print(f"sfbridge errors summary over {args.failed:,} failed messages:")

        def summary_in_process() -> None:
            problems: list[DatabaseError] = []
            found = read_error_queues(config, Selection(), connections, problems)
            groups = summarize(
                "exception",
                ((m, each.place.destination_of) for each in found for m in each.messages),
            )
            assert not problems and sum(g.count for g in groups) == args.failed

        def grouped_in_database() -> None:
            queue = error_queues(config)[0]
            dialect = dialect_for(config.databases[queue.database].dialect)
            grouped = count_groups(connections.get(queue.database), dialect, queue, "exception")
            assert grouped is not None and grouped.total == args.failed

        show("reading and grouping every row in the tools (open connection), --by exception",
             median_ms(summary_in_process, args.repeat))  # fmt: skip
        show("grouping in the database (open connection), --by exception",
             median_ms(grouped_in_database, args.repeat))  # fmt: skip
        for by in ("reason", "exception", "destination", "type"):
            whole(args, config_path, f"whole command, --by {by}", "errors", "summary", "--by", by,
                  expect=f"{args.failed} failed message(s)")  # fmt: skip
        whole(args, config_path, "whole command, errors list (first 50)", "errors", "list",
              expect=f"{args.failed} message(s), the first 50 shown")  # fmt: skip
        where_figures(f"and {args.failed:,} messages in the error queue")
    finally:
        connections.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
