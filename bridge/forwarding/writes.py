"""Writing messages into queue tables and the dedup ledger, inside the caller's transaction.

`QueueWriter` picks the statement variant each existing queue table takes (see
`bridge.dialects.base.QueueShapes`) and streams rows with `COPY` where the driver and the table
allow it; `write_messages` inserts a group of messages, many rows per statement where it can,
recording each in the ledger first when there is one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from bridge.addressing import TableAddress
from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.exceptions import (
    BridgeTableMissing,
    DatabaseError,
    DatabaseUnavailable,
    DuplicateKey,
    LedgerDenied,
    LedgerLocked,
    LockTimeout,
    NotSupported,
    PermissionDenied,
    TableNotFound,
    TransientDatabaseError,
)
from bridge.forwarding.notices import Notices
from bridge.messages import Delivered, DeliveryResult, Duplicate, Item, utcnow
from bridge.storage.ledger import LEDGER_DESCRIPTION, ledger_key
from bridge.storage.tables import owned_table

# How long a table that refused COPY is written with statements before COPY is tried again
# (one failed attempt, rolled back and written again, each time it still refuses).
COPY_RETRY_AFTER = 600.0
# One for every message delivered: a value, so the same can be shared.
DELIVERED = Delivered()


# What `write_messages` raises for its caller (`bridge.forwarding.deliver`) to act on: the
# transaction is rolled back in each case, then written again as each says.


class ItemWriteError(Exception):
    """Writing the item at `position` failed for a reason specific to that item.

    `retryable` is False when the message itself cannot be written (a value the driver
    cannot bind): trying again would fail the same way.
    """

    def __init__(self, position: int, error: DatabaseError, *, retryable: bool = True) -> None:
        super().__init__(str(error))
        self.position = position
        self.error = error
        self.retryable = retryable


class NotIsolated(Exception):
    """A multi-row statement failed and the failing message cannot be told: deliver one by one."""


class LedgerConflict(Exception):
    """Streaming the ledger rows failed: a message was recorded before (redelivered after a
    crash between the destination and source commits, or sent twice), or the ledger does not
    take COPY. Roll back and write again with `expect_duplicates`."""


class QueueWriter:
    """Writes into queue tables the bridge did not create (`send`, `send_many`, `dead_letter`),
    in the variant each table's shape takes.

    A table's shape is looked up once per database and table and remembered; a write that
    fails because the shape changed looks again and tries once more in the same transaction,
    as the transport does. Shared by a daemon's workers; thread-safe.
    """

    def __init__(
        self, copy_retry_after: float = COPY_RETRY_AFTER, notices: Notices | None = None
    ) -> None:
        self._notices = notices or Notices()
        self._overrides: dict[tuple[str, str, str], Mapping[str, str]] = {}
        # Tables that refused COPY (a view, row-level security, columns the login cannot
        # read), and when: written with statements until `copy_retry_after` has passed, then
        # COPY is tried again, since a DBA may have changed what made it refuse.
        self._refuse_copy: dict[tuple[str, str, str], float] = {}
        self._copy_retry_after = copy_retry_after
        self._lock = threading.Lock()

    def copies(
        self, connection: Connection, dialect: Dialect, name: str, **table: TableAddress
    ) -> bool:
        """Whether the rows of the multi-row statement `name` (`send_many`, ...) go into the
        table (given as the statements' one placeholder, `queue=...` or `ledger=...`) with the
        dialect's `<name>_copy` statement through `copy_rows`: the driver streams rows, the
        table took COPY before (or was never tried), and its columns have the types the COPY
        sends, read now, inside the caller's transaction (binary values are not cast, and a
        table can be created again with other types at any time). Raises the DatabaseError
        family (TableNotFound for a missing table)."""
        copy_name = _copy_name(name)
        if not connection.copies_rows or copy_name not in dialect.statements:
            return False
        with self._lock:
            refused = self._refuse_copy.get(self._key(connection, dialect, *table.values()))
        if refused is not None and time.monotonic() - refused < self._copy_retry_after:
            return False
        found = connection.column_types(dialect.sql(f"{copy_name}_columns", None, **table))
        return tuple(found) == dialect.copy_types[copy_name]

    def copy_rows(
        self,
        connection: Connection,
        dialect: Dialect,
        name: str,
        rows: Sequence[Sequence[Any]],
        **table: TableAddress,
    ) -> None:
        """Stream `rows` into the table with the `COPY` form of `name` (where `copies` says
        so). A table that refuses COPY is remembered (and not tried again for
        `copy_retry_after`) and raises NotSupported: the caller rolls back and writes the rows
        again, now with statements."""
        copy_name = _copy_name(name)
        (address,) = table.values()
        try:
            connection.copy_rows(
                dialect.sql(copy_name, None, **table), dialect.copy_types[copy_name], rows
            )
        except NotSupported as error:
            self._no_copy(connection, dialect, address, error.detail)
            raise
        if self._refuse_copy:  # read without the lock: only a table tried again is looked up
            self._copy_again(connection, dialect, address)

    def _no_copy(
        self, connection: Connection, dialect: Dialect, table: TableAddress, why: str
    ) -> None:
        """Write `table` with statements for a while, and say so once."""
        key = self._key(connection, dialect, table)
        with self._lock:
            told = key in self._refuse_copy
            self._refuse_copy[key] = time.monotonic()
        if told:
            return
        self._notices.say(
            __name__,
            key,
            "refuses COPY",
            logging.WARNING,
            f"{dialect.grammar.render(table)} in database '{connection.database}' does not take "
            f"COPY ({why}); writing it with INSERT, and trying COPY again every "
            f"{self._copy_retry_after:g} s",
        )

    def _copy_again(self, connection: Connection, dialect: Dialect, table: TableAddress) -> None:
        """`table` took COPY: if it had refused, it is written with COPY again, and that is said."""
        key = self._key(connection, dialect, table)
        with self._lock:
            refused = self._refuse_copy.pop(key, None)
        if refused is not None:
            self._notices.say(
                __name__,
                key,
                "takes COPY",
                logging.INFO,
                f"{dialect.grammar.render(table)} in database '{connection.database}' takes COPY "
                "again; writing it with COPY",
            )

    @staticmethod
    def _key(connection: Connection, dialect: Dialect, table: TableAddress) -> tuple[str, str, str]:
        return (dialect.name, connection.database, dialect.grammar.qualified_name(table))

    def sql(
        self,
        connection: Connection,
        dialect: Dialect,
        name: str,
        queue: TableAddress,
        rows: int | None = None,
    ) -> str:
        """The statement `name` for `queue` in the variant that table takes (queries `connection`
        the first time a table is seen where the dialect has variants)."""
        return dialect.sql_with(
            self._overrides_for(connection, dialect, queue), name, rows, queue=queue
        )

    def write_rows(
        self,
        connection: Connection,
        dialect: Dialect,
        name: str,
        queue: TableAddress,
        rows: Sequence[Sequence[Any]],
    ) -> None:
        """Write `rows` into `queue` with the multi-row statement `name`: streamed with COPY
        where `copies` says so, else in as few statements as the dialect and the driver allow
        (`Dialect.rows_statements`). Raises the DatabaseError family."""
        try:
            copies = self.copies(connection, dialect, name, queue=queue)
        except PermissionDenied as error:
            # The login may write the table but not read it (INSERT without SELECT, as a DBA
            # may grant a bridge): the column types COPY needs cannot be read, so statements.
            self._no_copy(connection, dialect, queue, f"its columns cannot be read: {error.detail}")
            raise
        if copies:
            self.copy_rows(connection, dialect, name, rows, queue=queue)
            return
        for attempt in (1, 2):
            overrides = self._overrides_for(connection, dialect, queue)
            statements = dialect.rows_statements(
                name, rows, arrays=connection.binds_arrays, overrides=overrides, queue=queue
            )
            try:
                for sql, parameters in statements:
                    connection.execute(sql, parameters)
                return
            except DatabaseError as error:
                shapes = dialect.queue_shapes
                if attempt == 2 or shapes is None or not shapes.is_stale(error):
                    raise
                self._forget(connection, dialect, queue)

    def _overrides_for(
        self, connection: Connection, dialect: Dialect, queue: TableAddress
    ) -> Mapping[str, str]:
        """The statement variants `queue`'s table takes (learnt once per table)."""
        shapes = dialect.queue_shapes
        if shapes is None:
            return {}
        key = self._key(connection, dialect, queue)
        with self._lock:
            overrides = self._overrides.get(key)
        if overrides is None:
            statement, parameters = shapes.lookup(queue)
            found = shapes.variants(connection.query(statement, parameters))
            if found is not None:
                with self._lock:
                    self._overrides[key] = found
            overrides = found or {}
        return overrides

    def _forget(self, connection: Connection, dialect: Dialect, queue: TableAddress) -> None:
        key = self._key(connection, dialect, queue)
        with self._lock:
            self._overrides.pop(key, None)

    def write(
        self,
        connection: Connection,
        dialect: Dialect,
        name: str,
        queue: TableAddress,
        params: Sequence[Any],
        rows: int | None = None,
    ) -> int:
        """Execute the statement `name` into `queue` with `params`; returns the row count.

        Raises the DatabaseError family.
        """
        try:
            return connection.execute(self.sql(connection, dialect, name, queue, rows), params)
        except DatabaseError as error:
            shapes = dialect.queue_shapes
            if shapes is None or not shapes.is_stale(error):
                raise
            self._forget(connection, dialect, queue)
        return connection.execute(self.sql(connection, dialect, name, queue, rows), params)


