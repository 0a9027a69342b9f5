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
from bridge.exceptions import DatabaseError, ExitCode, RequestError
from bridge.forwarding.proxies import forwarder_router
from bridge.headers import ADDRESS_DATABASE_HEADER, DESTINATION_HEADER
from bridge.routing import Unroutable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_selection_arguments(parser, failed=True)
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would move; move nothing"
    )
    parser.add_argument(
        "--to",
        metavar="ADDRESS",
        help="send them to this destination queue instead (an address in the forwarding "
        "database's grammar, as a routing header holds it); refused unless a route allows it",
    )


def run(args: argparse.Namespace) -> int:
    config = load(args)
    selection = selection_from(config, args, datetime.now(UTC))
    connections = Connections(config.databases)
    problems: list[DatabaseError] = []
    try:
        found = read_error_queues(config, selection, connections, problems)
        given = selection.given
        if args.to is not None:
            _check_redirect(config, found, args.to)
            given += f" --to {args.to}"
        _replay(
            config, found, connections, problems, dry_run=args.dry_run, given=given,
            redirect=args.to,
        )  # fmt: skip
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
    redirect: str | None = None,
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
        still_unroutable = {} if redirect else _still_unroutable(config, replayable)
        describe_move = _move_line(each, still_unroutable, redirect)
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
                    in_batch=audit.add, redirect=redirect,
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
    found: FoundFailed, still_unroutable: dict[int, str], redirect: str | None = None
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
        if redirect is not None:
            text += f", redirected to {redirect}"
        return text

    return line


def _check_redirect(config: BridgeConfig, found: list[FoundFailed], address: str) -> None:
    """Raise RequestError, before anything moves, when `address` is no destination the routes
    of each selected message's forwarder allow (a proxy's messages too: with a routing
    header, a proxy routes it as any forwarder does)."""
    forwarders = {m.forwarder for each in found for m in each.messages if m.forwarder}
    for name in sorted(forwarders):
        forwarder = config.forwarder(name)
        decision = forwarder_router(config, forwarder).route(address)
        if isinstance(decision, Unroutable):
            raise RequestError(
                f"--to {address}: no route of forwarder '{name}' allows it ({decision.reason}); "
                "nothing was changed",
                advice="'sfbridge route ADDRESS' shows where an address goes; add a route "
                "to the config first, or pick an address a route matches",
            )


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
