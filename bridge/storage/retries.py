"""Retry storage in the operator's hands (`sfbridge retries`): reading the messages waiting,
making chosen ones due at once, and moving chosen ones to their forwarder's error queue.

Retry storage is one table per forwarding database (`sfbridge_retry`), with a row per message
(or per subscriber's copy of an event) that a forwarder will try again. The daemon's claim takes
due rows with a destructive, uncommitted `DELETE` whose row locks skip what others hold; the
writes here lock the rows they change the same way and skip the rows a batch holds, so a row
never has two owners: a message a daemon is delivering right now is left to it (and reported
as in flight).

Moving to the error queue runs one transaction per chunk in the forwarding database: the rows
are taken from retry storage and inserted into the error queue, with the failure headers the
daemon writes for a message it gives up on, and committed; a crash at any point leaves each
message in exactly one of the two tables.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from bridge.addressing import TableAddress
from bridge.config.model import BridgeConfig
from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.exceptions import PoisonHeaders, TableNotFound
from bridge.headers import MESSAGE_ID_HEADER, parse_headers, serialize_headers, with_failure_headers
from bridge.processing_host import ProcessingHost, processing_host
from bridge.storage.tables import ForwarderTables, forwarder_tables, owned_table

# Writes rows (Id, Expires, Headers, Body) into a queue in the open transaction: the data
# path's queue writer (`bridge.forwarding.writes`), which knows each table's shape.
RowWriter = Callable[[Connection, TableAddress, Sequence[Sequence[object]]], None]

# Rows per transaction (and per multi-row statement) when making due or failing.
CHUNK_SIZE = 100
# A message `fail` moves is counted as the daemon counts a claim that ends in the error queue
# (`bridge.forwarding.settle`'s CLAIMED and ERRORS), so `status` shows it among the
# forwarder's sent-to-error-queue and `spark reconcile` still finds claims equal to outcomes;
# in a counters slot of its own (workers count from 0, the in-doubt sweep in -1).
OPERATOR_COUNTS = ("claimed", "sent-to-error-queue")
OPERATOR_COUNTER_SLOT = -2
# Rows per read of retry storage.
PAGE_SIZE = 500
# The reason written into `$.sfbridge.failure-reason` for a message an operator gave up on.
FAILED_BY_OPERATOR = "failed-by-operator"
FAILED_BY_OPERATOR_TYPE = "SFBridge.FailedByOperator"


def store_retry(
    connection: Connection,
    dialect: Dialect,
    retry: TableAddress,
    row_id: uuid.UUID,
    forwarder: str,
    destination: tuple[str, str | None],
    message: tuple[datetime | None, str, bytes | None],
    attempts: int,
    first_failure_at: datetime,
    due: datetime,
    error: str,
) -> None:
    """Insert one row into the retry storage `retry`, in `connection`'s transaction:
    `destination` is (what it is bound for, the database it waits for or None), `message` is
    (Expires, the Headers text, the body). Raises BridgeTableMissing for a missing table and
    the DatabaseError family."""
    expires, headers_text, body = message
    with owned_table("retry storage", dialect.grammar.render(retry)):
        connection.execute(
            dialect.sql("retry_store", retry=retry),
            (
                dialect.encode_id(row_id),
                forwarder,
                destination[0],
                destination[1],
                dialect.encode_timestamp(expires),
                headers_text,
                body,
                attempts,
                dialect.encode_timestamp(first_failure_at),
                dialect.encode_timestamp(due),
                error,
            ),
        )


@dataclass(frozen=True)
class WaitingMessage:
    """One row of retry storage, as the tools show it.

    `message_id` is the message's `NServiceBus.MessageId`, or the row's Id when it has none
    (or its headers cannot be read); `row_id` the row's Id (canonical UUID text); `seq` the
    row's key, by which the writes choose it.
    """

    seq: int
    row_id: str
    message_id: str
    forwarder: str
    destination: str
    destination_database: str | None
    attempts: int
    first_failure_at: datetime | None
    next_attempt_at: datetime | None
    last_error: str


@dataclass(frozen=True)
class RetryStore:
    """The retry storage table of one forwarding database, with the forwarders (by name) whose
    rows it holds and each one's tables (for the error queue and the failed-in queue)."""

    database: str
    address: TableAddress
    forwarders: dict[str, ForwarderTables]

    def describe(self, dialect: Dialect) -> str:
        return f"retry storage {dialect.grammar.render(self.address)} in database '{self.database}'"


