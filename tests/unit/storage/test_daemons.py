"""The daemons table (bridge.storage.daemons): liveness as a reader decides it, and what a
starting daemon forgets, on a real SQLite database."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from bridge.config.model import DatabaseConfig
from bridge.connections import connect
from bridge.dialects import dialect_for
from bridge.exceptions import BridgeTableMissing
from bridge.storage.daemons import (
    DaemonRecord,
    ServedForwarder,
    delete_daemon,
    forget_daemons,
    is_stale,
    liveness,
    read_daemons,
    save_daemon,
    upgrade_daemons_table,
)

NOW = datetime(2026, 11, 26, 10, 0, 0)
HOUR = timedelta(hours=1)
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


def test_a_daemon_is_missing_before_three_heartbeats_pass_without_one() -> None:
    # One late heartbeat is not a dead daemon; two and a half missed intervals are, so a
    # daemon killed right after a heartbeat reads missing within three intervals.
    assert liveness(record("a:1", 12.4), NOW) == "running"
    assert liveness(record("a:1", 12.6), NOW) == "missing"
    assert liveness(record("a:1", 14.9), NOW) == "missing"
    # The interval is the one the daemon promised, not the reader's.
    assert liveness(record("a:1", 45, heartbeat_seconds=20.0), NOW) == "running"


def test_an_entry_not_heard_from_for_a_day_is_stale_unless_it_runs() -> None:
    assert not is_stale(record("a:1", 23 * 3600), NOW)
    assert is_stale(record("a:1", 25 * 3600), NOW)  # missing for a day
    assert is_stale(record("a:1", 25 * 3600, "stopped"), NOW)  # stopped a day ago
    assert not is_stale(record("a:1", 60, "stopped"), NOW)
    # A daemon that promised a heartbeat every two days and wrote one a day ago runs.
    assert not is_stale(record("a:1", 25 * 3600, heartbeat_seconds=2 * 86400.0), NOW)


def test_what_a_daemon_serves_round_trips_and_an_older_table_is_read_and_upgraded(
    tmp_path: Path,
) -> None:
    connection = connect(
        DatabaseConfig("edge", "sqlite", path=str(tmp_path / "edge.db")), create=True
    )
    # A daemons table as an sfbridge before the fingerprint made it, with a row.
    connection.begin()
    connection.execute(
        """CREATE TABLE sfbridge_daemons (daemon TEXT NOT NULL PRIMARY KEY, host TEXT NOT NULL,
        pid INTEGER NOT NULL, started_at TEXT NOT NULL, heartbeat_at TEXT NOT NULL,
        heartbeat_seconds REAL NOT NULL, state TEXT NOT NULL, stopped_at TEXT)"""
    )
    connection.execute(
        "INSERT INTO sfbridge_daemons VALUES ('old:1', 'old', 1, ?, ?, 5.0, 'running', NULL)",
        (SQLITE.encode_timestamp(NOW), SQLITE.encode_timestamp(NOW)),
    )
    connection.commit()
    connection.begin()
    [old] = read_daemons(connection, SQLITE, TABLE)
    connection.rollback()
    assert (old.daemon, old.config_fingerprint, old.forwarders) == ("old:1", None, None)
    # Not recorded: taken to serve every forwarder of its database.
    assert old.serves(ServedForwarder("anything", '"q"'))
    with pytest.raises(BridgeTableMissing, match=r"install\.at_runtime is false"):
        upgrade_daemons_table(connection, SQLITE, TABLE, allowed=False)
    assert upgrade_daemons_table(connection, SQLITE, TABLE, allowed=True)
    assert not upgrade_daemons_table(connection, SQLITE, TABLE, allowed=True)

    served = (ServedForwarder("orders", '"orders"'), ServedForwarder("bills", '"bills"'))
    new = record("new:2", 0, config_fingerprint="0123456789abcdef", forwarders=served)
    connection.begin()
    save_daemon(connection, SQLITE, TABLE, new)
    connection.commit()
    connection.begin()
    assert read_daemons(connection, SQLITE, TABLE) == [new, old]  # oldest start first
    connection.rollback()
    assert new.serves(ServedForwarder("orders", '"orders"'))
    # The same name on another queue (another configuration's forwarder) is not served.
    assert not new.serves(ServedForwarder("orders", '"other"'))

    # Forgetting one entry: not when it wrote a heartbeat since it was read.
    connection.begin()
    assert not delete_daemon(connection, SQLITE, TABLE, replace(old, heartbeat_at=NOW - HOUR))
    assert delete_daemon(connection, SQLITE, TABLE, old)
    connection.commit()
    connection.begin()
    assert [r.daemon for r in read_daemons(connection, SQLITE, TABLE)] == ["new:2"]
    connection.rollback()
    connection.close()


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
        record("b:1", 3600, "stopped"),  # another host: kept until stale (a day)
        record("b:2", 25 * 3600),  # another host, silent for over a day: forgotten
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
