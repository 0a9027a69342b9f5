"""`sfbridge retries list`: one line per message waiting in retry storage."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from bridge.commands.configuration import load
from bridge.commands.failed_messages import one_line
from bridge.commands.retries import FoundWaiting, read_retry_stores
from bridge.commands.selection import (
    add_json_argument,
    add_limit_argument,
    add_selection_arguments,
    finish,
    limit_found,
    listing_lines,
    print_json,
    report_hidden,
    say,
    selection_from,
)
from bridge.connections import Connections
from bridge.exceptions import DatabaseError, ExitCode
from bridge.secrets import for_terminal
from bridge.storage.retries import WaitingMessage

# LAST ERROR, the last column, in the text listing: long enough for the bridge's own errors
# with their advice (a line may wrap on a narrow terminal); `--json` has the full text.
ERROR_WIDTH = 400
_HEADINGS = (
    "MESSAGE ID",
    "FORWARDER",
    "DESTINATION",
    "ATTEMPTS",
    "NEXT ATTEMPT (UTC)",
    "LAST ERROR",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_selection_arguments(parser, failed=False)
    add_limit_argument(parser)
    add_json_argument(parser)


def run(args: argparse.Namespace) -> int:
    config = load(args)
    selection = selection_from(config, args, datetime.now(UTC))
    connections = Connections(config.databases)
    problems: list[DatabaseError] = []
    try:
        found = read_retry_stores(config, selection, connections, problems)
    finally:
        connections.close()
    found, hidden = limit_found(found, args.limit)
    if args.json:
        print_json([_as_json(each, m) for each in found for m in each.messages])
    else:
        for each in found:
            rows = [_row(message) for message in each.messages]
            for line in listing_lines(each, _HEADINGS, rows, absent="nothing has waited there"):
                say(line)
    report_hidden(hidden, as_json=args.json)
    return finish("retries list", problems, ExitCode.OK)


def _row(message: WaitingMessage) -> tuple[str, ...]:
    return (
        for_terminal(message.message_id),
        message.forwarder,
        for_terminal(message.destination),
        str(message.attempts),
        message.next_attempt_at.strftime("%Y-%m-%d %H:%M:%S") if message.next_attempt_at else "-",
        for_terminal(one_line(message.last_error, ERROR_WIDTH)),
    )


def _iso(moment: datetime | None) -> str | None:
    return moment.replace(tzinfo=UTC).isoformat(timespec="seconds") if moment else None


def _as_json(found: FoundWaiting, message: WaitingMessage) -> dict[str, Any]:
    return {
        "message_id": message.message_id,
        "id": message.row_id,
        "database": found.place.database,
        "forwarder": message.forwarder,
        "destination": message.destination,
        "destination_database": message.destination_database,
        "attempts": message.attempts,
        "first_failure_at": _iso(message.first_failure_at),
        "next_attempt_at": _iso(message.next_attempt_at),
        "last_error": for_terminal(message.last_error),
    }
