"""`sfbridge install`: create every table the bridge owns, or print their DDL for a DBA.

The daemon creates a missing one by itself while it works (see `bridge.storage.tables`); `install`
creates them all up front, and is the only way when `install.at_runtime` is false.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from bridge.commands.configuration import load
from bridge.commands.least_privilege import render_grants
from bridge.config.model import BridgeConfig
from bridge.connections import connect, require_writable
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import Connection
from bridge.exceptions import (
    DatabaseError,
    DottedQueueName,
    ExitCode,
    PermissionDenied,
    TableNotFound,
)
from bridge.storage.daemons import upgrade_daemons_table
from bridge.storage.dotted_names import dotted_names
from bridge.storage.grants import lacking_right
from bridge.storage.ledger import ledger_databases, ledger_steps
from bridge.storage.tables import (
    TableStep,
    create_tables,
    forwarder_table_steps,
    forwarder_tables,
    split_statements,
    upgrade_retry_table,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--print-sql", action="store_true", help="print the DDL per database instead of running it"
    )
    parser.add_argument(
        "--print-grants",
        action="store_true",
        help="print, per database, the statements that create a dedicated login with the least "
        "the bridge needs (the DBA creates the tables with --print-sql)",
    )
    parser.add_argument(
        "--login", help="with --print-grants: the login's name (default: the connection's Uid)"
    )
    parser.add_argument(
        "--login-creates-tables",
        action="store_true",
        help="with --print-grants: let the login create (and own) the bridge's tables instead",
    )


def run(args: argparse.Namespace) -> int:
    """Create the tables, or print their DDL or grants. Raises UnsetVariables before touching
    any database when one it creates tables in names a variable that is not set."""
    config = load(args)
    if args.print_sql:
        print(render_plan(config, install_plan(config)))
        return ExitCode.OK
    if args.print_grants:
        print(render_grants(config, args.login, login_creates_tables=args.login_creates_tables))
        return ExitCode.OK
    config.require_environment("install", {step.database for step in install_plan(config)})
    refuse_dotted_names(config)
    for step in run_install(config):
        print(f"ok  database '{step.database}': {step.description}")
    return ExitCode.OK


def refuse_dotted_names(config: BridgeConfig) -> None:
    """Raise DottedQueueName, before anything is created, when a forwarder's queue reads as a
    missing table in another schema while the table of its whole name exists: installing would
    create that table and its schema, and the daemon would forward from an empty queue. A
    database that cannot be reached is left to `run_install` to report."""
    found = []
    for database in sorted({forwarder.database for forwarder in config.forwarders}):
        try:
            connection = connect(config.databases[database])
        except DatabaseError:
            continue
        try:
            found.extend(dotted_names(config, database, connection))
        except DatabaseError:
            continue
        finally:
            connection.close()
    if found:
        raise DottedQueueName(
            "not creating "
            + ", ".join(trap.read_as for trap in found)
            + ":\n  "
            + "\n  ".join(str(trap) for trap in found),
            advice="nothing was created; fix the config as shown, then run 'sfbridge install'",
        )


def install_plan(config: BridgeConfig) -> list[TableStep]:
    """Every table to create, per database, in order, each once. Idempotent statements only."""
    steps: list[TableStep] = []
    seen: set[tuple[str, tuple[str, ...]]] = set()

    def add(new_steps: Sequence[TableStep]) -> None:
        for step in new_steps:
            if (step.database, step.statements) not in seen:
                seen.add((step.database, step.statements))
                steps.append(step)

    for forwarder in config.forwarders:
        add(forwarder_table_steps(config, forwarder))
    for database in ledger_databases(config):
        add(ledger_steps(config, database))
    return steps


def render_plan(config: BridgeConfig, steps: list[TableStep]) -> str:
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
    upgrades = _retry_upgrades(config)
    if upgrades:
        lines.append("-- Only for retry storage created by sfbridge before destination_database:")
        lines.extend(f"-- {statement}" for statement in upgrades)
        lines.append("")
    upgrades = _daemons_upgrades(config)
    if upgrades:
        lines.append(
            "-- Only for a daemons table created by sfbridge before config_fingerprint and "
            "forwarders:"
        )
        lines.extend(f"-- {statement}" for statement in upgrades)
        lines.append("")
    return "\n".join(lines)


def run_install(config: BridgeConfig) -> list[TableStep]:
    """Create every table in the plan. Raises DatabaseError naming the database
    (DatabaseNotWritable where the connection reached a standby)."""
    steps = install_plan(config)
    by_database: dict[str, list[TableStep]] = {}
    for step in steps:
        by_database.setdefault(step.database, []).append(step)
    for database, database_steps in by_database.items():
        connection = connect(config.databases[database], create=True)
        try:
            dialect = dialect_for(config.databases[database].dialect)
            require_writable(database, connection, dialect)
            try:
                create_tables(connection, dialect, database_steps, only_missing=False)
            except PermissionDenied as error:
                raise _with_grant(connection, dialect, database_steps, error) from None
            for forwarder in config.forwarders:
                if forwarder.database == database:
                    tables = forwarder_tables(config, forwarder)
                    try:
                        upgrade_retry_table(connection, dialect, tables.retry, allowed=True)
                    except TableNotFound:
                        pass
                    try:
                        upgrade_daemons_table(connection, dialect, tables.daemons, allowed=True)
                    except TableNotFound:
                        pass
        finally:
            connection.rollback()
            connection.close()
    return steps


def _with_grant(
    connection: Connection, dialect: Dialect, steps: list[TableStep], error: PermissionDenied
) -> PermissionDenied:
    """`error` with the exact GRANT the login lacks (for the first schema that needs one)."""
    lacking = lacking_right(
        connection, dialect, [step.table.schema for step in steps if step.table]
    )
    if lacking is None:
        return error
    return PermissionDenied(error.database, error.detail, advice=lacking.advice())


def _retry_upgrades(config: BridgeConfig) -> list[str]:
    statements: list[str] = []
    for forwarder in config.forwarders:
        dialect = dialect_for(config.databases[forwarder.database].dialect)
        retry = forwarder_tables(config, forwarder).retry
        statement = " ".join(dialect.sql("retry_add_destination_database", retry=retry).split())
        if statement + ";" not in statements:
            statements.append(statement + ";")
    return statements


def _daemons_upgrades(config: BridgeConfig) -> list[str]:
    statements: list[str] = []
    for forwarder in config.forwarders:
        dialect = dialect_for(config.databases[forwarder.database].dialect)
        daemons = forwarder_tables(config, forwarder).daemons
        for part in split_statements(dialect.sql("daemons_add_identity", daemons=daemons)):
            statement = " ".join(part.split()) + ";"
            if statement not in statements:
                statements.append(statement)
    return statements


def _dedent(statement: str) -> str:
    lines = statement.strip("\n").splitlines()
    indents = [len(line) - len(line.lstrip()) for line in lines[1:] if line.strip()]
    cut = min(indents) - 4 if indents and min(indents) >= 4 else 0
    return "\n".join([lines[0].strip()] + [line[cut:] for line in lines[1:]])
