"""The daemon's cost grows with the work, not with the config: fifty forwarders on one
PostgreSQL database share one bounded pool of workers and one look for work, and a busy queue
does not starve the others."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import (
    SAMPLES_RECEIVER,
    DaemonProcess,
    message_ids,
    pg_connect,
    pg_count,
    pg_create_queue,
    pg_pair_config,
    pg_rows,
    send_bulk,
    sfbridge,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration


def queue(index: int) -> str:
    return f'"public"."Endpoint{index}.Forward"'


def many_forwarders(
    tmp_path: Path, sender: str, receiver: str, count: int, **database: Any
) -> Path:
    """`count` forwarders on database `sender` (defaults but for what is given), all routing
    to the receiver's queue; installed."""
    config = pg_pair_config(sender, receiver)
    config["databases"]["sender"].update(database.pop("sender_database", {}))
    config["forwarders"] = [
        {"name": f"endpoint{i}", "database": "sender", "queue": queue(i), **database}
        for i in range(count)
    ]
    path = write_config(tmp_path / "sfbridge.yaml", config)
    result = sfbridge("-c", str(path), "install")
    assert result.returncode == 0, result.stdout + result.stderr
    pg_create_queue(receiver, SAMPLES_RECEIVER)
    return path


def _statistics(connection_string: str) -> tuple[str, str]:
    """The database's name, and a connection string to the server's 'postgres' database, from
    which its statistics are read without adding to them."""
    database = connection_string.split("Database=")[1].rstrip(";")
    return database, connection_string.replace(f"Database={database};", "Database=postgres;")


def bridge_connections(connection_string: str) -> int:
    """Connections the bridge holds to the database (its `application_name`)."""
    database, admin = _statistics(connection_string)
    [(count,)] = pg_rows(
        admin,
        "SELECT count(*) FROM pg_stat_activity "
        f"WHERE application_name = 'sfbridge' AND datname = '{database}'",
    )
    return int(count)


def transactions(connection_string: str) -> int:
    """Transactions committed in the database so far, as PostgreSQL's statistics say."""
    database, admin = _statistics(connection_string)
    with pg_connect(admin) as connection:
        connection.execute("SELECT pg_stat_clear_snapshot()")
        [(count,)] = connection.execute(
            f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{database}'"
        ).fetchall()
        connection.commit()
    return int(count)


@pytest.mark.slow
def test_fifty_idle_forwarders_hold_at_most_max_connections_and_send_few_queries(
    tmp_path: Path, new_pg_database: Callable[[], str]
) -> None:
    sender, receiver = new_pg_database(), new_pg_database()
    config = many_forwarders(
        tmp_path,
        sender,
        receiver,
        50,
        sender_database={"max_connections": 6},
    )
    with DaemonProcess(config, tmp_path / "daemon.log") as daemon:
        wait_until(daemon.started, 30, "the daemon to start")
        # Idle from the start (no vacuum of drained queues in the count). The start's one-time
        # work (states published, every source looked at when the watcher starts and again
        # when its listener does, a statement per 32 sources: 4 here, and the first 5 s look)
        # is counted on its own, then ten idle seconds after it.
        at_start, started = transactions(sender), time.monotonic()
        wait_until(lambda: time.monotonic() - started >= 6, 10, "the start's work")
        before, idle_from = transactions(sender), time.monotonic()
        assert before - at_start <= 50, f"{before - at_start} transactions in the first 6 s"
        wait_until(lambda: time.monotonic() - idle_from >= 10, 15, "ten idle seconds")
        per_second = (transactions(sender) - before) / (time.monotonic() - idle_from)
        # Pushes tell of new rows: a look every 5 s (the work query in 4 statements of 32
        # sources, each a transaction, and the trigger check), the heartbeat, the states:
        # about 2 a second (2.1 measured). Polling every peek interval (50 ms) would be 80.
        assert per_second <= 3, f"{per_second:.1f} transactions/s while idle"
        assert bridge_connections(sender) <= 6
        # Traffic on every queue, so that every worker opens what it opens.
        sent: Counter[str] = Counter()
        for index in range(50):
            sent.update(send_bulk(sender, 20, SAMPLES_RECEIVER, queue(index)))
        most = 0

        def delivered() -> bool:
            nonlocal most
            most = max(most, bridge_connections(sender))
            return pg_count(receiver, SAMPLES_RECEIVER) == 1000

        wait_until(delivered, 120, "every message delivered")
        assert most <= 6, f"{most} connections to the forwarding database (max_connections 6)"
        assert daemon.stop() == 0, daemon.output()
    assert message_ids(receiver, SAMPLES_RECEIVER) == sent


@pytest.mark.slow
def test_a_busy_queue_does_not_starve_the_others(
    tmp_path: Path, new_pg_database: Callable[[], str]
) -> None:
    sender, receiver = new_pg_database(), new_pg_database()
    # Two pool workers (6 less upkeep, the watcher, its listener and the heartbeat), and the
    # busy forwarder may take both: only taking turns lets the quiet one through.
    config = many_forwarders(
        tmp_path,
        sender,
        receiver,
        2,
        concurrency=4,
        batch_size=20,
        sender_database={"max_connections": 6},
    )
    backlog = send_bulk(sender, 8_000, SAMPLES_RECEIVER, queue(0))
    with DaemonProcess(config, tmp_path / "daemon.log") as daemon:
        wait_until(lambda: pg_count(receiver, SAMPLES_RECEIVER) >= 200, 60, "the backlog to move")
        quiet = send_bulk(sender, 5, SAMPLES_RECEIVER, queue(1))
        wait_until(lambda: pg_count(sender, queue(1)) == 0, 30, "the quiet queue forwarded")
        assert pg_count(sender, queue(0)) > 0, "the backlog went first: nothing shows turns"
        wait_until(lambda: pg_count(sender, queue(0)) == 0, 300, "the backlog forwarded")
        assert daemon.stop() == 0, daemon.output()
    assert message_ids(receiver, SAMPLES_RECEIVER) == Counter(backlog | quiet)


def test_check_warns_when_the_pools_could_take_more_connections_than_the_server_accepts(
    pg_pair_factory: Callable[..., Any],
) -> None:
    pair = pg_pair_factory()
    _, admin = _statistics(pair.sender)
    [(limit,)] = pg_rows(admin, "SELECT current_setting('max_connections')::integer")
    checked = pair.cli("check")
    assert "connection(s) of the" in checked.stdout, checked.stdout
    import yaml

    raw = yaml.safe_load(pair.config.read_text())
    for database in raw["databases"].values():
        database["max_connections"] = int(limit)  # each alone as much as the server takes
    # Forwarders enough that their batches alone could fill the server (concurrency <= 64).
    first = raw["forwarders"][0]
    raw["forwarders"] = [
        {**first, "name": f"f{index}", "queue": f'"public"."Q{index}"', "concurrency": 64}
        for index in range(int(limit) // 64 + 2)
    ]
    write_config(pair.config, raw)
    checked = pair.cli("check")
    warning = next(
        (line for line in checked.stdout.splitlines() if "which accepts" in line), checked.stdout
    )
    assert warning.startswith("WARNING"), warning
    assert "database(s) 'receiver', 'sender'" in warning
    assert "(max_connections less its reserved ones)" in warning
