"""`sfbridge errors list / show / replay / purge`: ServicePulse's retry, from the command line.

Each verb is a module here. They read every forwarder's error queue (each table once), select
messages with the options of `bridge.commands.selection`, and print what they found or did.
Only messages that failed in a queue some configured forwarder drains are replayed; the others
(an endpoint's failed messages in a shared error queue, poison rows) are listed, and replay
says per message why it leaves them.
"""

from __future__ import annotations

from bridge.commands.error_queues import ErrorQueue, error_queues, read_failed_messages
from bridge.commands.failed_messages import FailedMessage
from bridge.commands.selection import Found, Selection, missing_ids, read_each
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import Dialect
from bridge.exceptions import DatabaseError, RequestError

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
