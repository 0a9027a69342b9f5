"""Claiming a batch: the destructive, uncommitted read that starts every source transaction.

Rows are deleted from the forwarding queue (or from retry storage, for due retries) with
`DELETE ... RETURNING` / `OUTPUT` and row locks that skip what other workers hold, so
competing workers and daemons never take the same row. Until the source transaction commits
they are still there for every other reader; a rollback puts them back.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from bridge.addressing import TableAddress
from bridge.config.model import ForwarderConfig, RetryConfig
from bridge.dialects import Dialect
from bridge.drivers import Connection, Unreadable
from bridge.drivers.base import Row
from bridge.exceptions import ValueNotConvertible
from bridge.headers import with_legacy_reply_to
from bridge.messages import ClaimedMessage, Source
from bridge.storage.tables import ForwarderTables, owned_table

# The columns every claim statement returns, by name; retry storage adds its bookkeeping.
# Queues with the SQL Server transport's legacy columns also return `legacy_reply_to`.
QUEUE_COLUMNS = ("id", "expired", "expires", "headers", "body", "seq", "claimed_size")
RETRY_COLUMNS = (*QUEUE_COLUMNS, "attempts", "first_failure_at", "last_error")


def claim_limit(forwarder: ForwarderConfig, recent_sizes: Sequence[int]) -> int:
    """How many rows the next claim should lock, given the sizes (body + headers, bytes) of
    the messages the last one took: about as many as `forwarder.batch_bytes` will admit, with
    a quarter to spare, between 1 and `forwarder.batch_size`.

    Why: a claim locks its candidate rows before the byte bound picks the prefix it takes, and
    reads each candidate's size; with large messages, candidates far past the bound would be
    locked (held from other workers until the batch commits) and read for nothing.
    """
    if not recent_sizes:
        return forwarder.batch_size
    average = max(1.0, sum(recent_sizes) / len(recent_sizes))
    admitted = int(forwarder.batch_bytes / average * 1.25) + 1
    return max(1, min(forwarder.batch_size, admitted))


def claim_batch(
    connection: Connection,
    dialect: Dialect,
    tables: ForwarderTables,
    forwarder: ForwarderConfig,
    source: Source,
    *,
    now: datetime,
    policy: RetryConfig,
    waiting_databases: Sequence[str] = (),
    seq_range: tuple[int, int] | None = None,
    limit: int | None = None,
) -> list[ClaimedMessage]:
    """Delete (uncommitted) up to a batch of rows, `limit` (default `forwarder.batch_size`) of
    them at most and no more than `forwarder.batch_bytes` of bodies and headers (a first row
    larger than that comes alone); returns them in queue order. See `claim_limit` for a
    `limit` that locks no more rows than the byte bound will take.

    From retry storage only due messages are claimed, and not those for `waiting_databases`
    (databases waiting out an outage) unless they waited longer than `policy.max_wait` or
    expired meanwhile. With `seq_range` (first, last), only queue rows whose sequence column
    lies in it are claimed (a bulk drain's share of the queue). Raises BridgeTableMissing when
    the table is missing, and the DatabaseError family.
    """
    batch_size = forwarder.batch_size if limit is None else limit
    tables_: dict[str, TableAddress]
    if source == "queue" and seq_range is not None:
        name, tables_ = "receive_range", {"queue": tables.queue}
        parameters: tuple[object, ...] = (*seq_range, batch_size, forwarder.batch_bytes)
        table = ("forwarding queue", tables.queue_canonical)
    elif source == "queue":
        name, tables_ = "receive_batch", {"queue": tables.queue}
        parameters = (batch_size, forwarder.batch_bytes)
        table = ("forwarding queue", tables.queue_canonical)
    else:
        name, tables_ = "retry_claim_due", {"retry": tables.retry}
        parameters = (
            forwarder.name,
            dialect.encode_timestamp(now),
            "|" + "|".join(waiting_databases) + "|" if waiting_databases else "",
            dialect.encode_timestamp(now - timedelta(seconds=policy.max_wait)),
            batch_size,
            forwarder.batch_bytes,
        )
        table = ("retry storage", dialect.grammar.render(tables.retry))
    statement = dialect.sql(name, None, **tables_)
    with owned_table(*table):
        try:
            names, rows = connection.query_columns(statement, parameters)
            raw_text = False
        except ValueNotConvertible:
            # The driver could not hand back some value, and with it the whole result (the
            # claim is the transaction's first statement, so nothing else is undone): the
            # same rows again, their text as the bytes the table stores, decoded here.
            if f"{name}_raw" not in dialect.statements:
                raise
            connection.rollback()
            connection.begin()
            names, rows = connection.query_columns(
                dialect.sql(f"{name}_raw", None, **tables_), parameters
            )
            raw_text = True
    if not rows:
        return []  # psqlODBC names no columns for a RETURNING that returned no row
    decode = row_decoder(dialect, names, raw_text=raw_text)
    messages = [decode(row) for row in rows]
    # RETURNING gives no order guarantee; FIFO is restored here.
    messages.sort(key=lambda message: message.order)
    return messages


def decode_row(dialect: Dialect, row: Mapping[str, Any]) -> ClaimedMessage:
    """A claimed row, by column name (see QUEUE_COLUMNS and RETRY_COLUMNS)."""
    return row_decoder(dialect, list(row))(tuple(row.values()))


def row_decoder(
    dialect: Dialect, names: Sequence[str], *, raw_text: bool = False
) -> Callable[[Row], ClaimedMessage]:
    """Decodes claimed rows of a result with these column names (see QUEUE_COLUMNS and
    RETRY_COLUMNS), each by position: a claim decodes up to thousands of rows, and looking
    each column up by name in a dict made for every row costs more than the rest.

    A row that cannot be read as a message (a value the driver gave up on, `Unreadable`; a
    value of a type or range the transport never writes; text that is not valid in its
    encoding) never fails the others: it becomes an unreadable message (`RowReader`), which
    classify sends to the error queue with the reason. `raw_text`: text columns come as the
    bytes the table stores (the `*_raw` claims), in `dialect.raw_text_encoding`.
    """
    at = {name: index for index, name in enumerate(names)}
    id_, expired, expires, headers, body, seq = (
        at[name] for name in ("id", "expired", "expires", "headers", "body", "seq")
    )
    size = at.get("claimed_size")
    attempts, first_failure_at, last_error = (
        at.get(name) for name in ("attempts", "first_failure_at", "last_error")
    )
    # Timestamps outside the years 1 to 9999 come as NULL with their text here (PostgreSQL).
    out_of_range = [index for name, index in at.items() if name.endswith("_out_of_range")]
    legacy_reply_to = at.get("legacy_reply_to")
    decode_id, decode_timestamp = dialect.decode_id, dialect.decode_timestamp
    slow = RowReader(dialect, at, raw_text=raw_text)

    # What a claimed row's values usually are (psycopg, binary results), so that the common
    # row is taken as it is, without a call per value: a claim decodes thousands of rows.
    uuid_type, int_type, bytes_type = uuid.UUID, int, bytes

    def decode(row: Row) -> ClaimedMessage:
        headers_text = row[headers]
        if (
            raw_text
            or type(headers_text) is not str  # NULL, bytes (SQL_ASCII) or Unreadable
            or (out_of_range and any(row[index] is not None for index in out_of_range))
        ):
            return slow.read(row)
        try:
            if legacy_reply_to is not None and row[legacy_reply_to]:
                # Written by a transport before 7.0; its receivers let the column win over the
                # header, and the bridge writes the column NULL, so the header has to carry it.
                headers_text = with_legacy_reply_to(headers_text, str(row[legacy_reply_to]))
            row_id = row[id_]
            expires_at = row[expires]
            body_value = row[body]
            order = row[seq]
            return ClaimedMessage(
                row_id if type(row_id) is uuid_type else decode_id(row_id),
                bool(row[expired]),
                None if expires_at is None else decode_timestamp(expires_at),
                headers_text,
                body_value
                if body_value is None or type(body_value) is bytes_type
                else _as_bytes(body_value),
                order if type(order) is int_type else _as_int(order),
                _as_int(row[attempts]) if attempts is not None else 0,
                # Retry storage's bookkeeping, which queue rows have not.
                None if first_failure_at is None else decode_timestamp(row[first_failure_at]),
                None if last_error is None else _as_text(row[last_error]),
                None,  # readable: nothing to say why not
                # The claim's own measure of the row; 0 where a statement does not return it.
                int(row[size] or 0) if size is not None else 0,
            )
        except (ValueError, TypeError, OverflowError):
            return slow.read(row)

    return decode


# Column names as people know them from the transport's table, for reasons.
_TITLES = {
    "id": "Id",
    "expires": "Expires",
    "headers": "Headers",
    "body": "Body",
    "seq": "the sequence column",
    "attempts": "attempts",
    "first_failure_at": "first_failure_at",
    "last_error": "last_error",
    "legacy_reply_to": "ReplyToAddress",
}


class RowReader:
    """Reads a claimed row column by column, keeping every value that can be read and saying
    what cannot: the slow path of `row_decoder`, for rows the fast one refuses (and for all
    rows of a raw claim, whose text it decodes).

    What an unreadable row keeps, for the error queue: its Id (a new one when the Id itself
    cannot be read), its headers text (invalid bytes replaced by U+FFFD when the text is not
    valid in its encoding), its body byte for byte (text in a SQLite Body column as UTF-8).
    Expires is not kept (the error queue's Expires is NULL, as for every failed message); an
    out-of-range value is named in the reason.
    """

    def __init__(self, dialect: Dialect, at: Mapping[str, int], *, raw_text: bool) -> None:
        self._dialect = dialect
        self._at = at
        self._encoding = dialect.raw_text_encoding if raw_text else "utf-8"

    def read(self, row: Row) -> ClaimedMessage:
        problems: list[str] = []
        value = self._value_reader(row, problems)
        row_id = value("id", self._dialect.decode_id)
        if row_id is None:
            row_id = uuid.uuid4()  # the error queue needs an Id its table can hold
            problems[-1] += " (the error queue gets a new Id)"
        expires = value("expires", self._dialect.decode_timestamp, nullable=True)
        headers_text = value("headers", self._text)
        body = value("body", _raw_bytes, nullable=True)
        order = value("seq", _as_int)
        first_failure_at = value("first_failure_at", self._dialect.decode_timestamp)
        reply_to = value("legacy_reply_to", self._text, nullable=True)
        if reply_to and headers_text is not None and not problems:
            headers_text = with_legacy_reply_to(headers_text, reply_to)
        size = self._at.get("claimed_size")
        attempts = value("attempts", _as_int)
        return ClaimedMessage(
            row_id=row_id,
            expired=bool(row[self._at["expired"]]) if not problems else False,
            expires=None if problems else expires,
            headers_text=headers_text,
            body=body,
            # A sequence that cannot be read (never seen) sorts last rather than failing.
            order=order if order is not None else 2**63,
            attempts=attempts or 0,
            first_failure_at=first_failure_at,
            last_error=value("last_error", self._text, nullable=True),
            unreadable="; ".join(problems) or None,
            claimed_size=_as_int(row[size]) or 0 if size is not None else 0,
        )

    def _value_reader(self, row: Row, problems: list[str]) -> Callable[..., Any]:
        at = self._at

        def value(name: str, convert: Callable[[Any], Any], *, nullable: bool = False) -> Any:
            index = at.get(name)
            if index is None:
                return None
            title = _TITLES.get(name, name)
            out_of_range = at.get(f"{name}_out_of_range")
            if out_of_range is not None and row[out_of_range] is not None:
                problems.append(
                    f"{title} holds {_shown(row[out_of_range])}, outside the years 1 to 9999 a "
                    ".NET DateTime (and so NServiceBus) can write"
                )
                return None
            raw = row[index]
            if isinstance(raw, Unreadable):
                problems.append(f"{title} cannot be read by the database driver ({raw.reason})")
                return self._salvage(name, raw.raw)
            if raw is None:
                if not nullable:
                    problems.append(f"{title} is NULL, which the transport never writes")
                return None
            try:
                return convert(raw)
            except (ValueError, TypeError, OverflowError) as error:
                problems.append(f"{title} holds {_shown(raw)}, which is not valid ({error})")
                return self._salvage(name, raw)

        return value

    def _text(self, value: object) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, (bytes, bytearray, memoryview)):
            # Unpaired surrogates are kept: .NET strings may hold them, and so may headers.
            errors = "surrogatepass" if self._encoding.startswith("utf-16") else "strict"
            try:
                return bytes(value).decode(self._encoding, errors)
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"not valid {self._encoding.upper()}: {error.reason} at byte {error.start}"
                ) from None
        raise TypeError(f"text expected, got {type(value).__name__}")

    def _salvage(self, name: str, raw: object) -> Any:
        """What of an unreadable value is worth keeping for the error queue."""
        if name == "body":
            return None if raw is None else _raw_bytes(raw)
        if name == "headers" and raw is not None:
            if isinstance(raw, str):
                return raw
            if isinstance(raw, (bytes, bytearray, memoryview)):
                return bytes(raw).decode(self._encoding, "replace")
            return str(raw)
        return None


def _shown(value: object) -> str:
    """A value for a reason: short, and quoted as Python writes it (so it is inert)."""
    text = repr(bytes(value) if isinstance(value, (bytearray, memoryview)) else value)
    return text if len(text) <= 80 else text[:77] + "..."


def _as_int(value: object) -> int:
    """An integer column's value (drivers give int, some Decimal); None, bytes and markers are
    refused rather than read as a number."""
    if value is None or isinstance(value, (bool, bytes, bytearray, memoryview, Unreadable)):
        raise TypeError(f"integer expected, got {type(value).__name__}")
    return int(value)  # type: ignore[call-overload]


def _as_text(value: object) -> str:
    if isinstance(value, str):
        return value
    raise TypeError(f"text expected, got {type(value).__name__}")


def _raw_bytes(value: object) -> bytes:
    """Whatever an untyped column held, as bytes, to move it to the error queue as it was."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return str(value).encode("utf-8")


def _as_bytes(value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"unexpected body type {type(value).__name__}")
