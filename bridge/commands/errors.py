"""`sfbridge errors list / show / replay / purge`: ServicePulse's retry, from the command line.

The commands read every forwarder's error queue (each table once), select messages with the
same filters (`bridge.commands.failed_messages.Selection`), and print what they found or did. Only
messages that failed in a queue some configured forwarder drains are replayed; the others
(an endpoint's failed messages in a shared error queue, poison rows) are listed, and replay
says per message why it leaves them.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

from bridge.commands.audit import open_command
from bridge.commands.error_queues import (
    ErrorQueue,
    error_queues,
    purge_messages,
    read_failed_messages,
    read_full_message,
    replay_messages,
)
from bridge.commands.failed_messages import (
    FailedMessage,
    Selection,
    body_preview,
    check_reason,
    missing_ids,
    one_line,
    parse_since,
    row_id_text,
)
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import Dialect, dialect_for
from bridge.exceptions import (
    DatabaseError,
    DatabaseUnavailable,
    ErrorsRequestError,
    ExitCode,
    SelectionError,
    UnsetVariable,
)
from bridge.forwarding.proxies import forwarder_router
from bridge.headers import ADDRESS_DATABASE_HEADER, DESTINATION_HEADER
from bridge.routing import Unroutable
from bridge.secrets import inert, mask_secrets

# bridge.commands.cli's exit codes (it imports this module; a unit test keeps the two the same).

# The exception message in `errors list`, cut to this many characters.
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


def _say(line: str, file: TextIO | None = None) -> None:
    """Print one line with its control characters escaped (`bridge.secrets.inert`): every line
    these commands print may quote message data (Ids, headers, reasons, the body)."""
    print(inert(line), file=file)


@dataclass
class Found:
    """One error queue as read: the selected messages, out of `total`."""

    queue: ErrorQueue
    dialect: Dialect
    messages: list[FailedMessage]
    total: int
    exists: bool


def run_errors(config: BridgeConfig, args: argparse.Namespace) -> int:
    """Run `errors <verb>`. Raises ErrorsRequestError for an unknown name or a bad filter."""
    verb = args.errors_command
    connections = Connections(config.databases)
    problems: list[DatabaseError] = []
    try:
        if verb == "show":
            code = _show(config, args.id, connections, problems)
        else:
            selection = selection_from(config, args, datetime.now(UTC))
            found = _read(config, selection, connections, problems)
            _check_ids(selection, found, problems)
            if verb == "list":
                _print_list(found, as_json=args.json)
                code = ExitCode.OK
            elif verb == "replay":
                code = _replay(
                    config, found, connections, problems, dry_run=args.dry_run,
                    filters=_filters_text(args),
                )  # fmt: skip
            else:
                code = _purge(
                    config, found, connections, problems, yes=args.yes, filters=_filters_text(args)
                )
    finally:
        connections.close()
    for problem in problems:
        _say(f"sfbridge errors {verb}: {problem}", file=sys.stderr)
    if any(isinstance(problem, UnsetVariable) for problem in problems):
        return ExitCode.USAGE  # as for the configuration: the person running it must act
    if any(isinstance(problem, DatabaseUnavailable) for problem in problems):
        return ExitCode.UNAVAILABLE
    return ExitCode.FAILED if problems and code == ExitCode.OK else code


def _filters_text(args: argparse.Namespace) -> str:
    """The filters as given on the command line, for the audit log."""
    parts = [
        f"--{name} {value}"
        for name in ("forwarder", "reason", "destination", "since")
        if (value := getattr(args, name)) is not None
    ]
    parts += [f"--id {each}" for each in args.id]
    return " ".join(parts) or "(all)"


def selection_from(config: BridgeConfig, args: argparse.Namespace, now: datetime) -> Selection:
    """The filters on the command line. Raises ErrorsRequestError."""
    names = [forwarder.name for forwarder in config.forwarders]
    if args.forwarder is not None and args.forwarder not in names:
        raise ErrorsRequestError(
            f"no forwarder named {args.forwarder!r}{_nearest(args.forwarder, names)}"
        )
    try:
        reason = None if args.reason is None else check_reason(args.reason)
        since = None if args.since is None else parse_since(args.since, now)
    except SelectionError as error:
        raise ErrorsRequestError(str(error)) from None
    return Selection(
        forwarder=args.forwarder,
        reason=reason,
        destination=args.destination,
        since=since,
        ids=frozenset(row_id_text(row_id) for row_id in args.id),
    )


def _nearest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (forwarders: {', '.join(known)})"


def _read(
    config: BridgeConfig,
    selection: Selection,
    connections: Connections,
    problems: list[DatabaseError],
) -> list[Found]:
    found = []
    for queue in error_queues(config, selection.forwarder):
        dialect = dialect_for(config.databases[queue.database].dialect)
        try:
            messages = read_failed_messages(connections.get(queue.database), dialect, queue)
        except DatabaseError as error:
            connections.discard(queue.database)
            problems.append(error)
            continue
        chosen = [
            m for m in messages or () if selection.selects(m, dialect.grammar, queue.proxy_names(m))
        ]
        found.append(Found(queue, dialect, chosen, len(messages or ()), messages is not None))
    return found


def _check_ids(selection: Selection, found: list[Found], problems: list[DatabaseError]) -> None:
    missing = missing_ids(sorted(selection.ids), [m for each in found for m in each.messages])
    if missing:
        where = ", ".join(each.queue.describe() for each in found) or "no error queue"
        unread = " (and some error queues could not be read)" if problems else ""
        raise ErrorsRequestError(
            f"no message with id {', '.join(missing)} matching the other filters in {where}"
            f"{unread}; 'sfbridge errors list' shows the ids; nothing was changed"
        )


# -- list ----------------------------------------------------------------------------------


def _print_list(found: list[Found], *, as_json: bool) -> None:
    if as_json:
        # JSON escapes every control character itself (and every non-ASCII one).
        print(json.dumps([_as_json(each, m) for each in found for m in each.messages], indent=2))
        return
    for each in found:
        if not each.exists:
            _say(f"{each.queue.describe()}: does not exist yet (nothing has failed there)")
            continue
        of = f" (of {each.total})" if each.total != len(each.messages) else ""
        _say(f"{each.queue.describe()}: {len(each.messages)} message(s){of}")
        if not each.messages:
            continue
        rows: list[tuple[str, ...]] = [_HEADINGS]
        rows += [tuple(inert(cell) for cell in _row(each, message)) for message in each.messages]
        for line in _columns(rows):
            _say("  " + line)
        reasons = Counter(m.not_replayable for m in each.messages if m.not_replayable)
        for why, count in reasons.items():
            _say(f"  not replayed by 'errors replay': {count} message(s) marked '-': {why}")


def _row(found: Found, message: FailedMessage) -> tuple[str, ...]:
    failed_at = message.failed_at
    return (
        message.row_id,
        message.message_id or "-",
        failed_at.strftime("%Y-%m-%d %H:%M:%S") if failed_at else "-",
        message.reason or "-",
        found.queue.destination_of(message) or "-",
        "-" if message.attempts is None else str(message.attempts),
        message.forwarder or "-",
        one_line(_masked(message.exception_message), EXCEPTION_WIDTH),
    )


def _columns(rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Rows aligned in columns, all but the last padded to their widest cell."""
    widths = [max(len(row[index]) for row in rows) for index in range(len(rows[0]) - 1)]
    return [
        "  ".join([cell.ljust(width) for cell, width in zip(row, widths, strict=False)] + [row[-1]])
        for row in rows
    ]


