"""The daemons table (bridge.storage.daemons): liveness as a reader decides it, and what a
starting daemon forgets, on a real SQLite database."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from bridge.config.model import DatabaseConfig
from bridge.connections import connect
from bridge.dialects import dialect_for
from bridge.storage.daemons import (
    DaemonRecord,
    forget_daemons,
    liveness,
    read_daemons,
    save_daemon,
)

NOW = datetime(2026, 11, 26, 10, 0, 0)
SQLITE = dialect_for("sqlite")
TABLE = SQLITE.bridge_table("sfbridge_daemons", None)


def record(
    daemon: str, seconds_ago: float, state: str = "running", **changes: object
) -> DaemonRecord:
    host = daemon.split(":")[0]
    values: dict[str, object] = {
        "daemon": daemon,
        "host": host,
        "pid": int(daemon.split(":")[1]),
        "started_at": NOW - timedelta(hours=1),
        "heartbeat_at": NOW - timedelta(seconds=seconds_ago),
        "heartbeat_seconds": 5.0,
        "state": state,
        "stopped_at": NOW - timedelta(seconds=seconds_ago) if state == "stopped" else None,
    }
    values.update(changes)
    return DaemonRecord(**values)  # type: ignore[arg-type]


def test_a_daemon_is_missing_after_three_heartbeats_without_one() -> None:
    assert liveness(record("a:1", 14.9), NOW) == "running"
    assert liveness(record("a:1", 15.1), NOW) == "missing"
    # The interval is the one the daemon promised, not the reader's.
    assert liveness(record("a:1", 50, heartbeat_seconds=20.0), NOW) == "running"


def test_a_clean_stop_is_stopped_however_old() -> None:
    assert liveness(record("a:1", 0, "stopped"), NOW) == "stopped"
    assert liveness(record("a:1", 86400, "stopped"), NOW) == "stopped"


def test_rows_round_trip_and_a_starting_daemon_forgets_only_what_has_ended(
    tmp_path: Path,
) -> None:
    connection = connect(
        DatabaseConfig("edge", "sqlite", path=str(tmp_path / "edge.db")), create=True
    )
    connection.begin()
    connection.execute(SQLITE.sql("create_daemons_table", daemons=TABLE))
    rows = [
        record("a:1", 3600, "stopped"),  # same host, stopped: replaced by the new one
        record("a:2", 600),  # same host, missing: killed earlier
        record("a:3", 2),  # same host, running beside it: kept
        record("b:1", 3600, "stopped"),  # another host: kept until a week old
        record("b:2", 8 * 86400),  # another host, silent for 8 days: forgotten
    ]
    for row in rows:
        save_daemon(connection, SQLITE, TABLE, row)
    connection.commit()
    connection.begin()
    assert read_daemons(connection, SQLITE, TABLE) == sorted(
        rows, key=lambda r: (r.started_at, r.daemon)
    )
    starting = record("a:9", 0)
    forget_daemons(connection, SQLITE, TABLE, starting)
    save_daemon(connection, SQLITE, TABLE, starting)
    connection.commit()
    connection.begin()
    kept = {row.daemon for row in read_daemons(connection, SQLITE, TABLE)}
    connection.commit()
    connection.close()
    assert kept == {"a:3", "b:1", "a:9"}
