"""`sfbridge pause`: write a pause row every daemon on the queue obeys (`resume` removes it).

Exact (`bridge.storage.pauses`): a batch claiming after the pause is committed sees it in its
own transaction. Batches that claimed before finish as they are; where the database can say
which transactions write the queue or retry storage (PostgreSQL), `pause` waits for those that
were in flight when the pause was committed, up to `--wait`, and says how many there were. On
SQLite the pause's own write waited for the one writer. So once `pause` returns, nothing of the
forwarder (or for that destination) is delivered until `resume`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

from bridge.commands.audit import record_command
from bridge.commands.configuration import load
from bridge.commands.selection import forwarder_named, nearest
from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.connections import connect
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import Connection
from bridge.exceptions import BridgeTableMissing, DatabaseError, ExitCode, RequestError
from bridge.messages import utcnow
from bridge.storage.daemons import ServedForwarder, liveness, read_daemons
from bridge.storage.ledger import RUNTIME_DDL_OFF_ADVICE
from bridge.storage.pauses import clear_pause, in_flight_writers, set_pause
from bridge.storage.tables import (
    ForwarderTables,
    create_tables,
    forwarder_table_steps,
    forwarder_tables,
)

# How long `pause` waits for the batches in flight by default: a batch ends within its
# databases' timeouts, and a person is waiting.
DEFAULT_WAIT_SECONDS = 60.0

# How often `pause` looks again whether the batches in flight ended.
WAIT_STEP_SECONDS = 0.05


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument("--reason", help="shown by status, e.g. 'receiver upgrade'")
    parser.add_argument(
        "--wait",
        metavar="SECONDS",
        type=float,
        default=DEFAULT_WAIT_SECONDS,
        help="how long to wait for the batches in flight to finish (default %(default)g)",
    )


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """What `pause` and `resume` both name: the forwarder, and maybe one destination."""
    parser.add_argument("forwarder", help="the forwarder's name")
    parser.add_argument(
        "--destination",
        metavar="DB",
        help="only its deliveries to this database (a name under 'databases')",
    )


def run(args: argparse.Namespace) -> int:
    """Exit 0 once paused with no batch of the forwarder left in flight (or none the database
    can tell of); 1 when batches were still in flight after `--wait` (the pause stays)."""
    config = load(args)
    print(change_pause(config, args.forwarder, args.destination, pause=True, reason=args.reason))
    in_flight = wait_for_batches(config, args.forwarder, args.wait)
    print(in_flight.describe(args.wait))
    return ExitCode.FAILED if in_flight.left else ExitCode.OK


@dataclass(frozen=True)
class InFlight:
    """The batches in flight when the pause was committed: `found` of them (None: the
    database cannot tell), `left` still running when the wait ended; `single_writer`: the
    database serialises writers, so the pause's own write waited for them."""

    found: int | None
    left: int = 0
    single_writer: bool = False
    daemons: int | None = None  # running daemons serving the forwarder, when it cannot tell

    def describe(self, wait: float) -> str:
        if self.single_writer:
            return "no batch in flight: the pause's write waited for the database's one writer"
        if self.found is None:
            serving = "" if self.daemons is None else f" of the {self.daemons} running daemon(s)"
            return (
                "batches in flight: unknown (this database cannot tell); at most one per "
                f"worker{serving} serving it, each finishing within its databases' timeouts"
            )
        if self.left:
            return (
                f"{self.left} of {self.found} transaction(s) writing its queue or retry storage "
                f"still in flight after {wait:g} s: they finish on their own; wait for them "
                "before the maintenance ('sfbridge status' shows the queue)"
            )
        return (
            f"{self.found} transaction(s) writing its queue or retry storage were in flight "
            "(its batches; senders' and other forwarders' writes count too): all finished"
        )


def wait_for_batches(config: BridgeConfig, forwarder_name: str, wait: float) -> InFlight:
    """Wait up to `wait` s for the transactions writing the forwarder's queue or retry storage
    when the pause was committed to end (batches that claimed before it). Raises the
    DatabaseError family."""
    forwarder = forwarder_named(config, forwarder_name)
    dialect = dialect_for(config.databases[forwarder.database].dialect)
    if dialect.single_writer:
        return InFlight(found=0, single_writer=True)
    tables = forwarder_tables(config, forwarder)
    connection = connect(config.databases[forwarder.database])
    try:
        found = in_flight_writers(connection, dialect, tables)
        if found is None:
            return InFlight(found=None, daemons=_serving_daemons(config, forwarder, connection))
        deadline = time.monotonic() + wait
        left = set(found)
        while left and time.monotonic() < deadline:
            time.sleep(WAIT_STEP_SECONDS)
            left &= in_flight_writers(connection, dialect, tables) or set()
        return InFlight(found=len(found), left=len(left))
    finally:
        connection.close()


def _serving_daemons(
    config: BridgeConfig, forwarder: ForwarderConfig, connection: Connection
) -> int | None:
    """How many running daemons serve `forwarder`, as its daemons table says; None when it
    cannot be read."""
    dialect = dialect_for(config.databases[forwarder.database].dialect)
    tables = forwarder_tables(config, forwarder)
    served = ServedForwarder(forwarder.name, tables.queue_canonical)
    try:
        connection.begin()
        try:
            records = read_daemons(connection, dialect, tables.daemons)
        finally:
            connection.rollback()
    except DatabaseError:
        return None
    now = utcnow()
    return sum(1 for r in records if liveness(r, now) == "running" and r.serves(served))


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
    if pause:
        held = (
            "its messages for that database wait in retry storage, spending no attempts"
            if database
            else "it claims nothing from its queue or retry storage"
        )
        return (
            f"paused {what}: {held}; every batch claiming from now on sees it. Undo with "
            f"'sfbridge resume {forwarder_name}"
            + (f" --destination {database}'" if database else "'")
        )
    if not changed:
        return f"{what} was not paused; nothing to do"
    within = f"every daemon on its queue takes it up within {forwarder.slow_poll_interval:g} s"
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