def _copy_name(name: str) -> str:
    """The COPY form of the multi-row statement `name`: `send_many` -> `send_copy`."""
    return name.removesuffix("_many") + "_copy"


def write_messages(
    connection: Connection,
    dialect: Dialect,
    writer: QueueWriter,
    items: Sequence[Item],
    *,
    ledger: TableAddress | None,
    one_by_one: bool = False,
    expect_duplicates: bool = False,
) -> dict[int, DeliveryResult]:
    """Insert every item inside the caller's open transaction; the caller commits.

    With a `ledger` address each message is first recorded there; a message already recorded
    for the same destination (now or earlier in the same batch) is a Duplicate and is not
    inserted again. Returns results keyed by position in `items`.

    Where the driver streams rows, the ledger rows are streamed with COPY, which cannot skip a
    message recorded before: it raises LedgerConflict, and the caller rolls back and calls
    again with `expect_duplicates`, which records them with a statement that skips those.
    Duplicates are rare (a crash between the two commits), and COPY costs the server and the
    bridge about half of what that statement does.

    Multi-row statements are used unless `one_by_one`. Raises ItemWriteError for a failure
    that concerns known items (a missing destination table), NotIsolated when a multi-row
    statement failed for an unknown item (roll back and call again with `one_by_one`),
    BridgeTableMissing for a missing ledger, and the DatabaseUnavailable /
    TransientDatabaseError family as they are. After any of them the transaction must be
    rolled back.
    """
    if one_by_one or len(items) == 1:
        return _one_by_one(connection, dialect, writer, items, ledger)
    return _batched(connection, dialect, writer, items, ledger, expect_duplicates)


