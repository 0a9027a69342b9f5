"""`sfbridge errors list`: one line per failed message, by error queue."""

from __future__ import annotations

import argparse
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from bridge.commands.configuration import load
from bridge.commands.errors import FoundFailed, read_error_queues, read_first_messages
from bridge.commands.failed_messages import FailedMessage, one_line
from bridge.commands.selection import (
    Selection,
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
from bridge.secrets import inert, mask_secrets

# The exception message, cut to this many characters.
EXCEPTION_WIDTH = 80
_HEADINGS = (
    "ID",
    "MESSAGE ID",
    "FAILED AT (UTC)",
    "REASON",
    "DESTINATION",
    "ATTEMPTS",
    "FORWARDER",
    "EXCEPTION",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_selection_arguments(parser, failed=True)
    add_limit_argument(parser)
    add_json_argument(parser)


def run(args: argparse.Namespace) -> int:
    config = load(args)
    selection = selection_from(config, args, datetime.now(UTC))
    connections = Connections(config.databases)
    problems: list[DatabaseError] = []
    try:
        if args.limit and selection == Selection(given=selection.given):
            # Every message, the first few shown: counted and paged in the database.
            found, hidden = read_first_messages(config, connections, problems, args.limit)
        else:
            found, hidden = limit_found(
                read_error_queues(config, selection, connections, problems), args.limit
            )
    finally:
        connections.close()
    if args.json:
        print_json([_as_json(each, m) for each in found for m in each.messages])
    else:
        for each in found:
            _print_queue(each)
    report_hidden(hidden, as_json=args.json)
    return finish("errors list", problems, ExitCode.OK)


def _print_queue(found: FoundFailed) -> None:
    rows = [tuple(inert(cell) for cell in _row(found, message)) for message in found.messages]
    for line in listing_lines(found, _HEADINGS, rows, absent="nothing has failed there"):
        say(line)
    reasons = Counter(m.not_replayable for m in found.messages if m.not_replayable)
    for why, count in reasons.items():
        say(f"  not replayed by 'errors replay': {count} message(s) marked '-': {why}")


def _row(found: FoundFailed, message: FailedMessage) -> tuple[str, ...]:
    failed_at = message.failed_at
    return (
        message.row_id,
        message.message_id or "-",
        failed_at.strftime("%Y-%m-%d %H:%M:%S") if failed_at else "-",
        message.reason or "-",
        found.place.destination_of(message) or "-",
        "-" if message.attempts is None else str(message.attempts),
        message.forwarder or "-",
        one_line(_masked(message.exception_message), EXCEPTION_WIDTH),
    )


def _as_json(found: FoundFailed, message: FailedMessage) -> dict[str, Any]:
    failed_at = message.failed_at
    return {
        "id": message.row_id,
        "database": found.place.database,
        "error_queue": found.place.name,
        "forwarder": message.forwarder,
        "failed_queue": message.failed_queue,
        "replayable": message.replayable,
        "not_replayable_because": message.not_replayable,
        "time_of_failure": failed_at.isoformat() if failed_at else None,
        "reason": message.reason,
        "destination": found.place.destination_of(message),
        "attempts": message.attempts,
        "exception_type": message.header("NServiceBus.ExceptionInfo.ExceptionType"),
        "exception_message": _masked(message.exception_message),
        "message_id": message.message_id,
    }


def _masked(text: str | None) -> str | None:
    return None if text is None else mask_secrets(text)
