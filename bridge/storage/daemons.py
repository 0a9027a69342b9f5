"""Which daemons work on a forwarding database, what they serve, and whether they still run.

A forwarding database holds one row per daemon process (`sfbridge_daemons`): host, process id,
when it started, its last heartbeat and the heartbeat interval it promised, `stopped` with the
time once it stopped cleanly, and what it serves: the fingerprint of its configuration
(`bridge.config.fingerprint`) and its forwarders of this database (name and queue). A daemon
that is killed (SIGKILL, the host lost power, its database unreachable) writes nothing more;
its row then ages. So the state is the reader's to decide: `stopped` when the daemon said so,
`missing` when no heartbeat came for `MISSING_AFTER` intervals, else `running`; and an entry
not heard from for `STALE_AFTER` is *stale*: `status` no longer counts or lists it, and the next
daemon to start on the database (or `sfbridge daemons forget --stale`) deletes it.

Times are naive UTC from the writing host's clock and compared with the reader's: hosts whose
clocks differ by more than a heartbeat or two (no NTP) can make a running daemon look missing.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from bridge.addressing import TableAddress
from bridge.config.model import BridgeConfig
from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.exceptions import BridgeTableMissing, PermissionDenied, TableNotFound
from bridge.storage.tables import forwarder_tables, split_statements

Liveness = Literal["running", "stopped", "missing"]

# A daemon is `missing` after this many heartbeat intervals without one. Two and a half: one
# late or lost write (a slow database, a busy host) is not yet a dead daemon, and a daemon
# killed right after a heartbeat reads `missing` within three intervals of its death.
MISSING_AFTER = 2.5

# An entry not heard from (no heartbeat, or its clean stop) for this long is stale: it tells
# nothing about now, and is forgotten.
STALE_AFTER = timedelta(hours=24)


def this_daemon() -> str:
    """Who this process is in the daemons table (and in every state row it writes)."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class ServedForwarder:
    """A forwarder a daemon serves: its name and its queue (canonical), so that a forwarder of
    the same name in another configuration, on another queue, is not taken for it."""

    name: str
    queue: str


@dataclass(frozen=True)
class DaemonRecord:
    """One daemon's row, as a process writes it. `forwarders` None: not recorded (a daemon of
    an sfbridge from before it)."""

    daemon: str
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_seconds: float
    state: Literal["running", "stopped"]
    stopped_at: datetime | None = None
    config_fingerprint: str | None = None
    forwarders: tuple[ServedForwarder, ...] | None = None

    def serves(self, forwarder: ServedForwarder) -> bool:
        """Whether this daemon works on `forwarder`; one that did not record what it serves
        is taken to serve every forwarder of its database."""
        return self.forwarders is None or forwarder in self.forwarders


def served_forwarders(config: BridgeConfig, database: str) -> tuple[ServedForwarder, ...]:
    """The forwarders a daemon of `config` serves on the forwarding database `database`."""
    return tuple(
        ServedForwarder(forwarder.name, forwarder_tables(config, forwarder).queue_canonical)
        for forwarder in config.forwarders
        if forwarder.database == database
    )


def liveness(record: DaemonRecord, now: datetime) -> Liveness:
    """`stopped`, `missing` or `running`, as of `now` (naive UTC)."""
    if record.state == "stopped":
        return "stopped"
    silent = (now - record.heartbeat_at).total_seconds()
    return "missing" if silent > MISSING_AFTER * record.heartbeat_seconds else "running"


def last_heard(record: DaemonRecord) -> datetime:
    """When the daemon last wrote: its clean stop, else its last heartbeat."""
    return record.stopped_at or record.heartbeat_at


def is_stale(record: DaemonRecord, now: datetime) -> bool:
    """Whether the entry is not running and was not heard from for `STALE_AFTER`."""
    return liveness(record, now) != "running" and now - last_heard(record) > STALE_AFTER


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
            record.config_fingerprint,
            None if record.forwarders is None else encode_forwarders(record.forwarders),
        ),
    )


