"""The audit log: one row per operator command that changed something (pause, resume, errors
replay and purge, retries now and fail), in the forwarding database it changed: who (the OS
user and host), when, what (the command and its target or filters) and how many messages or
rows it affected. `sfbridge status` shows the latest."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from bridge.addressing import TableAddress
from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.storage.tables import owned_table


@dataclass(frozen=True)
class AuditEntry:
    """One operator command, as recorded."""

    recorded_at: datetime  # naive UTC
    operator: str
    host: str
    command: str
    target: str
    affected: int


def record_entry(
    connection: Connection, dialect: Dialect, table: TableAddress, entry: AuditEntry
) -> None:
    """Insert `entry` in its own transaction. Raises BridgeTableMissing when the table is not
    there, and the DatabaseError family."""
    try:
        connection.begin()
        with owned_table("audit log", dialect.grammar.render(table)):
            connection.execute(
                dialect.sql("audit_record", audit=table),
                (
                    dialect.encode_timestamp(entry.recorded_at),
                    entry.operator[:200],
                    entry.host[:200],
                    entry.command[:100],
                    entry.target,
                    entry.affected,
                ),
            )
        connection.commit()
    except BaseException:
        connection.rollback()
        raise


def open_entry(
    connection: Connection, dialect: Dialect, table: TableAddress, entry: AuditEntry
) -> int:
    """Insert `entry` with nothing affected yet, in its own transaction, before a command of
    several transactions starts; its row's seq, for `add_affected`. A command killed half way
    then leaves a record of exactly what it did. Raises BridgeTableMissing when the table is
    not there, and the DatabaseError family."""
    try:
        connection.begin()
        with owned_table("audit log", dialect.grammar.render(table)):
            rows = connection.query(
                dialect.sql("audit_open", audit=table),
                (
                    dialect.encode_timestamp(entry.recorded_at),
                    entry.operator[:200],
                    entry.host[:200],
                    entry.command[:100],
                    entry.target,
                ),
            )
        connection.commit()
    except BaseException:
        connection.rollback()
        raise
    return int(rows[0][0])


def add_affected(
    connection: Connection, dialect: Dialect, table: TableAddress, seq: int, count: int
) -> None:
    """Add `count` to the row `open_entry` made, in the caller's transaction: the one that
    moved them, so the record and the messages commit (or roll back) together."""
    connection.execute(dialect.sql("audit_add", audit=table), (count, seq))


def read_entries(
    connection: Connection, dialect: Dialect, table: TableAddress, limit: int
) -> list[AuditEntry]:
    """The latest `limit` entries, newest first. Raises TableNotFound when there is no table
    yet, and the DatabaseError family."""
    try:
        connection.begin_read()
        rows = connection.query(dialect.sql("audit_read", audit=table), (limit,))
    finally:
        connection.rollback()
    entries = []
    for recorded_at, operator, host, command, target, affected in rows:
        moment = dialect.decode_timestamp(recorded_at)
        assert moment is not None
        entries.append(
            AuditEntry(moment, str(operator), str(host), str(command), str(target), int(affected))
        )
    return entries
