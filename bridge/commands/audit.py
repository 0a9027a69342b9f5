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

from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import dialect_for
from bridge.exceptions import BridgeTableMissing, DatabaseError
from bridge.secrets import for_terminal
from bridge.storage.audit import AuditEntry, record_entry
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
    connections: Connections,
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
        for_terminal(target),
        database,
        affected,
    )
    forwarder = next((f for f in config.forwarders if f.database == database), None)
    if forwarder is None:
        return
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
