"""What `sfbridge errors` and `sfbridge retries` select messages by, and how they read, list and
report them: one vocabulary for both.

The options mean the same in every verb that takes them:
  --forwarder NAME    only the messages of this forwarder
  --destination GLOB  only messages whose destination matches: the whole address, its table
                      name, and for failed messages an event's type, for waiting ones the
                      destination database's name (case-sensitive, as routes are)
  --id ID             only this message, by its row Id or its NServiceBus.MessageId (repeat)
  --reason REASON     (failed messages) only this failure reason
  --since TIME        (failed messages) only those that failed since TIME
  --group BY:VALUE    (failed messages) only this group, as `errors summary` names it
  --json              (list, show) machine-readable output
  --limit N           (list, show) at most N messages (0: all), then "... N more"
`--message-id`, the old spelling of `--id` in `retries`, is still taken (not shown in help).
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, Protocol, TypeVar

from bridge.addressing import AddressGrammar
from bridge.commands.failed_messages import REASONS, FailedMessage, row_id_text
from bridge.commands.failure_groups import group_value, parse_group
from bridge.config.durations import parse_duration
from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.connections import Connections
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import Connection
from bridge.exceptions import (
    AddressError,
    DatabaseError,
    DatabaseUnavailable,
    ExitCode,
    RequestError,
    UnsetVariable,
)
from bridge.headers import DESTINATION_HEADER, EVENT_TYPE_HEADER
from bridge.secrets import inert
from bridge.storage.retries import WaitingMessage

# -- the options ------------------------------------------------------------------------------


def add_selection_arguments(parser: argparse.ArgumentParser, *, failed: bool) -> None:
    """The options that select messages; with `failed` (error queues), also `--reason` and
    `--since`, which only failed messages have."""
    parser.add_argument("--forwarder", metavar="NAME", help="only the messages of this forwarder")
    parser.add_argument(
        "--destination",
        metavar="GLOB",
        help="only messages whose destination address or its table name matches, e.g. "
        "'Samples.*' (case-sensitive, as routes are); "
        + ("or an event's type" if failed else "or the destination database's name"),
    )
    parser.add_argument(
        "--id",
        action="append",
        default=[],
        metavar="ID",
        help="only this message, by its row Id or its NServiceBus.MessageId (repeat for more); "
        "an id not found changes nothing",
    )
    # The old spelling in `retries`: same list, not shown.
    parser.add_argument("--message-id", action="append", dest="id", help=argparse.SUPPRESS)
    if failed:
        parser.add_argument(
            "--reason", metavar="REASON", help=f"only this failure reason: {', '.join(REASONS)}"
        )
        parser.add_argument(
            "--since",
            metavar="TIME",
            help="only messages that failed since TIME: a duration back from now (2h, 30m, "
            "1d12h) or an ISO time (2026-11-23T12:00:00Z; UTC unless it gives an offset)",
        )
        parser.add_argument(
            "--group",
            metavar="BY:VALUE",
            help="only the messages of this group, as 'sfbridge errors summary' names it, "
            "e.g. reason:unroutable or exception:System.TimeoutException",
        )


# What `--limit` is when not given: a screenful.
DEFAULT_LIMIT = 50


def add_limit_argument(parser: argparse.ArgumentParser, what: str = "messages") -> None:
    parser.add_argument(
        "--limit",
        type=_limit,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"show at most N {what} (default {DEFAULT_LIMIT}; 0 shows all), then how many more",
    )


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of messages, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("0 (all) or more")
    return value


def more_line(hidden: int, what: str = "message(s)") -> str:
    """The line that says a listing was cut: `... 12 more message(s), use --limit`."""
    return f"... {hidden} more {what}, use --limit N (0 for all) or narrow the selection"


def report_hidden(hidden: int, *, as_json: bool, what: str = "message(s)") -> None:
    """Say that `hidden` entries were left out by `--limit`: on stdout after a text listing,
    on stderr beside JSON (which stays a plain list a program can read)."""
    if hidden <= 0:
        return
    if as_json:
        print(inert(f"sfbridge: {more_line(hidden, what)}"), file=sys.stderr)
    else:
        say(more_line(hidden, what))


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


# -- what is selected -------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """What a command selects. Every given criterion must hold.

    `destination` is a glob (`*`, `?`, `[abc]`, case-sensitive as routes are); `since` an
    aware UTC time compared with `NServiceBus.TimeOfFailure`; `ids` canonical row Ids (see
    `row_id_text`) or `NServiceBus.MessageId`s, either of which selects a message. `given` is
    the options as typed, for the audit log.
    """

    forwarder: str | None = None
    reason: str | None = None
    destination: str | None = None
    since: datetime | None = None
    ids: frozenset[str] = frozenset()
    given: str = "(all)"
    # `--group`: (grouping, value) as `bridge.commands.failure_groups` names them.
    group: tuple[str, str] | None = None

    def in_group(self, message: FailedMessage, destination: str | None) -> bool:
        """Whether `message` (going to `destination`) is in the `--group`, if one is given."""
        if self.group is None:
            return True
        by, value = self.group
        return group_value(by, message, destination) == value

    def selects(
        self,
        message: FailedMessage,
        grammar: AddressGrammar | None = None,
        proxy_destination: Sequence[str] = (),
    ) -> bool:
        """Whether the failed `message` is selected; `grammar` (the forwarding database's)
        reads the destination address for the table-name match. `proxy_destination`: where
        the message's forwarder delivers when it is a proxy (its queue's canonical address and
        table name), since a proxy's messages carry no routing header."""
        if self.ids and not message.known_as & self.ids:
            return False
        if self.forwarder is not None and message.forwarder != self.forwarder:
            return False
        if self.reason is not None and message.reason != self.reason:
            return False
        if self.since is not None:
            failed_at = message.failed_at
            if failed_at is None or failed_at < self.since:
                return False
        if self.destination is None:
            return True
        candidates = list(proxy_destination)
        header = message.header(DESTINATION_HEADER)
        if header is not None and header.strip():
            candidates += _address_and_table(header, grammar)
        event_type = message.header(EVENT_TYPE_HEADER)
        if event_type is not None and event_type.strip():
            candidates.append(event_type)
        return self._destination_matches(candidates)

    def selects_waiting(self, message: WaitingMessage, grammar: AddressGrammar) -> bool:
        """Whether `message`, waiting in retry storage, is selected (it has no failure reason
        or time yet: `reason` and `since` are not asked of it)."""
        if self.forwarder is not None and message.forwarder != self.forwarder:
            return False
        known_as = {row_id_text(message.row_id), row_id_text(message.message_id)}
        if self.ids and not known_as & self.ids:
            return False
        if self.destination is None:
            return True
        candidates = _address_and_table(message.destination, grammar)
        if message.destination_database:
            candidates.append(message.destination_database)
        return self._destination_matches(candidates)

    def _destination_matches(self, candidates: Iterable[str]) -> bool:
        assert self.destination is not None
        return any(fnmatch.fnmatchcase(text, self.destination) for text in candidates)


