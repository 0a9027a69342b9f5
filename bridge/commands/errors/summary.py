"""`sfbridge errors summary`: the failed messages in groups, largest first, as ServicePulse's
first screen shows them: by failure reason, destination, exception type or message type, each
with its count and its first and last failure. A group's name (`reason:unroutable`) is what
`--group` takes in `errors list`, `replay`, `archive` and `purge`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from bridge.commands.configuration import load
from bridge.commands.error_groups import QueueGroups, count_groups
from bridge.commands.error_queues import ErrorQueue, error_queues
from bridge.commands.errors import read_error_queues
from bridge.commands.failed_messages import FailedMessage
from bridge.commands.failure_groups import GROUP_BY, Counted, Group, summarize
from bridge.commands.selection import (
    Selection,
    add_json_argument,
    add_limit_argument,
    add_selection_arguments,
    columns,
    finish,
    print_json,
    read_places,
    report_hidden,
    say,
    selection_from,
)
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.exceptions import DatabaseError, ExitCode

Entry = tuple[FailedMessage | Counted, Callable[[FailedMessage], str | None]]

_HEADINGS = ("GROUP", "COUNT", "REPLAYABLE", "FIRST FAILURE (UTC)", "LAST FAILURE (UTC)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--by",
        choices=GROUP_BY,
        default="reason",
        help="group by the bridge's failure reason (default), the destination, the exception "
        "type (NServiceBus.ExceptionInfo.ExceptionType) or the message type "
        "(NServiceBus.EnclosedMessageTypes)",
    )
    add_selection_arguments(parser, failed=True)
    add_limit_argument(parser, "groups")
    add_json_argument(parser)


def run(args: argparse.Namespace) -> int:
    config = load(args)
    selection = selection_from(config, args, datetime.now(UTC))
    connections = Connections(config.databases)
    problems: list[DatabaseError] = []
    try:
        if _in_the_database(selection):
            places, entries = _count_in_databases(config, selection, connections, problems, args.by)
        else:
            found = read_error_queues(config, selection, connections, problems)
            places = [each.where for each in found]
            entries = [(m, each.place.destination_of) for each in found for m in each.messages]
    finally:
        connections.close()
    groups = summarize(args.by, entries)
    shown = groups[: args.limit] if args.limit else groups
    if args.json:
        print_json([_as_json(group) for group in shown])
    else:
        total = sum(group.count for group in groups)
        where = ", ".join(places) or "no error queue"
        say(f"{total} failed message(s) in {len(groups)} group(s) by {args.by}: {where}")
        if shown:
            rows = [_HEADINGS, *(_row(group) for group in shown)]
            for line in columns(rows):
                say("  " + line)
    report_hidden(len(groups) - len(shown), as_json=args.json, what="group(s)")
    return finish("errors summary", problems, ExitCode.OK)


def _in_the_database(selection: Selection) -> bool:
    """Whether the database can group what `selection` chooses: every message, or a
    forwarder's (which the grouping's FailedQ tells); other filters read each message."""
    return selection == Selection(forwarder=selection.forwarder, given=selection.given)


def _count_in_databases(
    config: BridgeConfig,
    selection: Selection,
    connections: Connections,
    problems: list[DatabaseError],
    by: str,
) -> tuple[list[str], list[Entry]]:
    """Every error queue `selection` may reach, grouped in its database (`count_groups`):
    the queues, as a person reads them, and what was counted in them."""
    places: list[str] = []
    entries: list[Entry] = []
    queues = error_queues(config, selection.forwarder)

    def count(connection: Connection, dialect: Dialect, queue: ErrorQueue) -> QueueGroups | None:
        return count_groups(connection, dialect, queue, by)

    for queue, _, grouped in read_places(config, queues, connections, problems, count):
        places.append(queue.describe())
        if grouped is not None:
            entries += _chosen(queue, selection, grouped.counted + grouped.unreadable)
    return places, entries


def _chosen(
    queue: ErrorQueue, selection: Selection, messages: list[Counted | FailedMessage]
) -> list[Entry]:
    chosen: list[Entry] = []
    for each in messages:
        message = each.message if isinstance(each, Counted) else each
        if selection.forwarder is None or message.forwarder == selection.forwarder:
            chosen.append((each, queue.destination_of))
    return chosen


def _time(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def _row(group: Group) -> tuple[str, ...]:
    return (
        group.name,
        str(group.count),
        str(group.replayable),
        _time(group.first_failure),
        _time(group.last_failure),
    )


def _as_json(group: Group) -> dict[str, Any]:
    return {
        "group": group.name,
        "by": group.by,
        "value": group.value,
        "count": group.count,
        "replayable": group.replayable,
        "first_failure": group.first_failure.isoformat() if group.first_failure else None,
        "last_failure": group.last_failure.isoformat() if group.last_failure else None,
    }
