"""`sfbridge check`: connectivity, table shapes and indexes, all reported at once."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from bridge.addressing import QueueAddress
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.daemon import ledger_databases
from bridge.dialects import Dialect, dialect_for
from bridge.dialects.base import LEDGER_TABLE
from bridge.drivers import Connection, DatabaseError
from bridge.forwarding import forwarder_tables


@dataclass(frozen=True)
class Finding:
    ok: bool
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"{'ok     ' if self.ok else 'PROBLEM'}  {self.subject}: {self.detail}"


def run_checks(config: BridgeConfig) -> list[Finding]:
    """Every finding, good and bad. Never raises for database errors."""
    findings: list[Finding] = []
    connections = Connections(config.databases)
    reachable: set[str] = set()
    try:
        for name in config.databases:
            try:
                connection = connections.get(name)
                connection.begin()
                connection.query("SELECT 1")
                connection.commit()
                reachable.add(name)
                findings.append(Finding(True, f"database '{name}'", "reachable"))
            except DatabaseError as error:
                findings.append(Finding(False, f"database '{name}'", f"{error.detail}"))
        for forwarder in config.forwarders:
            if forwarder.database not in reachable:
                continue
            tables = forwarder_tables(config, forwarder)
            dialect = dialect_for(config.databases[forwarder.database].dialect)
            connection = connections.get(forwarder.database)
            label = f"forwarder '{forwarder.name}'"
            findings.extend(_check_queue(connection, dialect, tables.queue, f"{label} queue"))
            findings.extend(
                _check_queue(connection, dialect, tables.error_queue, f"{label} error queue")
            )
            findings.extend(
                _check_exists(connection, dialect, tables.retry, f"{label} retry storage")
            )
            findings.extend(
                _check_exists(connection, dialect, tables.counters, f"{label} counters")
            )
        for name in ledger_databases(config):
            if name not in reachable:
                continue
            target = config.databases[name]
            dialect = dialect_for(target.dialect)
            ledger = dialect.bridge_table(LEDGER_TABLE, target.schema)
            findings.extend(
                _check_exists(
                    connections.get(name), dialect, ledger, f"database '{name}' dedup ledger"
                )
            )
    finally:
        connections.close()
    return findings


def _columns(connection: Connection, dialect: Dialect, address: QueueAddress) -> dict[str, str]:
    rows = connection.query(dialect.sql("table_columns"), (address.schema, address.table))
    connection.commit()
    return {str(row[0]): str(row[1]) for row in rows}


def _check_exists(
    connection: Connection, dialect: Dialect, address: QueueAddress, subject: str
) -> Iterator[Finding]:
    rendered = dialect.grammar.render(address)
    if _columns(connection, dialect, address):
        yield Finding(True, subject, f"{rendered} exists")
    else:
        yield Finding(False, subject, f"{rendered} is missing; run 'sfbridge install'")


def _check_queue(
    connection: Connection, dialect: Dialect, address: QueueAddress, subject: str
) -> Iterator[Finding]:
    rendered = dialect.grammar.render(address)
    columns = _columns(connection, dialect, address)
    if not columns:
        yield Finding(False, subject, f"{rendered} is missing; run 'sfbridge install'")
        return
    missing = sorted(dialect.queue_columns - set(columns))
    if missing:
        yield Finding(
            False,
            subject,
            f"{rendered} is not an NServiceBus queue table: missing column(s) {', '.join(missing)}",
        )
        return
    indexes = connection.query(dialect.sql("table_indexes"), (address.schema, address.table))
    connection.commit()
    definitions = [str(row[1] or "").lower() for row in indexes]
    for column in dialect.queue_indexed_columns:
        if not any(f"({column}" in d.replace('"', "") for d in definitions):
            yield Finding(
                False,
                subject,
                f"{rendered} has no index on {column}; receiving will scan the table "
                "(re-create it with the transport's DDL, or 'sfbridge install --print-sql')",
            )
            return
    yield Finding(True, subject, f"{rendered} has the NServiceBus queue shape")
