"""`sfbridge where MESSAGE_ID`: where one message is now and what happened to it.

Given an `NServiceBus.MessageId` or a row Id, it looks in every place a message can be, with
point queries (`bridge.storage.whereabouts`): each forwarding queue (by its Id; by the
MessageId in its headers only with `--scan`, which reads the whole queue), retry storage
(attempts, next attempt, last error), each dedup ledger (delivered: which database and queue,
when), each error queue (reason, time; read by its headers, as error queues are small next to
the others) and the error archive. A published event is one line per subscriber's copy, in
whichever place each copy is.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from bridge.addressing import TableAddress
from bridge.commands.configuration import load
from bridge.commands.error_queues import ErrorQueue, error_queues
from bridge.commands.failed_messages import describe, one_line, row_id_text
from bridge.commands.selection import (
    add_json_argument,
    add_limit_argument,
    finish,
    print_json,
    report_hidden,
    say,
)
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import Connection
from bridge.exceptions import DatabaseError, ExitCode, PoisonHeaders
from bridge.headers import MESSAGE_ID_HEADER, parse_headers
from bridge.secrets import mask_secrets
from bridge.storage.archive import archive_address
from bridge.storage.ledger import ledger_address, ledger_databases, ledger_key
from bridge.storage.retries import RetryStore, retry_stores
from bridge.storage.tables import forwarder_tables
from bridge.storage.whereabouts import (
    find_in_archive,
    find_in_ledger,
    find_in_queue,
    find_in_retry,
)

# What each place is called, in the order lines are printed.
PLACES = ("queued", "retrying", "delivered", "failed", "archived")


@dataclass(frozen=True)
class Sighting:
    """One place the message (or one copy of it) is in."""

    place: str
    database: str
    table: str
    facts: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        facts = self.facts
        where = f"{self.table} (database '{self.database}')"
        if self.place == "queued":
            return f"queued     in forwarding queue {where}, forwarder '{facts['forwarder']}'"
        if self.place == "retrying":
            return (
                f"retrying   in retry storage {where} for {facts['destination']}: "
                f"{facts['attempts']} attempt(s), next attempt {facts['next_attempt_at'] or '-'}, "
                f"last error: {one_line(facts['last_error'], 200)}"
            )
        if self.place == "delivered":
            return (
                f"delivered  to {facts['destination']} in database '{self.database}' at "
                f"{facts['forwarded_at'] or '-'} (dedup ledger {self.table})"
            )
        if self.place == "failed":
            return (
                f"failed     in error queue {where}: reason {facts['reason'] or '-'} at "
                f"{facts['time_of_failure'] or '-'}, going to {facts['destination'] or '-'}"
            )
        return (
            f"archived   in {where} from error queue {facts['error_queue']} at "
            f"{facts['archived_at'] or '-'}; 'sfbridge errors restore --id {facts['id']}' "
            "puts it back"
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("message_id", metavar="MESSAGE_ID", help="NServiceBus.MessageId or row Id")
    parser.add_argument(
        "--scan",
        action="store_true",
        help="also search the forwarding queues' headers for the MessageId (reads every row "
        "of them; without it they are searched by row Id only)",
    )
    add_limit_argument(parser, "places")
    add_json_argument(parser)


def run(args: argparse.Namespace) -> int:
    config = load(args)
    wanted = row_id_text(args.message_id.strip())
    connections = Connections(config.databases)
    problems: list[DatabaseError] = []
    try:
        sightings = find_everywhere(config, connections, problems, wanted, scan=args.scan)
    finally:
        connections.close()
    shown = sightings[: args.limit] if args.limit else sightings
    if args.json:
        print_json([{"place": s.place, "database": s.database, "table": s.table, **s.facts}
                    for s in shown])  # fmt: skip
    elif not sightings:
        say(
            f"message {wanted}: found nowhere: not queued (by row Id"
            f"{'' if args.scan else '; --scan also reads their headers for a MessageId'}), "
            "not in retry storage, the dedup ledgers, the error queues or the error archive. "
            "Delivered to a destination without a ledger (two-phase or at-least-once), or "
            "taken by an endpoint, it leaves no trace the bridge can read."
        )
    else:
        say(f"message {wanted}: {len(sightings)} place(s)")
        for sighting in shown:
            say("  " + sighting.line())
    report_hidden(len(sightings) - len(shown), as_json=args.json, what="place(s)")
    code = ExitCode.OK if sightings else ExitCode.FAILED
    return finish("where", problems, code)


def find_everywhere(
    config: BridgeConfig,
    connections: Connections,
    problems: list[DatabaseError],
    wanted: str,
    *,
    scan: bool,
) -> list[Sighting]:
    """Every place `wanted` (a MessageId or row Id) is in, in the order of `PLACES`. A database
    that fails adds its error to `problems`."""
    lookups: list[tuple[str, Lookup]] = []
    for forwarder in config.forwarders:
        queue = forwarder_tables(config, forwarder).queue
        queued = partial(_queued, forwarder.database, forwarder.name, queue, wanted, scan)
        lookups.append((forwarder.database, queued))
    for store in retry_stores(config):
        lookups.append((store.database, partial(_retrying, store, wanted)))
    for error_queue in error_queues(config):
        lookups.append((error_queue.database, partial(_failed, error_queue, wanted)))
    for database in dict.fromkeys(f.database for f in config.forwarders):
        address = archive_address(config, database)
        lookups.append((database, partial(_archived, database, address, wanted)))
    found: list[Sighting] = []
    for database, look in lookups:
        found += _attempt(config, connections, problems, database, look)
    # The ledgers are keyed by MessageId: the one asked for, and those the rows found carry
    # (so a row Id asked for finds its message's deliveries too).
    message_ids = {wanted} | {s.facts["message_id"] for s in found if s.facts.get("message_id")}
    for database in ledger_databases(config):
        ledger = ledger_address(config, database)
        found += _attempt(
            config,
            connections,
            problems,
            database,
            partial(_delivered, database, ledger, message_ids),
        )
    return sorted(found, key=lambda s: PLACES.index(s.place))


# A lookup in one database: given its connection and dialect, what it found there.
Lookup = Callable[[Connection, Dialect], list[Sighting]]


def _attempt(
    config: BridgeConfig,
    connections: Connections,
    problems: list[DatabaseError],
    database: str,
    look: Lookup,
) -> list[Sighting]:
    dialect = dialect_for(config.databases[database].dialect)
    try:
        return look(connections.get(database), dialect)
    except DatabaseError as error:
        connections.discard(database)
        problems.append(error)
        return []


def _known_as(row_id: str, headers_text: str | None) -> set[str]:
    try:
        message_id = parse_headers(headers_text).get(MESSAGE_ID_HEADER)
    except PoisonHeaders:
        message_id = None
    return {row_id} if message_id is None else {row_id, row_id_text(message_id)}


def _queued(
    database: str,
    forwarder: str,
    queue: TableAddress,
    wanted: str,
    scan: bool,
    connection: Connection,
    dialect: Dialect,
) -> list[Sighting]:
    rows = find_in_queue(connection, dialect, queue, wanted, scan=scan) or []
    return [
        Sighting(
            "queued",
            database,
            dialect.grammar.render(queue),
            {"id": row.row_id, "forwarder": forwarder},
        )
        for row in rows
        if wanted in _known_as(row.row_id, row.headers_text)
    ]


def _retrying(
    store: RetryStore, wanted: str, connection: Connection, dialect: Dialect
) -> list[Sighting]:
    return [
        Sighting(
            "retrying",
            store.database,
            dialect.grammar.render(store.address),
            {
                "id": m.row_id,
                "message_id": m.message_id,
                "forwarder": m.forwarder,
                "destination": m.destination,
                "attempts": m.attempts,
                "next_attempt_at": _iso(m.next_attempt_at),
                "last_error": mask_secrets(m.last_error),
            },
        )
        for m in find_in_retry(connection, dialect, store.address, wanted) or []
    ]


def _failed(
    queue: ErrorQueue, wanted: str, connection: Connection, dialect: Dialect
) -> list[Sighting]:
    found = []
    for row in find_in_queue(connection, dialect, queue.address, wanted, scan=True) or []:
        message = describe(row.row_id, row.seq, row.headers_text, queue.owners)
        if wanted not in message.known_as:
            continue
        failed_at = message.failed_at
        facts = {
            "id": message.row_id,
            "message_id": message.message_id,
            "reason": message.reason,
            "forwarder": message.forwarder,
            "time_of_failure": failed_at.isoformat() if failed_at else None,
            "destination": queue.destination_of(message),
        }
        found.append(Sighting("failed", queue.database, queue.name, facts))
    return found


def _archived(
    database: str, address: TableAddress, wanted: str, connection: Connection, dialect: Dialect
) -> list[Sighting]:
    found = []
    for m in find_in_archive(connection, dialect, address, wanted) or []:
        facts = {
            "id": m.row_id,
            "message_id": m.message_id or m.header(MESSAGE_ID_HEADER),
            "error_queue": m.error_queue,
            "archived_at": _iso(m.archived_at),
        }
        found.append(Sighting("archived", database, dialect.grammar.render(address), facts))
    return found


def _delivered(
    database: str,
    ledger: TableAddress,
    message_ids: set[str],
    connection: Connection,
    dialect: Dialect,
) -> list[Sighting]:
    found = []
    for message_id in sorted(message_ids):
        for entry in find_in_ledger(connection, dialect, ledger, ledger_key(message_id)) or []:
            facts = {
                "message_id": message_id,
                "destination": entry.destination,
                "forwarded_at": _iso(entry.forwarded_at),
            }
            found.append(Sighting("delivered", database, dialect.grammar.render(ledger), facts))
    return found


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    aware = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return aware.isoformat(timespec="seconds")