def _address_and_table(address: str, grammar: AddressGrammar | None) -> list[str]:
    if grammar is None:
        return [address]
    try:
        return [address, grammar.parse(address).table]
    except AddressError:
        return [address]


def selection_from(config: BridgeConfig, args: argparse.Namespace, now: datetime) -> Selection:
    """The selection on the command line (`add_selection_arguments`). Raises RequestError for
    an unknown forwarder, reason or a `--since` that is no time."""
    if args.forwarder is not None:
        forwarder_named(config, args.forwarder)
    reason = getattr(args, "reason", None)
    since = getattr(args, "since", None)
    group = getattr(args, "group", None)
    return Selection(
        forwarder=args.forwarder,
        reason=None if reason is None else check_reason(reason),
        destination=args.destination,
        since=None if since is None else parse_since(since, now),
        ids=frozenset(row_id_text(each) for each in args.id),
        given=_as_typed(args),
        group=None if group is None else parse_group(group),
    )


def _as_typed(args: argparse.Namespace) -> str:
    parts = [
        f"--{name} {value}"
        for name in ("forwarder", "reason", "destination", "since", "group")
        if (value := getattr(args, name, None)) is not None
    ]
    parts += [f"--id {each}" for each in args.id]
    return " ".join(parts) or "(all)"


