"""Recording operator commands (`bridge.storage.audit`): in the CLI's log (stderr) and in the
audit log table of the forwarding database the command changed.

An operator command never fails for want of its audit row: a table that is missing is created
like the bridge's other tables (when `install.at_runtime` allows), and one that cannot be
written is a warning in the log, after the command has done its work.
"""

from __future__ import annotations

import getpass
import logging
import socket
from datetime import UTC, datetime

from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.connections import Connections
from bridge.dialects import dialect_for
from bridge.exceptions import BridgeTableMissing, DatabaseError
from bridge.storage.audit import AuditEntry, read_entries, record_entry
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
    entry = AuditEntry(
        recorded_at=datetime.now(UTC).replace(tzinfo=None),
        operator=operator_name(),
        host=socket.gethostname(),
        command=command,
        target=target,
        affected=affected,
    )
    log.info(
        "audit: %s@%s ran '%s' on %s in database '%s': %d affected",
        entry.operator,
        entry.host,
        command,
        target,
        database,
        affected,
    )
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
            steps = [
                step
                for step in forwarder_table_steps(config, forwarder)
                if step.table == table or (step.table is None and step.schema == table.schema)
            ]
            create_tables(connection, dialect, steps, only_missing=True)
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
