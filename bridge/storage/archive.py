"""The error archive: failed messages an operator put out of the way (`sfbridge errors
archive`), kept restorable for `error_archive.retention`, then deleted by the daemon's upkeep.

One table per forwarding database (`sfbridge_error_archive`), beside the error queues it holds
messages of. A row keeps everything needed to put the message back as it was (its Id,
Expires, Headers and Body) and which error queue it came from; `message_id` and `id` are
indexed for `sfbridge where`. Archiving and restoring each move rows in one transaction per
batch in that database: taken from one table with a destructive DELETE and written into the
other before the commit, so a crash leaves every message in exactly one of them.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from bridge.addressing import TableAddress
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import Connection
from bridge.exceptions import DatabaseError, DatabaseUnavailable, PoisonHeaders, TableNotFound
from bridge.headers import MESSAGE_ID_HEADER, parse_headers
from bridge.messages import utcnow
from bridge.outages import OutageTracker
from bridge.storage.tables import forwarder_tables, owned_table

log = logging.getLogger(__name__)

PAGE_SIZE = 500
# The archive's message_id column holds this many characters; a longer MessageId is found by
# the row Id only.
MAX_MESSAGE_ID = 200


@dataclass(frozen=True)
class ArchivedMessage:
    """One archived row: `row_id` the message's Id (canonical UUID text where it is one),
    `error_queue` the rendered name of the error queue it came from."""

    seq: int
    row_id: str
    message_id: str | None
    error_queue: str
    archived_at: datetime | None
    headers_text: str | None

    def header(self, name: str) -> str | None:
        try:
            return parse_headers(self.headers_text).get(name)
        except PoisonHeaders:
            return None


@dataclass(frozen=True)
class ArchiveRow:
    """A message to archive, as taken from its error queue."""

    row_id: str
    expires: datetime | None
    headers_text: str
    body: bytes | None


def archive_address(config: BridgeConfig, database: str) -> TableAddress:
    forwarder = next(f for f in config.forwarders if f.database == database)
    return forwarder_tables(config, forwarder).archive


def message_id_of(headers_text: str | None) -> str | None:
    """The `NServiceBus.MessageId` to index an archived row by, None when there is none or it
    is too long for the column."""
    try:
        value = parse_headers(headers_text).get(MESSAGE_ID_HEADER)
    except PoisonHeaders:
        return None
    return value if value is not None and len(value) <= MAX_MESSAGE_ID else None


def store_archived(
    connection: Connection,
    dialect: Dialect,
    archive: TableAddress,
    error_queue: str,
    rows: Sequence[ArchiveRow],
) -> None:
    """Insert `rows` into the archive in the open transaction. Raises BridgeTableMissing for a
    missing archive and the DatabaseError family."""
    now = utcnow()
    statement = dialect.sql("archive_store", archive=archive)
    with owned_table("error archive", dialect.grammar.render(archive)):
        for row in rows:
            connection.execute(
                statement,
                (
                    row.row_id,
                    message_id_of(row.headers_text),
                    error_queue,
                    dialect.encode_timestamp(now),
                    dialect.encode_timestamp(row.expires),
                    row.headers_text,
                    row.body,
                ),
            )


def read_archived(
    connection: Connection, dialect: Dialect, archive: TableAddress
) -> list[ArchivedMessage] | None:
    """Every archived row in key order, without taking any; None when there is no archive
    yet. Raises the DatabaseError family."""
    statement = dialect.sql("archive_page", archive=archive)
    found: list[ArchivedMessage] = []
    after = 0
    try:
        connection.begin_read()
        while True:
            rows = connection.query_named(statement, (after, PAGE_SIZE))
            found += [archived_from_row(dialect, row) for row in rows]
            if found:
                after = found[-1].seq
            if len(rows) < PAGE_SIZE:
                return found
    except TableNotFound:
        return None
    finally:
        connection.rollback()


def archived_from_row(dialect: Dialect, row: dict[str, object]) -> ArchivedMessage:
    return ArchivedMessage(
        seq=int(str(row["seq"])),
        row_id=str(row["id"]),
        message_id=None if row["message_id"] is None else str(row["message_id"]),
        error_queue=str(row["error_queue"]),
        archived_at=dialect.decode_timestamp(row["archived_at"]),
        headers_text=_text(row["headers"]),
    )


@dataclass(frozen=True)
class TakenRow:
    """An archived row taken back, to be written into its error queue."""

    row_id: str
    error_queue: str
    expires: datetime | None
    headers_text: str
    body: bytes | None

    def queue_row(self, dialect: Dialect) -> list[object]:
        """(Id, Expires, Headers, Body) for the queue writer."""
        try:
            row_id: object = dialect.encode_id(uuid.UUID(self.row_id))
        except ValueError:
            row_id = self.row_id
        return [row_id, dialect.encode_timestamp(self.expires), self.headers_text, self.body]


def take_archived(
    connection: Connection,
    dialect: Dialect,
    archive: TableAddress,
    seqs: Sequence[int],
) -> list[TakenRow]:
    """Delete the rows `seqs` from the archive in the open transaction; returns those taken
    (a row another transaction took meanwhile is not)."""
    with owned_table("error archive", dialect.grammar.render(archive)):
        rows = connection.query_named(
            dialect.sql("archive_take_many", rows=len(seqs), archive=archive), list(seqs)
        )
    return [
        TakenRow(
            row_id=str(row["id"]),
            error_queue=str(row["error_queue"]),
            expires=dialect.decode_timestamp(row["expires"]),
            headers_text=_text(row["headers"]) or "",
            body=None if row["body"] is None else bytes(row["body"]),
        )
        for row in rows
    ]


def expire_archives(
    config: BridgeConfig,
    outages: OutageTracker | None = None,
    *,
    now: Callable[[], datetime] = utcnow,
) -> int:
    """Delete archived messages older than `error_archive.retention` in every forwarding
    database. Returns rows deleted; logs failures (a missing archive has nothing to expire)."""
    cutoff = now() - timedelta(seconds=config.error_archive.retention)
    connections = Connections(config.databases)
    deleted = 0
    try:
        for database in dict.fromkeys(f.database for f in config.forwarders):
            if outages is not None and outages.in_trouble(database):
                continue
            dialect = dialect_for(config.databases[database].dialect)
            archive = archive_address(config, database)
            try:
                connection = connections.get(database)
                connection.begin()
                count = connection.execute(
                    dialect.sql("archive_expire", archive=archive),
                    (dialect.encode_timestamp(cutoff),),
                )
                connection.commit()
            except TableNotFound:
                connections.discard(database)
                continue
            except DatabaseUnavailable as error:
                connections.discard(database)
                log.debug("error archive expiry skipped for database '%s': %s", database, error)
                continue
            except DatabaseError as error:
                connections.discard(database)
                log.warning("error archive expiry skipped for database '%s': %s", database, error)
                continue
            if count:
                log.info(
                    "deleted %d archived message(s) older than the retention from database '%s'",
                    count,
                    database,
                )
            deleted += count
    finally:
        connections.close()
    return deleted


def _text(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    return json.dumps(value) if isinstance(value, dict) else str(value)
