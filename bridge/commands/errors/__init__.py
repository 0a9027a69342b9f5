"""`sfbridge errors list / show / replay / purge`: ServicePulse's retry, from the command line.

Each verb is a module here. They read every forwarder's error queue (each table once), select
messages with the options of `bridge.commands.selection`, and print what they found or did.
Only messages that failed in a queue some configured forwarder drains are replayed; the others
(an endpoint's failed messages in a shared error queue, poison rows) are listed, and replay
says per message why it leaves them.
"""

from __future__ import annotations

from bridge.commands.error_queues import ErrorQueue, error_queues, read_failed_messages
from bridge.commands.failed_messages import FailedMessage, describe
from bridge.commands.selection import Found, Selection, missing_ids, read_each, read_places
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.exceptions import DatabaseError, RequestError, TableNotFound

FoundFailed = Found[ErrorQueue, FailedMessage]


def read_error_queues(
    config: BridgeConfig,
    selection: Selection,
    connections: Connections,
    problems: list[DatabaseError],
) -> list[FoundFailed]:
    """Every error queue `selection` may reach, with the messages it selects. Raises
    RequestError when an `--id` names no message there: then nothing is changed."""

    def selects(queue: ErrorQueue, dialect: Dialect, message: FailedMessage) -> bool:
        if not selection.selects(message, dialect.grammar, queue.proxy_names(message)):
            return False
        return selection.group is None or selection.in_group(message, queue.destination_of(message))

    found = read_each(
        config,
        error_queues(config, selection.forwarder),
        connections,
        problems,
        read_failed_messages,
        lambda queue, dialect: queue.describe(),
        selects,
    )
    missing = missing_ids(sorted(selection.ids), [m for each in found for m in each.messages])
    if missing:
        where = ", ".join(each.where for each in found) or "no error queue"
        unread = " (and some error queues could not be read)" if problems else ""
        raise RequestError(
            f"no message with id {', '.join(missing)} matching the other filters in {where}"
            f"{unread}; 'sfbridge errors list' shows the ids; nothing was changed"
        )
    return found


def read_first_messages(
    config: BridgeConfig, connections: Connections, problems: list[DatabaseError], limit: int
) -> tuple[list[FoundFailed], int]:
    """Every error queue with its first messages, `limit` in all (the first queues first),
    each queue counted and paged in its database rather than read whole; and how many were
    left out. For a selection of every message (`Selection()`)."""
    found: list[FoundFailed] = []
    hidden = 0

    def first_rows(
        connection: Connection, dialect: Dialect, queue: ErrorQueue
    ) -> tuple[int, list[FailedMessage]] | None:
        # What is left of `limit` once the queues before this one are read.
        left = limit - sum(len(each.messages) for each in found)
        return _first_rows(connection, dialect, queue, left)

    places = read_places(config, error_queues(config), connections, problems, first_rows)
    for queue, dialect, read in places:
        total, messages = read if read is not None else (0, [])
        hidden += total - len(messages)
        found.append(
            Found(queue, dialect, queue.describe(), messages, total, read is not None, total)
        )
    return found, hidden


def _first_rows(
    connection: Connection, dialect: Dialect, queue: ErrorQueue, limit: int
) -> tuple[int, list[FailedMessage]] | None:
    """(how many rows `queue` holds, its first `limit` described), in one read transaction;
    None when the table does not exist."""
    try:
        connection.begin_read()
        [counted] = connection.query_named(dialect.sql("error_queue_count", queue=queue.address))
        rows = []
        if limit > 0:
            rows = connection.query_named(
                dialect.sql("error_queue_page", queue=queue.address), (0, limit)
            )
    except TableNotFound:
        return None
    finally:
        connection.rollback()
    messages = [describe(row["id"], int(row["seq"]), row["headers"], queue.owners) for row in rows]
    return int(counted["messages"]), messages
