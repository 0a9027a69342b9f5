"""Create the tables the bridge needs, or print their DDL for a DBA (seed 001)."""

from __future__ import annotations

from dataclasses import dataclass

from bridge.config.model import BridgeConfig
from bridge.dialects import dialect_for
from bridge.dialects.base import LEDGER_TABLE
from bridge.drivers import DatabaseError, DuplicateKey, connect
from bridge.forwarding import forwarder_tables


@dataclass(frozen=True)
class InstallStep:
    database: str
    description: str
    statements: tuple[str, ...]


def split_statements(script: str) -> tuple[str, ...]:
    """Split a dialect template into single statements (drivers run one at a time)."""
    return tuple(part.strip() for part in script.split(";\n") if part.strip())


def install_plan(config: BridgeConfig) -> list[InstallStep]:
    """Every table to create, per database, in order. Idempotent statements only."""
    steps: list[InstallStep] = []
    seen: set[tuple[str, str]] = set()

    def add(database: str, description: str, script: str) -> None:
        if (database, script) in seen:
            return
        seen.add((database, script))
        steps.append(InstallStep(database, description, split_statements(script)))

    for forwarder in config.forwarders:
        dialect = dialect_for(config.databases[forwarder.database].dialect)
        tables = forwarder_tables(config, forwarder)
        name = forwarder.database
        for address in (tables.queue, tables.error_queue, tables.retry):
            schema_sql = dialect.create_schema_sql(address.schema)
            if schema_sql:
                add(name, f"schema {address.schema}", schema_sql)
        add(
            name,
            f"forwarding queue {tables.queue_canonical}",
            dialect.sql("create_queue", queue=tables.queue),
        )
        add(
            name,
            f"error queue {dialect.grammar.render(tables.error_queue)}",
            dialect.sql("create_queue", queue=tables.error_queue),
        )
        add(name, "retry storage", dialect.sql("create_retry_table", retry=tables.retry))
        add(name, "counters", dialect.sql("create_counters_table", counters=tables.counters))
        add(
            name,
            "event types seen",
            dialect.sql("create_event_types_table", event_types=tables.event_types),
        )
    # A ledger is needed wherever some forwarder delivers across databases.
    forwarding_databases = {forwarder.database for forwarder in config.forwarders}
    for route in config.routes:
        if not forwarding_databases - {route.database}:
            continue
        target = config.databases[route.database]
        dialect = dialect_for(target.dialect)
        ledger = dialect.bridge_table(LEDGER_TABLE, target.schema)
        schema_sql = dialect.create_schema_sql(ledger.schema)
        if schema_sql:
            add(route.database, f"schema {ledger.schema}", schema_sql)
        add(route.database, "dedup ledger", dialect.sql("create_ledger_table", ledger=ledger))
    return steps


def render_plan(steps: list[InstallStep]) -> str:
    """The DDL as a script per database, for `install --print-sql`."""
    lines: list[str] = []
    current = None
    for step in steps:
        if step.database != current:
            current = step.database
            lines.append(f"-- ===== database: {current} =====")
        lines.append(f"-- {step.description}")
        lines.extend(_dedent(statement) + ";" for statement in step.statements)
        lines.append("")
    return "\n".join(lines)


def run_install(config: BridgeConfig) -> list[InstallStep]:
    """Create every table in the plan. Raises DatabaseError naming the database."""
    steps = install_plan(config)
    by_database: dict[str, list[InstallStep]] = {}
    for step in steps:
        by_database.setdefault(step.database, []).append(step)
    for database, database_steps in by_database.items():
        _install_database(config, database, database_steps)
    return steps


def _install_database(config: BridgeConfig, database: str, steps: list[InstallStep]) -> None:
    # `IF NOT EXISTS` is not atomic in PostgreSQL: two installers racing can both pass the
    # check and one fails on the catalog's unique index. Running again then finds the table.
    for attempt in range(3):
        connection = connect(config.databases[database], create=True)
        try:
            connection.begin()
            for step in steps:
                for statement in step.statements:
                    connection.execute(statement)
            connection.commit()
            return
        except (DuplicateKey, DatabaseError) as error:
            racing = isinstance(error, DuplicateKey) or "already exists" in error.detail
            if not racing or attempt == 2:
                raise
        finally:
            connection.rollback()
            connection.close()


def _dedent(statement: str) -> str:
    lines = statement.strip("\n").splitlines()
    indents = [len(line) - len(line.lstrip()) for line in lines[1:] if line.strip()]
    cut = min(indents) - 4 if indents and min(indents) >= 4 else 0
    return "\n".join([lines[0].strip()] + [line[cut:] for line in lines[1:]])
