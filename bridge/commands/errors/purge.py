"""`sfbridge errors purge`: delete failed messages, asking first."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from bridge.commands.audit import open_command
from bridge.commands.configuration import load
from bridge.commands.error_queues import purge_messages
from bridge.commands.errors import FoundFailed, read_error_queues
from bridge.commands.selection import (
    add_selection_arguments,
    confirmed,
    finish,
    refused_without_terminal,
    say,
    selection_from,
)
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.exceptions import DatabaseError, ExitCode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_selection_arguments(parser, failed=True)
    parser.add_argument("--yes", action="store_true", help="do not ask (needed without a terminal)")


def run(args: argparse.Namespace) -> int:
    config = load(args)
    selection = selection_from(config, args, datetime.now(UTC))
    connections = Connections(config.databases)
    problems: list[DatabaseError] = []
    try:
        found = read_error_queues(config, selection, connections, problems)
        code = _purge(config, found, connections, problems, yes=args.yes, given=selection.given)
    finally:
        connections.close()
    return finish("errors purge", problems, code)


def _purge(
    config: BridgeConfig,
    found: list[FoundFailed],
    connections: Connections,
    problems: list[DatabaseError],
    *,
    yes: bool,
    given: str,
) -> int:
    chosen = [each for each in found if each.messages]
    if not chosen:
        say("no failed messages match; nothing to delete")
        return ExitCode.OK
    count = sum(len(each.messages) for each in chosen)
    if refused_without_terminal(
        "errors purge", f"delete {count} message(s)", yes=yes, dry_run=False
    ):
        return ExitCode.USAGE
    for each in chosen:
        name = f"{each.place.name} (database '{each.place.database}')"
        foreign = sum(1 for m in each.messages if not m.replayable)
        if foreign:
            say(
                f"error queue {name}: {foreign} of these {len(each.messages)} message(s) did not "
                "fail in a queue a forwarder drains (an endpoint's failed messages, or poison)"
            )
        if not yes and not confirmed(
            f"delete {len(each.messages)} message(s) from error queue {name}? [y/N] "
        ):
            say(f"kept the messages in error queue {name}")
            continue
        database = each.place.database
        try:
            connection = connections.get(database)
            audit = open_command(
                config, connection, database, "errors purge", f"{each.place.name} {given}"
            )
            try:
                deleted = purge_messages(
                    connection, each.dialect, each.place, each.messages, in_batch=audit.add
                )
            finally:
                audit.close()
        except DatabaseError as error:
            connections.discard(database)
            problems.append(error)
            continue
        say(f"deleted {deleted} message(s) from error queue {name}")
    return ExitCode.OK