def forget_daemons(
    connection: Connection, dialect: Dialect, table: TableAddress, record: DaemonRecord
) -> None:
    """What `record`'s daemon, starting, no longer needs anyone to see: daemons of any host not
    heard from for `STALE_AFTER`, and its own host's earlier daemons that stopped or are
    missing (a restart replaces them). Others of its host still running are kept."""
    missing_before = record.heartbeat_at - timedelta(
        seconds=MISSING_AFTER * record.heartbeat_seconds
    )
    connection.execute(
        dialect.sql("daemons_forget", daemons=table),
        (
            dialect.encode_timestamp(record.heartbeat_at - STALE_AFTER),
            record.host,
            record.daemon,
            dialect.encode_timestamp(missing_before),
        ),
    )


def read_daemons(connection: Connection, dialect: Dialect, table: Any) -> list[DaemonRecord]:
    """Every row of the daemons table, oldest start first (in the caller's transaction). A
    table an earlier sfbridge made, without what each daemon serves, is read as it is. Raises
    TableNotFound when there is no daemons table, and the DatabaseError family."""
    columns = _columns(connection, dialect, table)
    if not columns:
        raise TableNotFound(connection.database, f"{dialect.grammar.render(table)} does not exist")
    statement = "daemons_read" if "forwarders" in columns else "daemons_read_without_identity"
    rows = connection.query(dialect.sql(statement, daemons=table))
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
            config_fingerprint=None if row[8] is None else str(row[8]),
            forwarders=None if row[9] is None else decode_forwarders(str(row[9])),
        )
        for row in rows
    ]


def delete_daemon(
    connection: Connection, dialect: Dialect, table: TableAddress, record: DaemonRecord
) -> bool:
    """Forget `record`'s entry (in the caller's transaction), unless its daemon wrote a
    heartbeat since it was read; True if it was deleted."""
    deleted = connection.execute(
        dialect.sql("daemon_delete", daemons=table),
        (record.daemon, dialect.encode_timestamp(record.heartbeat_at)),
    )
    return deleted > 0


def upgrade_daemons_table(
    connection: Connection, dialect: Dialect, table: TableAddress, *, allowed: bool
) -> bool:
    """Add what each daemon serves (its configuration's fingerprint and forwarders) to a
    daemons table an earlier sfbridge made; True if added.

    Reads the catalog first (no DDL right needed when the columns are there). `connection`
    must have no transaction open; none is left open. Raises TableNotFound when the table
    does not exist, BridgeTableMissing when the columns are missing and may not be added
    (`allowed` False, or the login lacks the right), and the DatabaseError family.
    """
    connection.begin()
    try:
        columns = _columns(connection, dialect, table)
    finally:
        connection.rollback()
    if not columns:
        raise TableNotFound(connection.database, f"{dialect.grammar.render(table)} does not exist")
    if "forwarders" in columns:
        return False
    statement = dialect.sql("daemons_add_identity", daemons=table)
    missing = TableNotFound(
        connection.database, "columns config_fingerprint, forwarders are missing"
    )

    def person_must(why: str) -> BridgeTableMissing:
        return BridgeTableMissing(
            missing,
            "daemons table columns config_fingerprint and forwarders in",
            dialect.grammar.render(table),
            f"{why}: run 'sfbridge install', or have a DBA run: {' '.join(statement.split())}",
        )

    if not allowed:
        raise person_must("install.at_runtime is false")
    connection.begin()
    try:
        for part in split_statements(statement):
            connection.execute(part)
        connection.commit()
    except PermissionDenied as error:
        connection.rollback()
        raise person_must(f"the bridge's login may not add them ({error.detail})") from None
    except BaseException:
        connection.rollback()
        raise
    return True


def encode_forwarders(forwarders: tuple[ServedForwarder, ...]) -> str:
    return json.dumps([{"forwarder": f.name, "queue": f.queue} for f in forwarders])


def decode_forwarders(text: str) -> tuple[ServedForwarder, ...] | None:
    """What `encode_forwarders` wrote; None for text it cannot have written."""
    try:
        items = json.loads(text)
        return tuple(ServedForwarder(str(i["forwarder"]), str(i["queue"])) for i in items)
    except (ValueError, TypeError, KeyError):
        return None


def _columns(connection: Connection, dialect: Dialect, table: TableAddress) -> set[str]:
    rows = connection.query(dialect.sql("table_columns", queue=table), (table.schema, table.table))
    return {str(row[0]).lower() for row in rows}


def _timestamp(dialect: Dialect, value: Any) -> datetime:
    decoded = dialect.decode_timestamp(value)
    assert decoded is not None  # NOT NULL columns
    return decoded
