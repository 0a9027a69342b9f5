"""`sfbridge errors show ID`: one failed message's headers and a preview of its body."""

from __future__ import annotations

import argparse
import base64
from typing import Any

from bridge.commands.configuration import load
from bridge.commands.error_queues import (
    ErrorQueue,
    error_queues,
    read_failed_messages,
    read_full_message,
)
from bridge.commands.failed_messages import FailedMessage, body_preview, row_id_text
from bridge.commands.selection import (
    add_json_argument,
    add_limit_argument,
    finish,
    print_json,
    report_hidden,
    say,
)
from bridge.connections import Connections
from bridge.dialects import dialect_for
from bridge.exceptions import DatabaseError, ExitCode, RequestError
from bridge.secrets import mask_secrets


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "id", help="the message's Id or its NServiceBus.MessageId, as 'errors list' shows them"
    )
    add_limit_argument(parser, "messages (the copies of an event share a MessageId)")
    add_json_argument(parser)


def run(args: argparse.Namespace) -> int:
    """Print every message whose row Id or `NServiceBus.MessageId` is `args.id` (a MessageId
    may name several: the copies of one published event, or a message that failed twice).
    Raises RequestError when there is none."""
    config = load(args)
    row_id = row_id_text(args.id)
    connections = Connections(config.databases)
    problems: list[DatabaseError] = []
    searched = []
    shown = 0
    records: list[dict[str, Any]] = []
    hidden = 0
    try:
        for queue in error_queues(config):
            searched.append(queue.describe())
            dialect = dialect_for(config.databases[queue.database].dialect)
            try:
                connection = connections.get(queue.database)
                messages = read_failed_messages(connection, dialect, queue) or []
                for message in [m for m in messages if row_id in m.known_as]:
                    if args.limit and shown >= args.limit:
                        hidden += 1
                        continue
                    full = read_full_message(connection, dialect, queue, message.seq)
                    if full is None:
                        continue
                    shown += 1
                    if args.json:
                        records.append(_as_json(queue, full.message, full.headers_text, full.body))
                    else:
                        _print_message(queue, full.message, full.headers_text, full.body)
            except DatabaseError as error:
                connections.discard(queue.database)
                problems.append(error)
    finally:
        connections.close()
    if shown == 0:
        unread = " (and some error queues could not be read)" if problems else ""
        raise RequestError(
            f"no message with id {args.id} in {', '.join(searched)}{unread} (by its Id or its "
            "NServiceBus.MessageId); 'sfbridge errors list' shows both"
        )
    if args.json:
        print_json(records)
    report_hidden(hidden, as_json=args.json)
    return finish("errors show", problems, ExitCode.OK)


def _as_json(
    queue: ErrorQueue, message: FailedMessage, headers_text: str | None, body: bytes | None
) -> dict[str, Any]:
    failed_at = message.failed_at
    kind, lines = body_preview(body)
    return {
        "id": message.row_id,
        "message_id": message.message_id,
        "database": queue.database,
        "error_queue": queue.name,
        "forwarder": message.forwarder,
        "failed_queue": message.failed_queue,
        "replayable": message.replayable,
        "not_replayable_because": message.not_replayable,
        "reason": message.reason,
        "time_of_failure": failed_at.isoformat() if failed_at else None,
        # Secrets masked, as in the text form; an unreadable Headers column as its text.
        "headers": None
        if message.headers is None
        else {k: None if v is None else mask_secrets(v) for k, v in message.headers.items()},
        "headers_text": mask_secrets(headers_text or "") if message.headers is None else None,
        "body_kind": kind,
        "body_text": "\n".join(lines) if kind.startswith("text") else None,
        "body_base64": None if body is None else base64.b64encode(body).decode("ascii"),
    }


def _print_message(
    queue: ErrorQueue, message: FailedMessage, headers_text: str | None, body: bytes | None
) -> None:
    say(f"message {message.row_id} in {queue.describe()}")
    if message.forwarder is not None:
        say(
            f"  failed in {message.failed_queue} (forwarder '{message.forwarder}'); "
            f"'sfbridge errors replay --id {message.row_id}' sends it back there"
        )
    else:
        say(f"  not replayed by the bridge: {message.not_replayable}")
    failed_at = message.failed_at
    say(f"  message id: {message.message_id or '-'}")
    say(f"  reason: {message.reason or '-'}")
    say(f"  failed at: {failed_at.strftime('%Y-%m-%d %H:%M:%S') + ' UTC' if failed_at else '-'}")
    if message.headers is None:
        say(f"headers (cannot be read: {message.poison}):")
        say(f"  {mask_secrets(headers_text or '')}")
    else:
        say("headers:")
        for name, value in message.headers.items():
            say(f"  {name}: {'null' if value is None else mask_secrets(value)}")
    kind, lines = body_preview(body)
    say(f"body ({kind}):" if lines else f"body: {kind}")
    for line in lines:
        say(f"  {line}")
