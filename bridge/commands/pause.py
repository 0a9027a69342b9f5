"""`sfbridge pause`: write a pause row every daemon on the queue obeys (`resume` removes it)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from bridge.commands.audit import record_command
from bridge.commands.configuration import load
from bridge.commands.selection import forwarder_named, nearest
from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.connections import connect
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import Connection
from bridge.exceptions import BridgeTableMissing, ExitCode, RequestError
from bridge.messages import utcnow
from bridge.storage.ledger import RUNTIME_DDL_OFF_ADVICE
from bridge.storage.pauses import clear_pause, set_pause
from bridge.storage.tables import (
    ForwarderTables,
    create_tables,
    forwarder_table_steps,
    forwarder_tables,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument("--reason", help="shown by status, e.g. 'receiver upgrade'")


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """What `pause` and `resume` both name: the forwarder, and maybe one destination."""
    parser.add_argument("forwarder", help="the forwarder's name")
    parser.add_argument(
        "--destination",
        metavar="DB",
        help="only its deliveries to this database (a name under 'databases')",
    )


def run(args: argparse.Namespace) -> int:
    config = load(args)
    print(change_pause(config, args.forwarder, args.destination, pause=True, reason=args.reason))
    return ExitCode.OK


def change_pause(
    config: BridgeConfig,
    forwarder_name: str,
    database: str | None,
    *,
    pause: bool,
    reason: str | None = None,
) -> str:
    """Pause or resume; returns what happened, for a person. Raises RequestError for an
    unknown name, BridgeTableMissing when the pauses table is missing and may not be created,
    and the DatabaseError family."""
    forwarder = forwarder_named(config, forwarder_name)
    if database is not None and database not in config.databases:
        known = sorted(config.databases)
        raise RequestError(
            f"no database named {database!r} ({nearest(database, known, 'databases')})"
        )
    dialect = dialect_for(config.databases[forwarder.database].dialect)
    tables = forwarder_tables(config, forwarder)
    connection = connect(config.databases[forwarder.database])
    try:
        changed = _with_pauses_table(
            config,
            forwarder,
            connection,
            lambda: _apply(connection, dialect, tables, forwarder_name, database, pause, reason),
        )
    finally:
        connection.close()
    target = f"forwarder '{forwarder_name}'" + (f" destination '{database}'" if database else "")
    if pause and reason:
        target += f" (reason: {reason})"
    record_command(
        config, None, forwarder.database, "pause" if pause else "resume", target, int(changed)
    )
    what = f"forwarder '{forwarder_name}'" + (
        f" deliveries to database '{database}'" if database else ""
    )
    within = f"every daemon on its queue obeys within {forwarder.slow_poll_interval:g} s"
    if pause:
        held = (
            "its messages for that database wait in retry storage, spending no attempts"
            if database
            else "it claims nothing from its queue or retry storage"
        )
        return f"paused {what}: {held}; {within}. Undo with 'sfbridge resume {forwarder_name}" + (
            f" --destination {database}'" if database else "'"
        )
    if not changed:
        return f"{what} was not paused; nothing to do"
    return f"resumed {what}; {within}"


def _apply(
    connection: Connection,
    dialect: Dialect,
    tables: ForwarderTables,
    forwarder: str,
    database: str | None,
    pause: bool,
    reason: str | None,
) -> bool:
    if pause:
        now = utcnow()
        set_pause(connection, dialect, tables, forwarder, database, reason, now)
        return True
    return clear_pause(connection, dialect, tables, forwarder, database)


def _with_pauses_table(
    config: BridgeConfig,
    forwarder: ForwarderConfig,
    connection: Connection,
    action: Callable[[], bool],
) -> bool:
    """`action()`, creating the forwarder's missing tables first when allowed."""
    try:
        return action()
    except BridgeTableMissing as missing:
        if not config.install.at_runtime:
            raise missing.with_advice(RUNTIME_DDL_OFF_ADVICE) from None
        dialect = dialect_for(config.databases[forwarder.database].dialect)
        create_tables(
            connection, dialect, forwarder_table_steps(config, forwarder), only_missing=True
        )
        return action()
