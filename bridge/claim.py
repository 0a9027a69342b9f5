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

from bridge.config.model import ForwarderConfig, RetryConfig
from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.drivers.base import Row
from bridge.headers import with_legacy_reply_to
from bridge.messages import ClaimedMessage, Source
from bridge.tables import ForwarderTables, owned_table

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
    if source == "queue" and seq_range is not None:
        statement = dialect.sql("receive_range", queue=tables.queue)
        parameters: tuple[object, ...] = (*seq_range, batch_size, forwarder.batch_bytes)
        table = ("forwarding queue", tables.queue_canonical)
    elif source == "queue":
        statement = dialect.sql("receive_batch", queue=tables.queue)
        parameters = (batch_size, forwarder.batch_bytes)
        table = ("forwarding queue", tables.queue_canonical)
    else:
        statement = dialect.sql("retry_claim_due", retry=tables.retry)
        parameters = (
            forwarder.name,
            dialect.encode_timestamp(now),
            "|" + "|".join(waiting_databases) + "|" if waiting_databases else "",
            dialect.encode_timestamp(now - timedelta(seconds=policy.max_wait)),
            batch_size,
            forwarder.batch_bytes,
        )
        table = ("retry storage", dialect.grammar.render(tables.retry))
    with owned_table(*table):
        names, rows = connection.query_columns(statement, parameters)
    if not rows:
        return []  # psqlODBC names no columns for a RETURNING that returned no row
    decode = row_decoder(dialect, names)
    messages = [_decode_or_poison(dialect, decode, names, row) for row in rows]
    # RETURNING gives no order guarantee; FIFO is restored here.
    messages.sort(key=lambda message: message.order)
    return messages


def decode_row(dialect: Dialect, row: Mapping[str, Any]) -> ClaimedMessage:
    """A claimed row, by column name (see QUEUE_COLUMNS and RETRY_COLUMNS)."""
    return row_decoder(dialect, list(row))(tuple(row.values()))


def row_decoder(dialect: Dialect, names: Sequence[str]) -> Callable[[Row], ClaimedMessage]:
    """Decodes claimed rows of a result with these column names (see QUEUE_COLUMNS and
    RETRY_COLUMNS), each by position: a claim decodes up to thousands of rows, and looking
    each column up by name in a dict made for every row costs more than the rest."""
    at = {name: index for index, name in enumerate(names)}
    id_, expired, expires, headers, body, seq = (
        at[name] for name in ("id", "expired", "expires", "headers", "body", "seq")
    )
    size = at.get("claimed_size")
    attempts, first_failure_at, last_error = (
        at.get(name) for name in ("attempts", "first_failure_at", "last_error")
    )
    legacy_reply_to = at.get("legacy_reply_to")
    decode_id, decode_timestamp = dialect.decode_id, dialect.decode_timestamp

    def decode(row: Row) -> ClaimedMessage:
        headers_text = row[headers]
        if legacy_reply_to is not None and row[legacy_reply_to]:
            # Written by a transport before 7.0; its receivers let the column win over the
            # header, and the bridge writes the column NULL, so the header has to carry it on.
            headers_text = with_legacy_reply_to(headers_text, str(row[legacy_reply_to]))
        return ClaimedMessage(
            row_id=decode_id(row[id_]),
            expired=bool(row[expired]),
            expires=decode_timestamp(row[expires]),
            headers_text=headers_text,
            body=_as_bytes(row[body]),
            order=int(row[seq]),
            attempts=int(row[attempts]) if attempts is not None else 0,
            # Retry storage's bookkeeping, which queue rows have not.
            first_failure_at=None
            if first_failure_at is None
            else decode_timestamp(row[first_failure_at]),
            last_error=None if last_error is None else row[last_error],
            # The claim's own measure of the row; 0 where a statement does not return it.
            claimed_size=int(row[size] or 0) if size is not None else 0,
        )

    return decode


def _claimed_size(row: Mapping[str, Any]) -> int:
    """The claim's own measure of the row; 0 where a statement does not return it."""
    value = row.get("claimed_size")
    return int(value) if value is not None else 0


def _decode_or_poison(
    dialect: Dialect,
    decode: Callable[[Row], ClaimedMessage],
    names: Sequence[str],
    values: Row,
) -> ClaimedMessage:
    """A row that cannot be decoded must not block its queue (the claim would roll back and
    take it again forever): it becomes an unreadable message, which classify calls poison."""
    try:
        return decode(values)
    except (ValueError, TypeError) as error:
        row = dict(zip(names, values, strict=True))
        try:
            row_id = dialect.decode_id(row["id"])
        except (ValueError, TypeError):
            row_id = uuid.uuid4()  # the error queue needs an Id its table can hold
        headers, body = row.get("headers"), row.get("body")
        return ClaimedMessage(
            row_id=row_id,
            expired=False,
            expires=None,
            headers_text=headers if isinstance(headers, str) or headers is None else str(headers),
            body=_raw_bytes(body),
            order=int(row["seq"]),
            unreadable=f"the row cannot be read as a message ({error})",
            claimed_size=_claimed_size(row),
        )


def _raw_bytes(value: object) -> bytes | None:
    """Whatever an untyped column held, as bytes, to move it to the error queue as it was."""
    if isinstance(value, (bytes, bytearray, memoryview)) or value is None:
        return _as_bytes(value)
    return str(value).encode("utf-8")


def _as_bytes(value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"unexpected body type {type(value).__name__}")
