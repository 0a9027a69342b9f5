"""What `sfbridge status` finds of the daemons: which run, which configuration each runs (its
fingerprint) and which forwarders each serves (`bridge.storage.daemons`); per forwarder of the
configuration given, whether a running daemon serves it; and the exit code a probe can trust.

A daemon counts for a forwarder only when its row in the forwarder's own forwarding database
says it serves that forwarder (by name and queue): a daemon of another configuration serving
other forwarders of the same database does not. A forwarding database whose daemons cannot be
read says so: whether a daemon runs there is unknown, which is neither "running" nor "start it".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import dialect_for
from bridge.exceptions import DatabaseError, ExitCode, TableNotFound
from bridge.storage.daemons import (
    STALE_AFTER,
    DaemonRecord,
    ServedForwarder,
    is_stale,
    liveness,
    read_daemons,
)
from bridge.storage.tables import forwarder_tables

START_ADVICE = "start it: systemctl start sfbridge, or sfbridge run"


@dataclass
class DaemonsRead:
    """The daemons table of each forwarding database (`records`), or why it could not be read
    (`unreadable`: database -> error)."""

    records: dict[str, list[DaemonRecord]] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)


def read_all_daemons(config: BridgeConfig, connections: Connections) -> DaemonsRead:
    """Every forwarding database's daemons, each read once; a database without a daemons table
    has none (no daemon has run there yet)."""
    read = DaemonsRead()
    for forwarder in config.forwarders:
        database = forwarder.database
        if database in read.records or database in read.unreadable:
            continue
        dialect = dialect_for(config.databases[database].dialect)
        table = forwarder_tables(config, forwarder).daemons
        try:
            connection = connections.get(database)
            connection.begin()
            try:
                read.records[database] = read_daemons(connection, dialect, table)
            except TableNotFound:
                read.records[database] = []
            finally:
                connection.rollback()
        except DatabaseError as error:
            connections.discard(database)
            read.unreadable[database] = str(error)
    return read


def daemon_entries(
    read: DaemonsRead, now: datetime, fingerprint: str
) -> tuple[list[dict[str, Any]], int]:
    """One entry per daemon any forwarding database knows (its newest row among them), for
    `status`; stale entries are left out and counted (the second value)."""
    newest: dict[str, DaemonRecord] = {}
    seen_in: dict[str, list[str]] = {}
    serves: dict[str, list[str]] = {}
    stale: set[str] = set()
    for database, records in read.records.items():
        for record in records:
            if is_stale(record, now):
                stale.add(record.daemon)
                continue
            seen_in.setdefault(record.daemon, []).append(database)
            if record.forwarders is not None:
                serves.setdefault(record.daemon, []).extend(f.name for f in record.forwarders)
            known = newest.get(record.daemon)
            if known is None or (record.state, record.heartbeat_at) > (
                known.state,
                known.heartbeat_at,
            ):
                newest[record.daemon] = record
    entries = []
    for record in sorted(newest.values(), key=lambda r: (r.started_at, r.daemon)):
        entries.append(
            {
                "daemon": record.daemon,
                "host": record.host,
                "pid": record.pid,
                "state": liveness(record, now),
                "started": iso(record.started_at),
                "last_heartbeat": iso(record.heartbeat_at),
                "seconds_since_heartbeat": round(
                    max((now - record.heartbeat_at).total_seconds(), 0.0), 1
                ),
                "heartbeat_seconds": record.heartbeat_seconds,
                "stopped": iso(record.stopped_at),
                "forwarding_databases": seen_in[record.daemon],
                "config_fingerprint": record.config_fingerprint,
                "same_config": record.config_fingerprint == fingerprint,
                "forwarders": None if record.forwarders is None else serves.get(record.daemon, []),
            }
        )
    return entries, len(stale - set(newest))


def served_by(
    read: DaemonsRead, database: str, forwarder: ServedForwarder, now: datetime
) -> list[str] | None:
    """The running daemons that serve `forwarder` of the forwarding database `database`, as
    that database's daemons table says; None when it could not be read."""
    if database not in read.records:
        return None
    return [
        record.daemon
        for record in read.records[database]
        if liveness(record, now) == "running" and record.serves(forwarder)
    ]


