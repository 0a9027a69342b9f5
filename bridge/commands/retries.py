"""`sfbridge retries list / now / fail`: retry storage in the operator's hands.

`list` shows the messages waiting for another attempt; `now` makes them due at once, so a
running daemon tries them at its next look (within a second); `fail` gives up on them, moving
them to their forwarder's error queue with the failure headers and the reason
`failed-by-operator`, where `sfbridge errors` (or ServicePulse) takes over. The three select
with the same filters. The reads and writes are in `bridge.storage.retries`; each write locks
as the daemon's claim does, so the commands are safe beside running daemons.
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import json
import socket
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bridge.addressing import TableAddress
from bridge.commands.audit import OpenCommand, open_command, operator_name, record_command
from bridge.commands.failed_messages import one_line
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import Connection
from bridge.exceptions import (
    AddressError,
    DatabaseError,
    DatabaseUnavailable,
    ErrorsRequestError,
    ExitCode,
    UnsetVariable,
)
from bridge.forwarding.writes import QueueWriter
from bridge.messages import utcnow
from bridge.secrets import for_terminal
from bridge.storage.retries import (
    Operator,
    RetryStore,
    WaitingMessage,
    fail_messages,
    make_due,
    read_waiting,
    retry_stores,
)

# LAST ERROR, the last column, in the text listing: long enough for the bridge's own errors
# with their advice (a line may wrap on a narrow terminal); `--json` has the full text.
ERROR_WIDTH = 400
_HEADINGS = (
    "MESSAGE ID",
    "FORWARDER",
    "DESTINATION",
    "ATTEMPTS",
    "NEXT ATTEMPT (UTC)",
    "LAST ERROR",
)
# `fail` goes over the rows a batch held again, this many times at most: such a row comes back
# under a new key when the daemon stores it for yet another attempt.
FAIL_PASSES = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="retries_command", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="one line per message waiting in retry storage")
    now = verbs.add_parser(
        "now", help="make messages due at once: a running daemon tries them within a second"
    )
    fail = verbs.add_parser(
        "fail",
        help="give up on messages: move them to their forwarder's error queue "
        "(reason failed-by-operator)",
    )
    for verb in (listing, now, fail):
        verb.add_argument("--forwarder", metavar="NAME", help="only this forwarder's messages")
        verb.add_argument(
            "--destination",
            metavar="GLOB",
            help="only messages whose destination address, its table name or its database's "
            "name matches, e.g. 'Samples.*' or 'receiver' (case-sensitive)",
        )
        verb.add_argument(
            "--message-id",
            action="append",
            default=[],
            metavar="ID",
            help="only this message, by its NServiceBus.MessageId or its row Id (repeat for more)",
        )
    listing.add_argument("--json", action="store_true", help="machine-readable output")


@dataclass(frozen=True)
class Filters:
    """What `retries` selects; every given criterion must hold."""

    forwarder: str | None
    destination: str | None
    message_ids: frozenset[str]

    def selects(self, message: WaitingMessage, dialect: Dialect) -> bool:
        if self.forwarder is not None and message.forwarder != self.forwarder:
            return False
        if self.message_ids and not {message.message_id, message.row_id} & self.message_ids:
            return False
        if self.destination is None:
            return True
        candidates = [message.destination]
        if message.destination_database:
            candidates.append(message.destination_database)
        try:
            candidates.append(dialect.grammar.parse(message.destination).table)
        except AddressError:
            pass
        return any(fnmatch.fnmatchcase(text, self.destination) for text in candidates)

    def describe(self) -> str:
        parts = [
            f"--forwarder {self.forwarder}" if self.forwarder else "",
            f"--destination {self.destination}" if self.destination else "",
            *(f"--message-id {each}" for each in sorted(self.message_ids)),
        ]
        return " ".join(part for part in parts if part) or "(all)"


@dataclass
class Found:
    """One retry storage as read: the selected messages, out of `total`."""

    store: RetryStore
    dialect: Dialect
    messages: list[WaitingMessage]
    total: int
    exists: bool


def run_retries(config: BridgeConfig, args: argparse.Namespace) -> int:
    """Run `retries <verb>`. Raises ErrorsRequestError for an unknown forwarder."""
    verb = args.retries_command
    filters = filters_from(config, args)
    connections = Connections(config.databases)
    problems: list[DatabaseError] = []
    try:
        found = _read(config, filters, connections, problems)
        if verb == "list":
            _print_list(found, as_json=args.json)
        elif verb == "now":
            _now(config, found, filters, connections, problems)
        else:
            _fail(config, found, filters, connections, problems)
    finally:
        connections.close()
    for problem in problems:
        print(f"sfbridge retries {verb}: {problem}", file=sys.stderr)
    if any(isinstance(problem, UnsetVariable) for problem in problems):
        return ExitCode.USAGE  # as for the configuration: the person running it must act
    if any(isinstance(problem, DatabaseUnavailable) for problem in problems):
        return ExitCode.UNAVAILABLE
    return ExitCode.FAILED if problems else ExitCode.OK


def filters_from(config: BridgeConfig, args: argparse.Namespace) -> Filters:
    names = [forwarder.name for forwarder in config.forwarders]
    if args.forwarder is not None and args.forwarder not in names:
        close = difflib.get_close_matches(args.forwarder, names, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else f"forwarders: {', '.join(names)}"
        raise ErrorsRequestError(f"no forwarder named {args.forwarder!r} ({hint})")
    ids = set(args.message_id)
    ids |= {_canonical(each) for each in args.message_id}
    return Filters(args.forwarder, args.destination, frozenset(ids))


def _canonical(text: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return text


def _read(
    config: BridgeConfig, filters: Filters, connections: Connections, problems: list[DatabaseError]
) -> list[Found]:
    found = []
    for store in retry_stores(config):
        if filters.forwarder is not None and filters.forwarder not in store.forwarders:
            continue
        dialect = dialect_for(config.databases[store.database].dialect)
        try:
            rows = read_waiting(connections.get(store.database), dialect, store)
        except DatabaseError as error:
            connections.discard(store.database)
            problems.append(error)
            continue
        chosen = [m for m in rows or () if filters.selects(m, dialect)]
        found.append(Found(store, dialect, chosen, len(rows or ()), rows is not None))
    return found


# -- list ----------------------------------------------------------------------------------


def _print_list(found: list[Found], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps([_as_json(each, m) for each in found for m in each.messages], indent=2))
        return
    for each in found:
        where = each.store.describe(each.dialect)
        if not each.exists:
            print(f"{where}: does not exist yet (nothing has waited there)")
            continue
        of = f" (of {each.total})" if each.total != len(each.messages) else ""
        print(f"{where}: {len(each.messages)} message(s){of}")
        if not each.messages:
            continue
        rows: list[tuple[str, ...]] = [_HEADINGS]
        rows += [_row(message) for message in each.messages]
        widths = [max(len(row[index]) for row in rows) for index in range(len(_HEADINGS) - 1)]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
            print("  " + "  ".join([*cells, row[-1]]))


def _row(message: WaitingMessage) -> tuple[str, ...]:
    return (
        for_terminal(message.message_id),
        message.forwarder,
        for_terminal(message.destination),
        str(message.attempts),
        _time(message.next_attempt_at),
        for_terminal(one_line(message.last_error, ERROR_WIDTH)),
    )


def _time(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def _iso(moment: datetime | None) -> str | None:
    return moment.replace(tzinfo=UTC).isoformat(timespec="seconds") if moment else None


def _as_json(found: Found, message: WaitingMessage) -> dict[str, Any]:
    return {
        "message_id": message.message_id,
        "id": message.row_id,
        "database": found.store.database,
        "forwarder": message.forwarder,
        "destination": message.destination,
        "destination_database": message.destination_database,
        "attempts": message.attempts,
        "first_failure_at": _iso(message.first_failure_at),
        "next_attempt_at": _iso(message.next_attempt_at),
        "last_error": for_terminal(message.last_error),
    }


# -- now -----------------------------------------------------------------------------------


def _now(
    config: BridgeConfig,
    found: list[Found],
    filters: Filters,
    connections: Connections,
    problems: list[DatabaseError],
) -> None:
    total = changed = 0
    for each in found:
        if not each.messages:
            continue
        total += len(each.messages)
        try:
            count = make_due(
                connections.get(each.store.database), each.dialect, each.store, each.messages
            )
        except DatabaseError as error:
            connections.discard(each.store.database)
            problems.append(error)
            continue
        changed += count
        record_command(
            config, connections, each.store.database, "retries now", filters.describe(), count
        )
    if total == 0:
        print("no messages in retry storage match; nothing to do")
        return
    busy = total - changed
    also = (
        f"; {busy} were being tried by a daemon at that moment" if busy > 0 and not problems else ""
    )
    print(
        f"made {changed} message(s) due now{also}. A running daemon tries them at its next look "
        "(within a second); messages for a paused database, or one waiting out an outage, "
        "stay until it is back."
    )


# -- fail ----------------------------------------------------------------------------------


def _fail(
    config: BridgeConfig,
    found: list[Found],
    filters: Filters,
    connections: Connections,
    problems: list[DatabaseError],
) -> None:
    operator = Operator(operator_name(), socket.gethostname())
    writer = QueueWriter()
    moved = skipped = busy = 0
    for each in found:
        chosen = [m for m in each.messages if m.forwarder in each.store.forwarders]
        for message in each.messages:
            if message.forwarder not in each.store.forwarders:
                print(
                    f"skipped {for_terminal(message.message_id)}: forwarder "
                    f"{for_terminal(message.forwarder)!r} is not in this config, so its error "
                    "queue is unknown"
                )
        skipped += len(each.messages) - len(chosen)
        if not chosen:
            continue
        database = each.store.database
        try:
            connection = connections.get(database)
            # Recorded first, each chunk adding its count as it commits: exact if killed.
            audit = open_command(config, connection, database, "retries fail", filters.describe())
            try:
                count, left = _fail_passes(
                    config, connection, each, chosen, operator, writer, audit
                )
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
    config: BridgeConfig,
    connection: Connection,
    found: Found,
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
            connection, dialect, found.store, pending, operator=operator,
            now=utcnow(), write_rows=write_rows, on_chunk=report,
            in_chunk=audit.add,
        )  # fmt: skip
        moved += count
        if count == len(pending) or attempt == FAIL_PASSES - 1:
            break
        # Some were held by a batch: those the daemon stored again have a new key.
        wanted = {(m.row_id, m.destination) for m in pending}
        rows = read_waiting(connection, dialect, found.store) or []
        pending = [m for m in rows if (m.row_id, m.destination) in wanted]
        if not pending:
            break
    return moved, len(chosen) - moved