def _batched(
    connection: Connection,
    dialect: Dialect,
    writer: QueueWriter,
    items: Sequence[Item],
    ledger: TableAddress | None,
    expect_duplicates: bool,
) -> dict[int, DeliveryResult]:
    results: dict[int, DeliveryResult] = {}
    to_send = list(range(len(items)))
    if ledger is not None:
        keys = [
            (ledger_key(decision.message_id), decision.destination.canonical)
            for _, decision in items
        ]
        distinct = list(dict.fromkeys(keys))
        recorded: set[tuple[str, str]] | None = None
        if expect_duplicates or not _stream_to_ledger(
            connection, dialect, writer, ledger, distinct
        ):
            recorded = _record_in_ledger(connection, dialect, ledger, distinct)
        if recorded is not None or len(distinct) < len(keys):
            recorded = set(distinct) if recorded is None else recorded
            to_send = []
            for position, key in enumerate(keys):
                if key in recorded:
                    recorded.discard(key)  # a second copy in the same batch is a duplicate too
                    to_send.append(position)
                else:
                    results[position] = Duplicate()
    by_address = _by_address(items, to_send)
    for address, positions in by_address.items():
        try:
            rows = _rows(dialect, [items[p] for p in positions])
            writer.write_rows(connection, dialect, "send_many", address, rows)
        except (TableNotFound, LockTimeout) as error:
            # The table's failure, not a row's: every item bound for it (`item_failure`).
            raise ItemWriteError(positions[0], error) from None
        except (DatabaseUnavailable, TransientDatabaseError):
            raise
        except (DatabaseError, ValueError, TypeError):
            raise NotIsolated() from None
        results.update(dict.fromkeys(positions, DELIVERED))
    return results