def exit_code(status: dict[str, Any]) -> ExitCode:
    """UNAVAILABLE (3) when a forwarding database cannot be read (its forwarders' state is
    unknown); FAILED (1) when a forwarder of the configuration has no running daemon, or a
    login is refused; else OK (0)."""
    forwarders = status["forwarders"]
    if status.get("daemons_unreadable") or any("error" in f for f in forwarders):
        return ExitCode.UNAVAILABLE
    if status["auth_failed"] or any(f.get("served") is False for f in forwarders):
        return ExitCode.FAILED
    return ExitCode.OK


def render_daemons(status: dict[str, Any]) -> list[str]:
    """The daemons section: how many run, each daemon, what cannot be read."""
    daemons: list[dict[str, Any]] = status["daemons"]
    unreadable: list[dict[str, str]] = status.get("daemons_unreadable", [])
    running = [entry for entry in daemons if entry["state"] == "running"]
    unserved = [f["forwarder"] for f in status["forwarders"] if f.get("served") is False]
    lines = []
    if running:
        lines.append(
            f"daemons: {len(running)} running"
            + (f"; NONE serves forwarder(s) {', '.join(unserved)}" if unserved else "")
        )
    elif unreadable and not daemons:
        lines.append("daemons: UNKNOWN - the forwarding database(s) cannot be read (below)")
    elif daemons:
        lines.append(
            "daemons: NONE RUNNING - nothing is forwarded; what follows is as last seen "
            f"({START_ADVICE})"
        )
    else:
        lines.append(
            "daemons: NONE RUNNING - no daemon has recorded itself in the forwarding "
            f"database(s) ({START_ADVICE})"
        )
    for entry in unreadable:
        lines.append(
            f"  CANNOT READ forwarding database '{entry['database']}': {entry['error']} "
            "(whether a daemon runs there is unknown: check the database, not the daemon)"
        )
    for entry in daemons:
        lines.append(_daemon_line(entry))
    if status.get("stale_daemons"):
        hours = STALE_AFTER.total_seconds() / 3600
        lines.append(
            f"  ({status['stale_daemons']} stale entr(y/ies) not heard from for over {hours:g} h "
            "not shown; 'sfbridge daemons forget --stale' removes them)"
        )
    return lines


def _daemon_line(entry: dict[str, Any]) -> str:
    name, ago = entry["daemon"], human(entry["seconds_since_heartbeat"])
    if entry["state"] == "running":
        line = f"  {name:<24} running since {entry['started']}, last heartbeat {ago} ago"
    elif entry["state"] == "stopped":
        line = (
            f"  {name:<24} stopped at {entry['stopped']} (a clean stop; started {entry['started']})"
        )
    else:
        line = (
            f"  {name:<24} MISSING: no heartbeat for {ago} (every "
            f"{entry['heartbeat_seconds']:g} s expected): killed, or its host or network "
            f"is down; started {entry['started']}"
        )
    if entry["forwarders"] is not None:
        line += f"; serves {', '.join(entry['forwarders']) or 'nothing here'}"
    if entry["config_fingerprint"] is not None and not entry["same_config"]:
        line += f" (another configuration, {entry['config_fingerprint']})"
    return line


def render_served(status: dict[str, Any]) -> list[str]:
    """A forwarder's line saying whether a running daemon serves it."""
    served = status.get("served")
    if served is None:
        return ["  served by          UNKNOWN: its forwarding database cannot be read"]
    if served:
        return [f"  served by          {', '.join(status['served_by'])}"]
    return [f"  NOT SERVED         no running daemon serves this forwarder ({START_ADVICE})"]


def iso(moment: datetime | None) -> str | None:
    return moment.replace(tzinfo=UTC).isoformat(timespec="seconds") if moment else None


def human(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
