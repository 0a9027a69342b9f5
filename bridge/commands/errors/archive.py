"""`sfbridge errors archive`: move failed messages out of the error queue into the error
archive, restorable with `errors restore` for `error_archive.retention` (default 30 days),
instead of deleting them. Asks first, as `purge` does."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from bridge.commands.audit import open_command
from bridge.commands.configuration import load
from bridge.commands.error_queues import archive_messages
from bridge.commands.errors import FoundFailed, read_error_queues
from bridge.commands.selection import (
    add_selection_arguments,
    confirmed,
    finish,
    refused_without_terminal,
    say,
    selection_from,
)
from bridge.config.durations import format_duration
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.exceptions import DatabaseError, ExitCode
from bridge.storage.archive import archive_address


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_selection_arguments(parser, failed=True)
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would move; move nothing"
    )
    parser.add_argument("--yes", action="store_true", help="do not ask (needed without a terminal)")


def run(args: argparse.Namespace) -> int:
    config = load(args)
    selection = selection_from(config, args, datetime.now(UTC))
    connections = Connections(config.databases)
    problems: list[DatabaseError] = []
    try:
        found = read_error_queues(config, selection, connections, problems)
        code = _archive(config, found, connections, problems, args, selection.given)
    finally:
        connections.close()
    return finish("errors archive", problems, code)


def _archive(
    config: BridgeConfig,
    found: list[FoundFailed],
    connections: Connections,
    problems: list[DatabaseError],
    args: argparse.Namespace,
    given: str,
) -> int:
    chosen = [each for each in found if each.messages]
    count = sum(len(each.messages) for each in chosen)
    if not chosen:
        say("no failed messages match; nothing to archive")
        return ExitCode.OK
    keep = format_duration(config.error_archive.retention)
    if args.dry_run:
        for each in chosen:
            for message in each.messages:
                say(f"would archive {message.row_id} ({message.reason or '-'}) from {each.where}")
        say(f"dry run: would archive {count} message(s) (kept {keep}); nothing was moved")
        return ExitCode.OK
    if refused_without_terminal(
        "errors archive", f"archive {count} message(s)", yes=args.yes, dry_run=True
    ):
        return ExitCode.USAGE
    for each in chosen:
        name = f"{each.place.name} (database '{each.place.database}')"
        if not args.yes and not confirmed(
            f"archive {len(each.messages)} message(s) from error queue {name}? [y/N] "
        ):
            say(f"kept the messages in error queue {name}")
            continue
        database = each.place.database
        try:
            connection = connections.get(database)
            audit = open_command(
                config, connection, database, "errors archive", f"{each.place.name} {given}"
            )
            try:
                moved = archive_messages(
                    connection,
                    each.dialect,
                    each.place,
                    archive_address(config, database),
                    each.messages,
                    in_batch=audit.add,
                )
            finally:
                audit.close()
        except DatabaseError as error:
            connections.discard(database)
            problems.append(error)
            continue
        gone = len(each.messages) - moved
        also = f"; {gone} were no longer there" if gone else ""
        say(
            f"archived {moved} message(s) from error queue {name}{also}; kept {keep}, "
            "'sfbridge errors restore' puts them back"
        )
    return ExitCode.OK