def _by_address(items: Sequence[Item], positions: list[int]) -> dict[TableAddress, list[int]]:
    """The positions grouped by destination table. The router hands out one address object
    per destination, so a batch for one table (the usual) is told by identity, unhashed."""
    if not positions:
        return {}
    first = items[positions[0]].forward.destination.address
    if all(items[p].forward.destination.address is first for p in positions):
        return {first: positions}
    grouped: dict[TableAddress, list[int]] = {}
    for position in positions:
        grouped.setdefault(items[position].forward.destination.address, []).append(position)
    return grouped


def _stream_to_ledger(
    connection: Connection,
    dialect: Dialect,
    writer: QueueWriter,
    ledger: TableAddress,
    keys: Sequence[tuple[str, str]],
) -> bool:
    """Record distinct (ledger key, destination) pairs, none recorded before, with COPY;
    returns True, or False when the ledger does not take COPY (nothing was written).
    Raises LedgerConflict when one was recorded before (or COPY is refused)."""
    now = utcnow()
    try:
        with owned_table(LEDGER_DESCRIPTION, dialect.grammar.render(ledger)):
            if not writer.copies(connection, dialect, "ledger_record_many", ledger=ledger):
                return False
            writer.copy_rows(
                connection,
                dialect,
                "ledger_record_many",
                [(key, destination, now) for key, destination in keys],
                ledger=ledger,
            )
    except (DuplicateKey, NotSupported):
        raise LedgerConflict() from None
    except PermissionDenied as error:
        raise LedgerDenied(error.database, error.detail) from None
    except (DatabaseUnavailable, TransientDatabaseError, BridgeTableMissing, LockTimeout):
        raise
    except (DatabaseError, ValueError, TypeError):
        raise NotIsolated() from None
    return True


def _record_in_ledger(
    connection: Connection,
    dialect: Dialect,
    ledger: TableAddress,
    keys: Sequence[tuple[str, str]],
) -> set[tuple[str, str]]:
    """Record distinct (ledger key, destination) pairs; returns those that were new."""
    recorded: set[tuple[str, str]] = set()
    statements = dialect.rows_statements(
        "ledger_record_many", keys, arrays=connection.binds_arrays, ledger=ledger
    )
    for sql, parameters in statements:
        try:
            with owned_table(LEDGER_DESCRIPTION, dialect.grammar.render(ledger)):
                rows = connection.query(sql, parameters)
        except PermissionDenied as error:
            raise LedgerDenied(error.database, error.detail) from None
        except (DatabaseUnavailable, TransientDatabaseError, BridgeTableMissing, LockTimeout):
            raise
        except (DatabaseError, ValueError, TypeError):
            raise NotIsolated() from None
        recorded.update((str(row[0]), str(row[1])) for row in rows)
    return recorded