def retry_stores(config: BridgeConfig) -> list[RetryStore]:
    """Every forwarding database's retry storage, in config order, each table once."""
    found: dict[str, RetryStore] = {}
    for forwarder in config.forwarders:
        tables = forwarder_tables(config, forwarder)
        store = found.setdefault(
            forwarder.database, RetryStore(forwarder.database, tables.retry, {})
        )
        store.forwarders[forwarder.name] = tables
    return list(found.values())


def read_waiting(
    connection: Connection, dialect: Dialect, store: RetryStore
) -> list[WaitingMessage] | None:
    """Every row of retry storage in key order, read without taking or locking any; None when
    the table does not exist yet. Raises the DatabaseError family."""
    statement = dialect.sql("retry_list_page", retry=store.address)
    messages: list[WaitingMessage] = []
    after = 0
    try:
        connection.begin_read()
        while True:
            rows = connection.query_named(statement, (after, PAGE_SIZE))
            for row in rows:
                messages.append(_waiting(dialect, row))
                after = max(after, messages[-1].seq)
            if len(rows) < PAGE_SIZE:
                return messages
    except TableNotFound:
        return None
    finally:
        connection.rollback()


def waiting_from_row(dialect: Dialect, row: dict[str, object]) -> WaitingMessage:
    """One row of `retry_list_page` or `retry_find` as a WaitingMessage."""
    return _waiting(dialect, row)


def _waiting(dialect: Dialect, row: dict[str, object]) -> WaitingMessage:
    row_id = _id_text(row["id"])
    try:
        message_id = parse_headers(_text(row["headers"])).get(MESSAGE_ID_HEADER) or row_id
    except PoisonHeaders:
        message_id = row_id
    return WaitingMessage(
        seq=int(str(row["seq"])),
        row_id=row_id,
        message_id=str(message_id),
        forwarder=str(row["forwarder"]),
        destination=str(row["destination"]),
        destination_database=(
            None if row["destination_database"] is None else str(row["destination_database"])
        ),
        attempts=int(str(row["attempts"])),
        first_failure_at=dialect.decode_timestamp(row["first_failure_at"]),
        next_attempt_at=dialect.decode_timestamp(row["next_attempt_at"]),
        last_error=_text(row["last_error"]) or "",
    )


def _id_text(value: object) -> str:
    if isinstance(value, uuid.UUID):
        return str(value)
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        return str(value)


