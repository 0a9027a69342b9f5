"""Recording operator commands (`bridge.storage.audit`): in the CLI's log (stderr) and in the
audit log table of the forwarding database the command changed.

An operator command never fails for want of its audit row: a table that is missing is created
like the bridge's other tables (when `install.at_runtime` allows), and one that cannot be
written is a warning in the log, after the command has done its work.
"""

from __future__ import annotations

import getpass
import json
import logging
import socket
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from bridge.addressing import TableAddress
from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.connections import Connections
from bridge.dialects import dialect_for
from bridge.drivers import Connection
from bridge.exceptions import BridgeTableMissing, DatabaseError, ExitCode
from bridge.messages import utcnow
from bridge.secrets import inert
from bridge.storage.audit import (
    AuditEntry,
    add_affected,
    open_entry,
    read_entries,
    record_entry,
)
from bridge.storage.tables import create_tables, forwarder_table_steps, forwarder_tables

log = logging.getLogger("sfbridge.audit")


def operator_name() -> str:
    """The OS user running the command."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def record_command(
    config: BridgeConfig,
    connections: Connections | None,
    database: str,
    command: str,
    target: str,
    affected: int,
) -> None:
    """Log and record that `command` (e.g. `retries fail`) on `target` (its forwarder,
    destination or filters) affected `affected` messages or rows in the forwarding database
    `database`. Never raises for the record: warns instead."""
    entry = _entry(command, target, affected)
    _log(entry, database, affected)
    forwarder = next((f for f in config.forwarders if f.database == database), None)
    if forwarder is None:
        return
    if connections is None:
        own = Connections(config.databases)
        try:
            _record(config, own, forwarder, database, entry)
        finally:
            own.close()
    else:
        _record(config, connections, forwarder, database, entry)


def _record(
    config: BridgeConfig,
    connections: Connections,
    forwarder: ForwarderConfig,
    database: str,
    entry: AuditEntry,
) -> None:
    command = entry.command
    dialect = dialect_for(config.databases[database].dialect)
    table = forwarder_tables(config, forwarder).audit
    try:
        connection = connections.get(database, "audit")
        try:
            record_entry(connection, dialect, table, entry)
        except BridgeTableMissing:
            if not config.install.at_runtime:
                raise
            _create(config, connection, forwarder, table)
            record_entry(connection, dialect, table, entry)
    except DatabaseError as error:
        connections.discard(database, "audit")
        log.warning(
            "could not record '%s' in the audit log of database '%s' (%s); the command itself "
            "did its work",
            command,
            database,
            error,
        )


@dataclass
class OpenCommand:
    """A command of several transactions recorded before it starts (`open_command`): each of
    its transactions adds what it moved (`add`), so its record is exact even when it is
    killed half way; `close` logs the total."""

    config: BridgeConfig
    database: str
    entry: AuditEntry
    seq: int | None  # None: its row could not be written (warned); the log line still comes
    affected: int = 0

    def add(self, connection: Connection, count: int) -> None:
        """Count `count` more in the caller's transaction on `connection` (the forwarding
        database's, the one that moved them)."""
        self.affected += count
        if self.seq is None or count == 0:
            return
        forwarder = next(f for f in self.config.forwarders if f.database == self.database)
        dialect = dialect_for(self.config.databases[self.database].dialect)
        table = forwarder_tables(self.config, forwarder).audit
        add_affected(connection, dialect, table, self.seq, count)

    def close(self) -> None:
        _log(self.entry, self.database, self.affected)


def open_command(
    config: BridgeConfig, connection: Connection, database: str, command: str, target: str
) -> OpenCommand:
    """Record in `database`'s audit log, on `connection` (no transaction open, none left
    open), that `command` on `target` starts, with nothing affected yet. Never raises for
    the record: warns instead, and the command runs unrecorded in the table."""
    entry = _entry(command, target, 0)
    forwarder = next((f for f in config.forwarders if f.database == database), None)
    if forwarder is None:
        return OpenCommand(config, database, entry, None)
    dialect = dialect_for(config.databases[database].dialect)
    table = forwarder_tables(config, forwarder).audit
    try:
        try:
            seq = open_entry(connection, dialect, table, entry)
        except BridgeTableMissing:
            if not config.install.at_runtime:
                raise
            _create(config, connection, forwarder, table)
            seq = open_entry(connection, dialect, table, entry)
    except DatabaseError as error:
        log.warning(
            "could not record '%s' in the audit log of database '%s' (%s); the command runs "
            "unrecorded there",
            command,
            database,
            error,
        )
        return OpenCommand(config, database, entry, None)
    return OpenCommand(config, database, entry, seq)


def _entry(command: str, target: str, affected: int) -> AuditEntry:
    return AuditEntry(
        recorded_at=utcnow(),
        operator=operator_name(),
        host=socket.gethostname(),
        command=command,
        target=target,
        affected=affected,
    )


def _log(entry: AuditEntry, database: str, affected: int) -> None:
    log.info(
        "audit: %s@%s ran '%s' on %s in database '%s': %d affected",
        entry.operator,
        entry.host,
        entry.command,
        entry.target,
        database,
        affected,
    )


def _create(
    config: BridgeConfig, connection: Connection, forwarder: ForwarderConfig, table: TableAddress
) -> None:
    """Create the audit log (and its schema where missing), as the daemon would."""
    dialect = dialect_for(config.databases[forwarder.database].dialect)
    steps = [
        step
        for step in forwarder_table_steps(config, forwarder)
        if step.table == table or (step.table is None and step.schema == table.schema)
    ]
    create_tables(connection, dialect, steps, only_missing=True)


def recent_commands(
    config: BridgeConfig, connections: Connections, limit: int
) -> list[dict[str, object]]:
    """The latest `limit` operator commands over every forwarding database, newest first (a
    database that cannot be read, or has no audit log yet, adds none)."""
    entries: list[tuple[AuditEntry, str]] = []
    for database in dict.fromkeys(f.database for f in config.forwarders):
        forwarder = next(f for f in config.forwarders if f.database == database)
        dialect = dialect_for(config.databases[database].dialect)
        try:
            rows = read_entries(
                connections.get(database), dialect, forwarder_tables(config, forwarder).audit, limit
            )
        except DatabaseError:  # TableNotFound included: no command recorded there yet
            connections.discard(database)
            continue
        entries += [(entry, database) for entry in rows]
    entries.sort(key=lambda pair: pair[0].recorded_at, reverse=True)
    return [
        {
            "at": entry.recorded_at.replace(tzinfo=UTC).isoformat(timespec="seconds"),
            "operator": entry.operator,
            "host": entry.host,
            "command": entry.command,
            "target": entry.target,
            "affected": entry.affected,
            "database": database,
        }
        for entry, database in entries[:limit]
    ]


def render_audit(entries: list[dict[str, Any]]) -> list[str]:
    """One line per recorded operator command, newest first."""
    return [
        f"  {entry['at']}  {entry['operator']}@{entry['host']}  {entry['command']} "
        f"{entry['target']}: {entry['affected']} affected (database '{entry['database']}')"
        for entry in entries
    ]


def print_recent_commands(config: BridgeConfig, *, as_json: bool) -> int:
    """`status --audit`: print the last 50 operator commands; ExitCode.OK."""
    connections = Connections(config.databases)
    try:
        audit = recent_commands(config, connections, 50)
    finally:
        connections.close()
    if as_json:
        print(json.dumps({"audit": audit}, indent=2))
    else:
        print(
            "\n".join(inert(line) for line in render_audit(audit))
            or "no operator commands recorded"
        )
    return ExitCode.OK