def forwarder_named(config: BridgeConfig, name: str | None) -> ForwarderConfig:
    """The forwarder called `name` (None: the first). Raises RequestError naming the nearest
    one, or all of them."""
    names = [forwarder.name for forwarder in config.forwarders]
    if name is None:
        return config.forwarders[0]
    if name not in names:
        raise RequestError(f"no forwarder named {name!r} ({nearest(name, names, 'forwarders')})")
    return config.forwarder(name)


def nearest(name: str, known: Sequence[str], kind: str) -> str:
    """`did you mean 'x'?` when a known name is close to `name`, else `<kind>: a, b`."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else f"{kind}: {', '.join(known)}"


def check_reason(reason: str) -> str:
    """`reason` if it is one the bridge writes (or `poison`); raises RequestError naming the
    nearest one and the choices otherwise."""
    if reason in REASONS:
        return reason
    close = difflib.get_close_matches(reason, REASONS, n=1, cutoff=0.6)
    near = f"did you mean {close[0]!r}? " if close else ""
    raise RequestError(f"no failure reason {reason!r} ({near}reasons: {', '.join(REASONS)})")


def parse_since(text: str, now: datetime) -> datetime:
    """`--since`: a duration back from `now` (`2h`, `30m`, `1d12h`) or an ISO time
    (`2026-11-23T12:00:00Z`; UTC unless it gives an offset). Returns an aware UTC time.

    Raises RequestError naming both forms.
    """
    stripped = text.strip()
    try:
        return now.astimezone(UTC) - timedelta(seconds=parse_duration(stripped))
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(stripped)
    except ValueError:
        raise RequestError(
            f"--since wants a duration back from now such as 2h, 30m or 1d12h, or an ISO time "
            f"such as 2026-11-23T12:00:00Z (UTC unless it gives an offset); got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def missing_ids(ids: Sequence[str], messages: Sequence[FailedMessage]) -> list[str]:
    """The `ids` (row Ids or `NServiceBus.MessageId`s) that name no message in `messages`, in
    the order given."""
    if not ids:
        return []
    found = {known for message in messages for known in message.known_as}
    return [row_id for row_id in dict.fromkeys(ids) if row_id not in found]


# -- reading ----------------------------------------------------------------------------------


class Place(Protocol):
    """Where messages are read from: an error queue, a retry storage table."""

    @property
    def database(self) -> str: ...


PlaceT = TypeVar("PlaceT", bound=Place)
MessageT = TypeVar("MessageT")
ResultT = TypeVar("ResultT")


@dataclass
class Found(Generic[PlaceT, MessageT]):
    """One place as read: `where` it is (for a person), the selected messages out of `total`,
    and whether the table `exists` at all."""

    place: PlaceT
    dialect: Dialect
    where: str
    messages: list[MessageT]
    total: int
    exists: bool
    # How many were selected, when `messages` holds only the first of them (`limit_found`).
    selected: int | None = None


def read_places(
    config: BridgeConfig,
    places: Iterable[PlaceT],
    connections: Connections,
    problems: list[DatabaseError],
    read: Callable[[Connection, Dialect, PlaceT], ResultT],
) -> Iterator[tuple[PlaceT, Dialect, ResultT]]:
    """Each place with its dialect and what `read` made of it on its database's connection,
    one place at a time; a database that fails adds its error to `problems`, its connection
    is dropped, and the place is left out."""
    for place in places:
        dialect = dialect_for(config.databases[place.database].dialect)
        try:
            result = read(connections.get(place.database), dialect, place)
        except DatabaseError as error:
            connections.discard(place.database)
            problems.append(error)
            continue
        yield place, dialect, result


def read_each(
    config: BridgeConfig,
    places: Iterable[PlaceT],
    connections: Connections,
    problems: list[DatabaseError],
    read: Callable[[Connection, Dialect, PlaceT], Sequence[MessageT] | None],
    where: Callable[[PlaceT, Dialect], str],
    selects: Callable[[PlaceT, Dialect, MessageT], bool],
) -> list[Found[PlaceT, MessageT]]:
    """Every place `read` (None: the table does not exist), keeping the messages `selects`
    chooses. A database that fails adds its error to `problems` and nothing to the result."""
    found = []
    for place, dialect, rows in read_places(config, places, connections, problems, read):
        chosen = [row for row in rows or () if selects(place, dialect, row)]
        found.append(
            Found(place, dialect, where(place, dialect), chosen, len(rows or ()), rows is not None)
        )
    return found


# -- listing and reporting ----------------------------------------------------------------------


def limit_found(
    found: list[Found[PlaceT, MessageT]], limit: int
) -> tuple[list[Found[PlaceT, MessageT]], int]:
    """`found` with at most `limit` messages in all (0: no limit), the first places first;
    and how many were left out. A place keeps its `total`, so its heading still counts them."""
    if not limit:
        return found, 0
    kept: list[Found[PlaceT, MessageT]] = []
    left = limit
    hidden = 0
    for each in found:
        shown = each.messages[:left]
        hidden += len(each.messages) - len(shown)
        left -= len(shown)
        kept.append(replace(each, messages=shown, selected=len(each.messages)))
    return kept, hidden


def listing_lines(
    found: Found[Any, Any], headings: tuple[str, ...], rows: list[tuple[str, ...]], *, absent: str
) -> list[str]:
    """One place's part of a `list`: how many messages (of how many), then the `rows` under
    their `headings` in columns; `absent` says why a table that does not exist is fine."""
    if not found.exists:
        return [f"{found.where}: does not exist yet ({absent})"]
    selected = len(found.messages) if found.selected is None else found.selected
    of = f" (of {found.total})" if found.total != selected else ""
    shown = f", the first {len(found.messages)} shown" if selected != len(found.messages) else ""
    lines = [f"{found.where}: {selected} message(s){of}{shown}"]
    if rows:
        lines += ["  " + line for line in columns([headings, *rows])]
    return lines


def columns(rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Rows aligned in columns, all but the last padded to their widest cell."""
    widths = [max(len(row[index]) for row in rows) for index in range(len(rows[0]) - 1)]
    return [
        "  ".join([cell.ljust(width) for cell, width in zip(row, widths, strict=False)] + [row[-1]])
        for row in rows
    ]