def _text(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _chunks(messages: Sequence[WaitingMessage], size: int) -> list[Sequence[WaitingMessage]]:
    return [messages[start : start + size] for start in range(0, len(messages), size)]


def make_due(
    connection: Connection,
    dialect: Dialect,
    store: RetryStore,
    messages: Sequence[WaitingMessage],
    *,
    chunk_size: int = CHUNK_SIZE,
) -> int:
    """Make `messages` due at once, one transaction per chunk; returns how many rows changed
    (fewer when a batch held some: those are being tried right now). Raises the DatabaseError
    family; the chunks before the failing one stay committed."""
    changed = 0
    for chunk in _chunks(messages, chunk_size):
        try:
            connection.begin()
            with owned_table("retry storage", dialect.grammar.render(store.address)):
                changed += connection.execute(
                    dialect.sql("retry_due_now_many", rows=len(chunk), retry=store.address),
                    [message.seq for message in chunk],
                )
            connection.commit()
        except BaseException:
            connection.rollback()
            raise
    return changed


@dataclass(frozen=True)
class Operator:
    """Who failed the messages, for their exception text: OS user and host."""

    user: str
    host: str


def fail_messages(
    connection: Connection,
    dialect: Dialect,
    store: RetryStore,
    messages: Sequence[WaitingMessage],
    *,
    operator: Operator,
    now: datetime,
    write_rows: RowWriter,
    chunk_size: int = CHUNK_SIZE,
    on_chunk: Callable[[str, int], None] | None = None,
    in_chunk: Callable[[Connection, int], None] | None = None,
) -> int:
    """Move `messages` into their forwarders' error queues with the failure headers (reason
    `failed-by-operator`), one transaction per chunk of one forwarder; returns how many moved
    (fewer when a batch held some meanwhile). `in_chunk(connection, moved)` runs in each
    chunk's transaction before its commit (the audit record counts what it moved), and
    `on_chunk(forwarder, moved)` after it. Raises BridgeTableMissing for a missing error
    queue and the DatabaseError family; the chunk in hand is then rolled back (the chunks
    before it are committed)."""
    moved = 0
    by_forwarder: dict[str, list[WaitingMessage]] = {}
    for message in messages:
        by_forwarder.setdefault(message.forwarder, []).append(message)
    for forwarder, chosen in by_forwarder.items():
        tables = store.forwarders[forwarder]
        host = processing_host(forwarder)
        for chunk in _chunks(chosen, chunk_size):
            count = _fail_chunk(
                connection, dialect, store, tables, chunk, write_rows, host, operator, now, in_chunk
            )
            moved += count
            if on_chunk is not None:
                on_chunk(forwarder, count)
    return moved


def _fail_chunk(
    connection: Connection,
    dialect: Dialect,
    store: RetryStore,
    tables: ForwarderTables,
    chunk: Sequence[WaitingMessage],
    write_rows: RowWriter,
    host: ProcessingHost,
    operator: Operator,
    now: datetime,
    in_chunk: Callable[[Connection, int], None] | None = None,
) -> int:
    try:
        connection.begin()
        with owned_table("retry storage", dialect.grammar.render(store.address)):
            rows = connection.query_named(
                dialect.sql("retry_take_many", rows=len(chunk), retry=store.address),
                [message.seq for message in chunk],
            )
        rows.sort(key=lambda row: int(str(row["seq"])))
        # As the daemon writes the error queue: no Expires (a failed message never expires).
        failed = [
            (
                dialect.encode_id(dialect.decode_id(row["id"])),
                None,
                _failed_headers(row, tables, host, operator, now),
                None if row["body"] is None else bytes(row["body"]),
            )
            for row in rows
        ]
        if failed:
            error_queue = tables.error_queue
            with owned_table("error queue", dialect.grammar.render(error_queue)):
                write_rows(connection, error_queue, failed)
            # Counted with the move, as the daemon counts a claim that ends in the error queue.
            with owned_table("counters", dialect.grammar.render(tables.counters)):
                for counter in OPERATOR_COUNTS:
                    connection.execute(
                        dialect.sql("counters_add", counters=tables.counters),
                        (chunk[0].forwarder, counter, OPERATOR_COUNTER_SLOT, len(rows)),
                    )
            if in_chunk is not None:
                in_chunk(connection, len(rows))
        connection.commit()
    except BaseException:
        connection.rollback()
        raise
    return len(rows)


def _failed_headers(
    row: dict[str, object],
    tables: ForwarderTables,
    host: ProcessingHost,
    operator: Operator,
    now: datetime,
) -> str:
    """The row's headers as the daemon writes a message it gives up on; a row whose headers
    cannot be read goes as it is, as the daemon moves poison."""
    text = _text(row["headers"]) or ""
    try:
        headers = parse_headers(text)
    except PoisonHeaders:
        return text
    attempts = int(str(row["attempts"]))
    reason = (
        f"failed by {operator.user} on {operator.host} with 'sfbridge retries fail' after "
        f"{attempts} attempt(s) to {row['destination']}; last error: {_text(row['last_error'])}"
    )
    return serialize_headers(
        with_failure_headers(
            headers,
            failed_queue=tables.failed_queue,
            exception_type=FAILED_BY_OPERATOR_TYPE,
            message=reason,
            reason=FAILED_BY_OPERATOR,
            failed_at=now,
            processed_by=host,
            row_id=_id_text(row["id"]),
            attempts=attempts,
        )
    )
