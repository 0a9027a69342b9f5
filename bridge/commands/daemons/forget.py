"""`sfbridge daemons forget`: remove the entries of daemons that no longer run from the daemons
tables, so that `status` stops showing them. A running daemon is never forgotten (it would write
its entry again at its next heartbeat); each change is in the audit log."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from datetime import datetime

from bridge.commands.audit import record_command
from bridge.commands.configuration import load
from bridge.commands.selection import finish
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import dialect_for
from bridge.exceptions import DatabaseError, ExitCode, RequestError, TableNotFound
from bridge.messages import utcnow
from bridge.storage.daemons import (
    STALE_AFTER,
    DaemonRecord,
    delete_daemon,
    is_stale,
    liveness,
    read_daemons,
)
from bridge.storage.tables import forwarder_tables


def add_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", metavar="HOST:PID", help="the daemon, as 'status' names it")
    which.add_argument(
        "--host", metavar="HOST", help="every daemon of this host that is not running"
    )
    which.add_argument(
        "--stale",
        action="store_true",
        help=f"every daemon not heard from for over {STALE_AFTER.total_seconds() / 3600:g} h",
    )


@dataclass(frozen=True)
class Forget:
    """Which entries to forget: by `daemon` id, by `host`, or the `stale` ones."""

    daemon: str | None = None
    host: str | None = None
    stale: bool = False

    def given(self) -> str:
        if self.daemon is not None:
            return f"--id {self.daemon}"
        return f"--host {self.host}" if self.host is not None else "--stale"

    def selects(self, record: DaemonRecord, now: datetime) -> bool:
        """Whether `record` is one of them; never a running daemon."""
        if liveness(record, now) == "running":
            return False
        if self.stale:
            return is_stale(record, now)
        if self.daemon is not None:
            return record.daemon == self.daemon
        return record.host == self.host


def run(args: argparse.Namespace) -> int:
    config = load(args)
    forget = Forget(daemon=args.id, host=args.host, stale=args.stale)
    connections = Connections(config.databases)
    problems: list[DatabaseError] = []
    try:
        forgotten, running = forget_daemons(config, forget, connections, problems)
    finally:
        connections.close()
    if forget.daemon is not None and forget.daemon in running:
        raise RequestError(
            f"daemon {forget.daemon} is running; it is not forgotten",
            advice="stop it first (systemctl stop sfbridge on its host); a clean stop is "
            "recorded, and a daemon that stopped can then be forgotten",
        )
    if forgotten:
        print(f"forgot {len(forgotten)} daemon entr(y/ies): {', '.join(sorted(forgotten))}")
    elif not problems:
        print(f"no daemon that is not running matches {forget.given()}; nothing to do")
    return finish("daemons forget", problems, ExitCode.OK)


def forget_daemons(
    config: BridgeConfig,
    forget: Forget,
    connections: Connections,
    problems: list[DatabaseError],
) -> tuple[set[str], set[str]]:
    """Delete the entries `forget` selects in every forwarding database, each change audited;
    returns the daemons forgotten and the running daemons that matched `--id`. A database that
    fails is added to `problems`; the others go on."""
    forgotten: set[str] = set()
    running: set[str] = set()
    done: set[str] = set()
    for forwarder in config.forwarders:
        database = forwarder.database
        if database in done:
            continue
        done.add(database)
        dialect = dialect_for(config.databases[database].dialect)
        table = forwarder_tables(config, forwarder).daemons
        try:
            connection = connections.get(database)
            connection.begin()
            try:
                records = read_daemons(connection, dialect, table)
            except TableNotFound:
                connection.rollback()
                continue
            now = utcnow()
            running |= {
                r.daemon
                for r in records
                if r.daemon == forget.daemon and liveness(r, now) == "running"
            }
            here = [
                r.daemon
                for r in records
                if forget.selects(r, now) and delete_daemon(connection, dialect, table, r)
            ]
            connection.commit()
        except DatabaseError as error:
            connections.discard(database)
            problems.append(error)
            continue
        if here:
            forgotten.update(here)
            record_command(
                config, connections, database, "daemons forget", forget.given(), len(here)
            )
    return forgotten, running
