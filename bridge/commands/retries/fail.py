"""`sfbridge retries fail`: give up on waiting messages, moving them to their forwarder's error
queue (reason failed-by-operator)."""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from bridge.addressing import TableAddress
from bridge.commands.audit import OpenCommand, open_command, operator_name
from bridge.commands.configuration import load
from bridge.commands.retries import FoundWaiting, read_retry_stores
from bridge.commands.selection import (
    add_selection_arguments,
    confirmed,
    finish,
    refused_without_terminal,
    selection_from,
)
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.drivers import Connection
from bridge.exceptions import DatabaseError, ExitCode
from bridge.forwarding.writes import QueueWriter
from bridge.messages import utcnow
from bridge.secrets import for_terminal
from bridge.storage.retries import Operator, WaitingMessage, fail_messages, read_waiting

# `fail` goes over the rows a batch held again, this many times at most: such a row comes back
# under a new key when the daemon stores it for yet another attempt.
FAIL_PASSES = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_selection_arguments(parser, failed=False)
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
        found = read_retry_stores(config, selection, connections, problems)
        if args.dry_run:
            _dry_run(found)
        elif _confirmed(found, yes=args.yes):
            _fail(config, found, selection.given, connections, problems)
        else:
            return finish("retries fail", problems, ExitCode.USAGE)
    finally:
        connections.close()
    return finish("retries fail", problems, ExitCode.OK)


def _dry_run(found: list[FoundWaiting]) -> None:
    count = 0
    for each in found:
        for message in each.messages:
            if message.forwarder in each.place.forwarders:
                count += 1
                print(
                    f"would move {for_terminal(message.message_id)} ({message.forwarder}, "
                    f"{for_terminal(message.destination)}, {message.attempts} attempt(s)) to "
                    "its forwarder's error queue"
                )
    print(
        f"dry run: would move {count} message(s) to their forwarders' error queues; "
        "nothing was moved"
    )


def _confirmed(found: list[FoundWaiting], *, yes: bool) -> bool:
    """Whether to go on: `--yes`, nothing to move, or a person at a terminal says so. Without
    a terminal it refuses, as `errors purge` does: giving up on messages is not undone."""
    count = sum(len(each.messages) for each in found)
    if yes or count == 0:
        return True
    doing = f"move {count} message(s) to the error queue"
    if refused_without_terminal("retries fail", doing, yes=False, dry_run=True):
        return False
    if confirmed(f"move {count} message(s) from retry storage to the error queue? [y/N] "):
        return True
    print("kept the messages in retry storage")
    return False


def _fail(
    config: BridgeConfig,
    found: list[FoundWaiting],
    given: str,
    connections: Connections,
    problems: list[DatabaseError],
) -> None:
    operator = Operator(operator_name(), socket.gethostname())
    writer = QueueWriter()
    moved = skipped = busy = 0
    for each in found:
        chosen = [m for m in each.messages if m.forwarder in each.place.forwarders]
        for message in each.messages:
            if message.forwarder not in each.place.forwarders:
                print(
                    f"skipped {for_terminal(message.message_id)}: forwarder "
                    f"{for_terminal(message.forwarder)!r} is not in this config, so its error "
                    "queue is unknown"
                )
        skipped += len(each.messages) - len(chosen)
        if not chosen:
            continue
        database = each.place.database
        try:
            connection = connections.get(database)
            # Recorded first, each chunk adding its count as it commits: exact if killed.
            audit = open_command(config, connection, database, "retries fail", given)
            try:
                count, left = _fail_passes(connection, each, chosen, operator, writer, audit)
            finally:
                audit.close()
        except DatabaseError as error:
            connections.discard(database)
            problems.append(error)
            continue
        moved += count
        busy += left
    if moved + skipped + busy == 0 and not problems:
        print("no messages in retry storage match; nothing to do")
        return
    also = f"; {skipped} skipped" if skipped else ""
    if busy:
        also += (
            f"; {busy} were being tried by a daemon each time (delivered, or still in retry "
            "storage: run it again)"
        )
    print(
        f"moved {moved} message(s) to their forwarders' error queues (reason failed-by-operator)"
        f"{also}. 'sfbridge errors list --reason failed-by-operator' shows them; "
        "'sfbridge errors replay' sends them again."
    )


def _fail_passes(
    connection: Connection,
    found: FoundWaiting,
    chosen: Sequence[WaitingMessage],
    operator: Operator,
    writer: QueueWriter,
    audit: OpenCommand,
) -> tuple[int, int]:
    """Fail `chosen`; a row a batch held is looked for again (under its new key, by its Id and
    destination) a few times. Returns (moved, still held or gone)."""
    moved = 0
    dialect = found.dialect

    def write_rows(
        connection: Connection, queue: TableAddress, rows: Sequence[Sequence[object]]
    ) -> None:
        writer.write_rows(connection, dialect, "send_many", queue, rows)

    def report(forwarder: str, count: int) -> None:
        print(f"moved {count} message(s) of forwarder '{forwarder}' to its error queue")
        sys.stdout.flush()

    pending = list(chosen)
    for attempt in range(FAIL_PASSES):
        count = fail_messages(
            connection, dialect, found.place, pending, operator=operator,
            now=utcnow(), write_rows=write_rows, on_chunk=report,
            in_chunk=audit.add,
        )  # fmt: skip
        moved += count
        if count == len(pending) or attempt == FAIL_PASSES - 1:
            break
        # Some were held by a batch: those the daemon stored again have a new key.
        wanted = {(m.row_id, m.destination) for m in pending}
        rows = read_waiting(connection, dialect, found.place) or []
        pending = [m for m in rows if (m.row_id, m.destination) in wanted]
        if not pending:
            break
    return moved, len(chosen) - moved
