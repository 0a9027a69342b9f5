"""Which daemons work on a forwarding database, and whether they still run.

A forwarding database holds one row per daemon process (`sfbridge_daemons`): host, process id,
when it started, its last heartbeat and the heartbeat interval it promised, and `stopped` with
the time once it stopped cleanly. A daemon that is killed (SIGKILL, the host lost power, its
database unreachable) writes nothing more; its row then ages. So the state is the reader's to
decide: `stopped` when the daemon said so, `missing` when no heartbeat came for
`MISSED_HEARTBEATS` intervals, else `running`.

Times are naive UTC from the writing host's clock and compared with the reader's: hosts whose
clocks differ by more than a heartbeat or two (no NTP) can make a running daemon look missing.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from bridge.addressing import TableAddress
from bridge.dialects import Dialect
from bridge.drivers import Connection

Liveness = Literal["running", "stopped", "missing"]

# A daemon is `missing` after this many heartbeat intervals without one: one late write (a slow
# database, a busy host) is not yet a dead daemon, three are.
MISSED_HEARTBEATS = 3

# A starting daemon forgets daemons of any host not heard from for this long.
FORGET_AFTER = timedelta(days=7)


def this_daemon() -> str:
    """Who this process is in the daemons table (and in every state row it writes)."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class DaemonRecord:
    """One daemon's row, as a process writes it."""

    daemon: str
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_seconds: float
    state: Literal["running", "stopped"]
    stopped_at: datetime | None = None


def liveness(record: DaemonRecord, now: datetime) -> Liveness:
    """`stopped`, `missing` or `running`, as of `now` (naive UTC)."""
    if record.state == "stopped":
        return "stopped"
    silent = (now - record.heartbeat_at).total_seconds()
    return "missing" if silent > MISSED_HEARTBEATS * record.heartbeat_seconds else "running"


def save_daemon(
    connection: Connection, dialect: Dialect, table: TableAddress, record: DaemonRecord
) -> None:
    """Insert or replace `record`'s row (in the caller's transaction)."""
    connection.execute(
        dialect.sql("daemon_save", daemons=table),
        (
            record.daemon,
            record.host,
            record.pid,
            dialect.encode_timestamp(record.started_at),
            dialect.encode_timestamp(record.heartbeat_at),
            record.heartbeat_seconds,
            record.state,
            dialect.encode_timestamp(record.stopped_at),
        ),
    )


def forget_daemons(
    connection: Connection, dialect: Dialect, table: TableAddress, record: DaemonRecord
) -> None:
    """What `record`'s daemon, starting, no longer needs anyone to see: daemons of any host not
    heard from for `FORGET_AFTER`, and its own host's earlier daemons that stopped or are
    missing (a restart replaces them). Others of its host still running are kept."""
    missing_before = record.heartbeat_at - timedelta(
        seconds=MISSED_HEARTBEATS * record.heartbeat_seconds
    )
    connection.execute(
        dialect.sql("daemons_forget", daemons=table),
        (
            dialect.encode_timestamp(record.heartbeat_at - FORGET_AFTER),
            record.host,
            record.daemon,
            dialect.encode_timestamp(missing_before),
        ),
    )


def read_daemons(connection: Connection, dialect: Dialect, table: Any) -> list[DaemonRecord]:
    """Every row of the daemons table, oldest start first."""
    rows = connection.query(dialect.sql("daemons_read", daemons=table))
    return [
        DaemonRecord(
            daemon=str(row[0]),
            host=str(row[1]),
            pid=int(row[2]),
            started_at=_timestamp(dialect, row[3]),
            heartbeat_at=_timestamp(dialect, row[4]),
            heartbeat_seconds=float(row[5]),
            state="stopped" if row[6] == "stopped" else "running",
            stopped_at=dialect.decode_timestamp(row[7]),
        )
        for row in rows
    ]


def _timestamp(dialect: Dialect, value: Any) -> datetime:
    decoded = dialect.decode_timestamp(value)
    assert decoded is not None  # NOT NULL columns
    return decoded