def _as_json(found: Found, message: FailedMessage) -> dict[str, Any]:
    failed_at = message.failed_at
    return {
        "id": message.row_id,
        "database": found.queue.database,
        "error_queue": found.queue.name,
        "forwarder": message.forwarder,
        "failed_queue": message.failed_queue,
        "replayable": message.replayable,
        "not_replayable_because": message.not_replayable,
        "time_of_failure": failed_at.isoformat() if failed_at else None,
        "reason": message.reason,
        "destination": found.queue.destination_of(message),
        "attempts": message.attempts,
        "exception_type": message.header("NServiceBus.ExceptionInfo.ExceptionType"),
        "exception_message": _masked(message.exception_message),
        "message_id": message.message_id,
    }


def _masked(text: str | None) -> str | None:
    return None if text is None else mask_secrets(text)


# -- show ----------------------------------------------------------------------------------


def _show(
    config: BridgeConfig, given: str, connections: Connections, problems: list[DatabaseError]
) -> int:
    """Every message whose row Id or `NServiceBus.MessageId` is `given` (a MessageId may name
    several: the copies of one published event, or a message that failed twice)."""
    row_id = row_id_text(given)
    searched = []
    shown = 0
    for queue in error_queues(config):
        searched.append(queue.describe())
        dialect = dialect_for(config.databases[queue.database].dialect)
        try:
            connection = connections.get(queue.database)
            messages = read_failed_messages(connection, dialect, queue) or []
            chosen = [m for m in messages if row_id in m.known_as]
            for message in chosen:
                full = read_full_message(connection, dialect, queue, message.seq)
                if full is not None:
                    _print_message(queue, full.message, full.headers_text, full.body)
                    shown += 1
        except DatabaseError as error:
            connections.discard(queue.database)
            problems.append(error)
    if shown == 0:
        unread = " (and some error queues could not be read)" if problems else ""
        raise ErrorsRequestError(
            f"no message with id {given} in {', '.join(searched)}{unread} (by its Id or its "
            "NServiceBus.MessageId); 'sfbridge errors list' shows both"
        )
    return ExitCode.OK