def print_json(records: list[dict[str, Any]]) -> None:
    # JSON escapes every control character itself (and every non-ASCII one).
    print(json.dumps(records, indent=2))


def say(line: str) -> None:
    """Print one line with its control characters escaped (`bridge.secrets.inert`): every line
    these commands print may quote message data (Ids, headers, reasons, the body)."""
    print(inert(line))


def finish(verb: str, problems: list[DatabaseError], code: int) -> int:
    """Print the databases' `problems` and return the exit code: USAGE when a variable is not
    set (as for the configuration: the person running it must act), UNAVAILABLE when a
    database cannot be reached, FAILED for another problem, else `code`."""
    for problem in problems:
        print(inert(f"sfbridge {verb}: {problem}"), file=sys.stderr)
    if any(isinstance(problem, UnsetVariable) for problem in problems):
        return ExitCode.USAGE
    if any(isinstance(problem, DatabaseUnavailable) for problem in problems):
        return ExitCode.UNAVAILABLE
    return ExitCode.FAILED if problems and code == ExitCode.OK else code


def refused_without_terminal(verb: str, doing: str, *, yes: bool, dry_run: bool) -> bool:
    """Whether a command that changes things and asks first must stop: no `--yes` and no
    terminal to ask at. Says why on stderr; `doing` is what it would do ("delete 3
    message(s)"), `dry_run` whether the verb has a `--dry-run` to point at."""
    if yes or sys.stdin.isatty():
        return False
    hint = " (--dry-run shows them)" if dry_run else ""
    print(
        inert(
            f"sfbridge {verb}: refusing to {doing} without a confirmation: run it in a "
            f"terminal to be asked, or add --yes{hint}"
        ),
        file=sys.stderr,
    )
    return True


def confirmed(question: str) -> bool:
    """Whether a person at the terminal answers yes to `question`."""
    try:
        answer = input(question)
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")
