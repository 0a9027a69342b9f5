"""Finding one message in the tables it can be in (`sfbridge where`): the lookups.

Every lookup here is a point query: retry storage by its row Id and by the MessageId in its
headers (indexes `install` adds: `create_retry_lookup_index`; SQLite and SQL Server find a
MessageId that is not the row Id by a scan), the dedup ledger by its key's leading column, the
error archive by its indexed Id and MessageId columns, and a queue table by its Id. Only
`find_in_queue` with `needle` reads every row of a queue (NServiceBus's tables have no index on
a header, and the bridge adds none to tables endpoints own): `sfbridge where` does that for the
error queues always, and for forwarding queues only when asked (`--scan`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime

from bridge.addressing import TableAddress
from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.exceptions import TableNotFound
from bridge.storage.archive import ArchivedMessage, archived_from_row
from bridge.storage.retries import WaitingMessage, waiting_from_row


def as_uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def message_id_needle(message_id: str) -> str:
    """What a scan of a Headers column looks for: the MessageId as a JSON string (quoted,
    escaped), whatever spacing the writer put around the `:` before it. The rows it finds
    have their headers read to be sure it is their `NServiceBus.MessageId`."""
    return json.dumps(message_id)


def _encoded_id(dialect: Dialect, text: str) -> object:
    found = as_uuid(text)
    return None if found is None else dialect.encode_id(found)


def _read(connection: Connection, sql: str, params: tuple[object, ...]) -> list[dict[str, object]]:
    try:
        connection.begin_read()
        return connection.query_named(sql, params)
    finally:
        connection.rollback()


def find_in_retry(
    connection: Connection, dialect: Dialect, retry: TableAddress, wanted: str
) -> list[WaitingMessage] | None:
    """The rows of retry storage whose Id or `NServiceBus.MessageId` is `wanted` (each
    subscriber's copy of an event is a row); None when there is no retry storage yet."""
    try:
        rows = _read(
            connection,
            dialect.sql("retry_find", retry=retry),
            (_encoded_id(dialect, wanted), wanted, message_id_needle(wanted)),
        )
    except TableNotFound:
        return None
    found = [waiting_from_row(dialect, row) for row in rows]
    return [m for m in found if wanted in (m.row_id, m.message_id)]


@dataclass(frozen=True)
class LedgerEntry:
    destination: str
    forwarded_at: datetime | None


def find_in_ledger(
    connection: Connection, dialect: Dialect, ledger: TableAddress, key: str
) -> list[LedgerEntry] | None:
    """The deliveries the ledger recorded under `key` (`bridge.storage.ledger.ledger_key`):
    one per destination; None when there is no ledger there yet."""
    try:
        rows = _read(connection, dialect.sql("ledger_find", ledger=ledger), (key,))
    except TableNotFound:
        return None
    return [
        LedgerEntry(str(row["destination"]), dialect.decode_timestamp(row["forwarded_at"]))
        for row in rows
    ]


def find_in_archive(
    connection: Connection, dialect: Dialect, archive: TableAddress, wanted: str
) -> list[ArchivedMessage] | None:
    """The archived rows whose Id or MessageId is `wanted`; None without an archive."""
    as_id = str(as_uuid(wanted) or wanted)
    try:
        rows = _read(connection, dialect.sql("archive_find", archive=archive), (as_id, wanted))
    except TableNotFound:
        return None
    return [archived_from_row(dialect, row) for row in rows]


@dataclass(frozen=True)
class QueueRow:
    row_id: str
    headers_text: str | None
    seq: int


def find_in_queue(
    connection: Connection,
    dialect: Dialect,
    queue: TableAddress,
    wanted: str,
    *,
    scan: bool,
) -> list[QueueRow] | None:
    """The rows of a queue table whose Id is `wanted`, and with `scan` those whose headers
    hold it as `NServiceBus.MessageId` (a read of every row: see the module docstring). None
    when the table does not exist; [] without `scan` when `wanted` is no UUID."""
    encoded = _encoded_id(dialect, wanted)
    if scan:
        sql = dialect.sql("queue_find_headers", queue=queue)
        params: tuple[object, ...] = (encoded, message_id_needle(wanted))
    elif encoded is None:
        return []
    else:
        sql, params = dialect.sql("queue_find_id", queue=queue), (encoded,)
    try:
        rows = _read(connection, sql, params)
    except TableNotFound:
        return None
    return [
        QueueRow(_id_text(row["id"]), _text(row["headers"]), int(str(row["seq"]))) for row in rows
    ]


def _id_text(value: object) -> str:
    found = as_uuid(str(value))
    return str(value) if found is None else str(found)


def _text(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    return str(value)