def _print_message(
    queue: ErrorQueue, message: FailedMessage, headers_text: str | None, body: bytes | None
) -> None:
    _say(f"message {message.row_id} in {queue.describe()}")
    if message.forwarder is not None:
        _say(
            f"  failed in {message.failed_queue} (forwarder '{message.forwarder}'); "
            f"'sfbridge errors replay --id {message.row_id}' sends it back there"
        )
    else:
        _say(f"  not replayed by the bridge: {message.not_replayable}")
    failed_at = message.failed_at
    _say(f"  message id: {message.message_id or '-'}")
    _say(f"  reason: {message.reason or '-'}")
    _say(f"  failed at: {failed_at.strftime('%Y-%m-%d %H:%M:%S') + ' UTC' if failed_at else '-'}")
    if message.headers is None:
        _say(f"headers (cannot be read: {message.poison}):")
        _say(f"  {mask_secrets(headers_text or '')}")
    else:
        _say("headers:")
        for name, value in message.headers.items():
            _say(f"  {name}: {'null' if value is None else mask_secrets(value)}")
    kind, lines = body_preview(body)
    _say(f"body ({kind}):" if lines else f"body: {kind}")
    for line in lines:
        _say(f"  {line}")


# -- replay --------------------------------------------------------------------------------


def _replay(
    config: BridgeConfig,
    found: list[Found],
    connections: Connections,
    problems: list[DatabaseError],
    *,
    dry_run: bool,
    filters: str,
) -> int:
    moved = skipped = gone = 0
    for each in found:
        replayable = [m for m in each.messages if m.replayable]
        for message in each.messages:
            if not message.replayable:
                _say(f"skipped {message.row_id}: {message.not_replayable}")
        skipped += len(each.messages) - len(replayable)
        if not replayable:
            continue
        still_unroutable = _still_unroutable(config, replayable)
        describe_move = _move_line(each, still_unroutable)
        for why, count in Counter(still_unroutable.values()).items():
            _say(
                f"note: {count} message(s) still have no route in this config ({why}); the "
                "forwarder will put them back in the error queue with a fresh reason"
            )
        if dry_run:
            for message in replayable:
                _say(describe_move("would move", message))
            moved += len(replayable)
            continue

        def report(
            batch: list[FailedMessage],
            forwarder: str,
            describe_move: Callable[[str, FailedMessage], str] = describe_move,
        ) -> None:
            for message in batch:
                _say(describe_move("moved", message))

        database = each.queue.database
        try:
            connection = connections.get(database)
            # Recorded first, each batch adding its count as it commits: exact if killed.
            audit = open_command(
                config, connection, database, "errors replay", f"{each.queue.name} {filters}"
            )
            try:
                result = replay_messages(
                    connection, each.dialect, each.queue, replayable, on_batch=report,
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
            _say(f"gone    {message.row_id}: no longer in {each.queue.name} (taken meanwhile)")
    total = sum(len(each.messages) for each in found)
    if total == 0:
        _say("no failed messages match; nothing to replay")
    elif dry_run:
        _say(f"dry run: would move {moved} message(s) back to their forwarding queues; "
              f"{skipped} skipped; nothing was moved")  # fmt: skip
    else:
        also = f"; {gone} were no longer there" if gone else ""
        _say(
            f"replayed {moved} message(s) into their forwarding queues; {skipped} skipped{also}. "
            "A running daemon forwards them with the config it has loaded: reload it (SIGHUP) "
            "after changing routes."
        )
    return ExitCode.OK


def _move_line(
    found: Found, still_unroutable: dict[int, str]
) -> Callable[[str, FailedMessage], str]:
    def line(verb: str, message: FailedMessage) -> str:
        assert message.forwarder is not None
        target = found.dialect.grammar.render(found.queue.forwarding_queues[message.forwarder])
        text = (
            f"{verb} {message.row_id} ({message.reason or '-'}, "
            f"{found.queue.destination_of(message) or '-'}) "
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


# -- purge ---------------------------------------------------------------------------------


def _purge(
    config: BridgeConfig,
    found: list[Found],
    connections: Connections,
    problems: list[DatabaseError],
    *,
    yes: bool,
    filters: str,
) -> int:
    chosen = [each for each in found if each.messages]
    if not chosen:
        _say("no failed messages match; nothing to delete")
        return ExitCode.OK
    if not yes and not sys.stdin.isatty():
        count = sum(len(each.messages) for each in chosen)
        _say(
            f"sfbridge errors purge: refusing to delete {count} message(s) without a "
            "confirmation: run it in a terminal to be asked, or add --yes",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    for each in chosen:
        name = f"{each.queue.name} (database '{each.queue.database}')"
        foreign = sum(1 for m in each.messages if not m.replayable)
        if foreign:
            _say(
                f"error queue {name}: {foreign} of these {len(each.messages)} message(s) did not "
                "fail in a queue a forwarder drains (an endpoint's failed messages, or poison)"
            )
        if not yes and not _confirmed(
            f"delete {len(each.messages)} message(s) from error queue {name}? [y/N] "
        ):
            _say(f"kept the messages in error queue {name}")
            continue
        database = each.queue.database
        try:
            connection = connections.get(database)
            audit = open_command(
                config, connection, database, "errors purge", f"{each.queue.name} {filters}"
            )
            try:
                deleted = purge_messages(
                    connection, each.dialect, each.queue, each.messages, in_batch=audit.add
                )
            finally:
                audit.close()
        except DatabaseError as error:
            connections.discard(database)
            problems.append(error)
            continue
        _say(f"deleted {deleted} message(s) from error queue {name}")
    return ExitCode.OK


def _confirmed(question: str) -> bool:
    try:
        answer = input(question)
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")
