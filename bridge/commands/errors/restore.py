"""`sfbridge errors restore`: put archived failed messages back into the error queue they were
archived from, as they were, where `errors list`, `replay` and ServicePulse see them again."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from bridge.commands.audit import open_command
from bridge.commands.configuration import load
from bridge.commands.error_queues import ErrorQueue, error_queues
from bridge.commands.failed_messages import describe
from bridge.commands.selection import (
    Selection,
    add_selection_arguments,
    finish,
    missing_ids,
    say,
    selection_from,
)
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import Connection
from bridge.exceptions import DatabaseError, ExitCode, RequestError
from bridge.forwarding.writes import QueueWriter
from bridge.storage.archive import (
    ArchivedMessage,
    archive_address,
    read_archived,
    take_archived,
)
from bridge.storage.tables import owned_table

BATCH_SIZE = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_selection_arguments(parser, failed=True)
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would move; move nothing"
    )


def run(args: argparse.Namespace) -> int:
    config = load(args)
    selection = selection_from(config, args, datetime.now(UTC))
    connections = Connections(config.databases)
    problems: list[DatabaseError] = []
    queues = error_queues(config, selection.forwarder)
    try:
        chosen = _select(config, queues, selection, connections, problems)
        restored = 0
        for queue, messages in chosen:
            if args.dry_run:
                for message in messages:
                    say(f"would restore {message.row_id} to error queue {queue.name}")
                continue
            dialect = dialect_for(config.databases[queue.database].dialect)
            try:
                connection = connections.get(queue.database)
                audit = open_command(
                    config, connection, queue.database, "errors restore",
                    f"{queue.name} {selection.given}",
                )  # fmt: skip
                try:
                    count = _restore(config, connection, dialect, queue, messages, audit.add)
                finally:
                    audit.close()
            except DatabaseError as error:
                connections.discard(queue.database)
                problems.append(error)
                continue
            restored += count
            say(
                f"restored {count} message(s) to error queue {queue.name} "
                f"(database '{queue.database}')"
            )
    finally:
        connections.close()
    total = sum(len(messages) for _, messages in chosen)
    if total == 0:
        say("no archived messages match; nothing to restore")
    elif args.dry_run:
        say(f"dry run: would restore {total} message(s); nothing was moved")
    return finish("errors restore", problems, ExitCode.OK)


def _select(
    config: BridgeConfig,
    queues: list[ErrorQueue],
    selection: Selection,
    connections: Connections,
    problems: list[DatabaseError],
) -> list[tuple[ErrorQueue, list[ArchivedMessage]]]:
    """Per error queue (by name and database), the archived messages `selection` chooses.
    Raises RequestError when an `--id` names none: then nothing is changed."""
    by_name = {(q.database, q.name): q for q in queues}
    chosen: dict[tuple[str, str], tuple[ErrorQueue, list[ArchivedMessage]]] = {}
    described = []
    for database in dict.fromkeys(q.database for q in queues):
        dialect = dialect_for(config.databases[database].dialect)
        try:
            connection = connections.get(database)
            archived = read_archived(connection, dialect, archive_address(config, database))
        except DatabaseError as error:
            connections.discard(database)
            problems.append(error)
            continue
        for message in archived or []:
            queue = by_name.get((database, message.error_queue))
            if queue is None:
                say(
                    f"skipped {message.row_id}: archived from error queue {message.error_queue}, "
                    f"which no forwarder of this config in database '{database}' uses"
                )
                continue
            failed = describe(message.row_id, message.seq, message.headers_text, queue.owners)
            described.append(failed)
            if selection.selects(
                failed, dialect.grammar, queue.proxy_names(failed)
            ) and selection.in_group(failed, queue.destination_of(failed)):
                chosen.setdefault((database, queue.name), (queue, []))[1].append(message)
    missing = missing_ids(sorted(selection.ids), described)
    if missing:
        raise RequestError(
            f"no archived message with id {', '.join(missing)} matching the other filters; "
            "'sfbridge where ID' says where a message is; nothing was changed"
        )
    return list(chosen.values())


def _restore(
    config: BridgeConfig,
    connection: Connection,
    dialect: Dialect,
    queue: ErrorQueue,
    messages: Sequence[ArchivedMessage],
    in_batch: Callable[[Connection, int], None],
) -> int:
    """Move `messages` from the archive into `queue`, one transaction per batch."""
    archive = archive_address(config, queue.database)
    writer = QueueWriter()
    restored = 0
    for start in range(0, len(messages), BATCH_SIZE):
        batch = messages[start : start + BATCH_SIZE]
        try:
            connection.begin()
            taken = take_archived(connection, dialect, archive, [m.seq for m in batch])
            if taken:
                with owned_table("error queue", queue.name):
                    writer.write_rows(
                        connection, dialect, "send_many", queue.address,
                        [row.queue_row(dialect) for row in taken],
                    )  # fmt: skip
            in_batch(connection, len(taken))
            connection.commit()
            restored += len(taken)
        except BaseException:
            connection.rollback()
            raise
    return restored
