"""`sfbridge errors replay`: move failed messages back into their forwarding queue
(NServiceBus.FailedQ), without the failure headers, so they are routed again."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from bridge.commands.audit import open_command
from bridge.commands.configuration import load
from bridge.commands.error_queues import replay_messages
from bridge.commands.errors import FoundFailed, read_error_queues
from bridge.commands.failed_messages import FailedMessage
from bridge.commands.selection import add_selection_arguments, finish, say, selection_from
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.exceptions import DatabaseError, ExitCode
from bridge.forwarding.proxies import forwarder_router
from bridge.headers import ADDRESS_DATABASE_HEADER, DESTINATION_HEADER
from bridge.routing import Unroutable


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
    try:
        found = read_error_queues(config, selection, connections, problems)
        _replay(config, found, connections, problems, dry_run=args.dry_run, given=selection.given)
    finally:
        connections.close()
    return finish("errors replay", problems, ExitCode.OK)


def _replay(
    config: BridgeConfig,
    found: list[FoundFailed],
    connections: Connections,
    problems: list[DatabaseError],
    *,
    dry_run: bool,
    given: str,
) -> None:
    moved = skipped = gone = 0
    for each in found:
        replayable = [m for m in each.messages if m.replayable]
        for message in each.messages:
            if not message.replayable:
                say(f"skipped {message.row_id}: {message.not_replayable}")
        skipped += len(each.messages) - len(replayable)
        if not replayable:
            continue
        still_unroutable = _still_unroutable(config, replayable)
        describe_move = _move_line(each, still_unroutable)
        for why, count in Counter(still_unroutable.values()).items():
            say(
                f"note: {count} message(s) still have no route in this config ({why}); the "
                "forwarder will put them back in the error queue with a fresh reason"
            )
        if dry_run:
            for message in replayable:
                say(describe_move("would move", message))
            moved += len(replayable)
            continue

        def report(
            batch: list[FailedMessage],
            forwarder: str,
            describe_move: Callable[[str, FailedMessage], str] = describe_move,
        ) -> None:
            for message in batch:
                say(describe_move("moved", message))

        database = each.place.database
        try:
            connection = connections.get(database)
            # Recorded first, each batch adding its count as it commits: exact if killed.
            audit = open_command(
                config, connection, database, "errors replay", f"{each.place.name} {given}"
            )
            try:
                result = replay_messages(
                    connection, each.dialect, each.place, replayable, on_batch=report,
                    in_batch=audit.add,
                )  # fmt: skip
            finally:
                audit.close()
        except DatabaseError as error:
            connections.discard(database)
            problems.append(error)
            continue
        moved += len(result.moved)
        gone += len(result.gone)
        for message in result.gone:
            say(f"gone    {message.row_id}: no longer in {each.place.name} (taken meanwhile)")
    total = sum(len(each.messages) for each in found)
    if total == 0:
        say("no failed messages match; nothing to replay")
    elif dry_run:
        say(f"dry run: would move {moved} message(s) back to their forwarding queues; "
            f"{skipped} skipped; nothing was moved")  # fmt: skip
    else:
        also = f"; {gone} were no longer there" if gone else ""
        say(
            f"replayed {moved} message(s) into their forwarding queues; {skipped} skipped{also}. "
            "A running daemon forwards them with the config it has loaded: reload it (SIGHUP) "
            "after changing routes."
        )


def _move_line(
    found: FoundFailed, still_unroutable: dict[int, str]
) -> Callable[[str, FailedMessage], str]:
    def line(verb: str, message: FailedMessage) -> str:
        assert message.forwarder is not None
        target = found.dialect.grammar.render(found.place.forwarding_queues[message.forwarder])
        text = (
            f"{verb} {message.row_id} ({message.reason or '-'}, "
            f"{found.place.destination_of(message) or '-'}) "
            f"to {target} (forwarder '{message.forwarder}')"
        )
        if message.seq in still_unroutable:
            text += " (still no route in this config)"
        return text

    return line


def _still_unroutable(config: BridgeConfig, messages: Sequence[FailedMessage]) -> dict[int, str]:
    """By sequence value, the messages whose destination the config still cannot route."""
    routers = {}
    result = {}
    for message in messages:
        destination = message.header(DESTINATION_HEADER)
        if message.forwarder is None or destination is None or not destination.strip():
            continue
        if message.forwarder not in routers:
            routers[message.forwarder] = forwarder_router(
                config, config.forwarder(message.forwarder)
            )
        decision = routers[message.forwarder].route(
            destination, message.header(ADDRESS_DATABASE_HEADER)
        )
        if isinstance(decision, Unroutable):
            result[message.seq] = decision.reason
    return result