def _one_by_one(
    connection: Connection,
    dialect: Dialect,
    writer: QueueWriter,
    items: Sequence[Item],
    ledger: TableAddress | None,
) -> dict[int, DeliveryResult]:
    results: dict[int, DeliveryResult] = {}
    for position, item in enumerate(items):
        decision = item.forward
        try:
            if ledger is not None:
                with owned_table(LEDGER_DESCRIPTION, dialect.grammar.render(ledger)):
                    try:
                        recorded = _record_one(connection, dialect, ledger, decision)
                    except LockTimeout as error:
                        raise LedgerLocked(error.database, error.detail) from None
                if recorded == 0:
                    results[position] = Duplicate()
                    continue
            address = decision.destination.address
            writer.write(connection, dialect, "send", address, _rows(dialect, [item])[0])
        except (
            DatabaseUnavailable,
            TransientDatabaseError,
            BridgeTableMissing,
            LedgerDenied,
            LedgerLocked,
        ):
            raise
        except DatabaseError as error:
            raise ItemWriteError(position, error) from None
        except (ValueError, TypeError) as error:  # UnicodeError is a ValueError
            problem = DatabaseError(connection.database, f"the message cannot be written: {error}")
            raise ItemWriteError(position, problem, retryable=False) from None
        results[position] = DELIVERED
    return results


def _record_one(
    connection: Connection, dialect: Dialect, ledger: TableAddress, decision: Any
) -> int:
    try:
        return connection.execute(
            dialect.sql("ledger_record", ledger=ledger),
            (ledger_key(decision.message_id), decision.destination.canonical),
        )
    except PermissionDenied as error:
        raise LedgerDenied(error.database, error.detail) from None


def new_ids(dialect: Dialect, count: int) -> list[Any]:
    """`count` new row ids for rows written together, encoded for `dialect`: time-ordered
    UUIDs (version 7 of RFC 9562: 48 bits of Unix milliseconds, then 12 random bits and a
    62-bit counter), the counter starting at a random value below 2**61 per call and counting
    up by one per id.

    Why not random (version 4): every id goes into the destination queue's primary key, and
    random keys land on random pages of that index, each insert a page to find (rarely in
    cache once the index outgrows it) and splits all over it; keys that grow land on its right
    edge. The destination's PostgreSQL backend spent 10.3-10.5 us per 1 KiB message against
    11.9-14.3 with random ids (`bench/profile_forwarding.py`, which shows that backend's CPU).
    Unique still: two calls in the same millisecond share an id only if their 73 random bits
    put their ranges over each other.
    """
    random_bits = int.from_bytes(os.urandom(10))  # 80 bits: 12 for rand_a, 61 for the start
    first = (
        (time.time_ns() // 1_000_000 & _MILLISECONDS) << 80
        | _VERSION_7
        | (random_bits >> 68) << 64
        | _RFC_VARIANT
        | random_bits & _COUNTER_START
    )
    encode_id = dialect.encode_id
    return [encode_id(_uuid(first + offset)) for offset in range(count)]


_MILLISECONDS = (1 << 48) - 1
_VERSION_7 = 0x7 << 76
_RFC_VARIANT = 0b10 << 62
# The start of the 62-bit rand_b field leaves its top bit clear, so adding up to 2**61 rows
# never carries into the variant bits.
_COUNTER_START = (1 << 61) - 1
_SAFE_UNKNOWN = uuid.SafeUUID.unknown  # an enum member: looked up once, not per id


def _uuid(bits: int) -> uuid.UUID:
    """`uuid.UUID(int=bits)` without its checks and keyword handling, which cost more than the
    rest of writing a row: the two slots filled as its constructor fills them."""
    value = object.__new__(uuid.UUID)
    object.__setattr__(value, "int", bits)
    object.__setattr__(value, "is_safe", _SAFE_UNKNOWN)
    return value


def _rows(dialect: Dialect, items: Sequence[Item]) -> list[tuple[Any, ...]]:
    """The `send` parameters of each message: a new row id, its Expires, headers and body."""
    encode_timestamp = dialect.encode_timestamp
    return [
        (row_id, encode_timestamp(message.expires), forward.headers_text, message.body)
        for row_id, (message, forward) in zip(new_ids(dialect, len(items)), items, strict=True)
    ]
