"""Reading, replaying and purging the forwarders' error queues (`sfbridge errors`).

An error queue is an ordinary NServiceBus queue in a forwarding database, which endpoints may
share. Reading it takes nothing (`read_failed_messages`). Replaying moves the chosen rows back
into the forwarding queue their `NServiceBus.FailedQ` names, with the failure headers taken
off, in one transaction per batch in that database: the rows are claimed from the error queue
with a destructive DELETE (a row another transaction takes meanwhile is not returned), inserted
into the forwarding queue, and the transaction committed, so a crash at any point leaves each
message in exactly one of the two queues. Purging deletes the chosen rows, a batch per
transaction.

One kind of row is replayed into the forwarder's retry storage instead, due at once: an
event's copy whose destination is written in another database's grammar
(`$.sfbridge.address-database`). The bridge drops its own headers from every row a sender
writes into a forwarding queue (`bridge.forwarding.classify`), so there the copy
would be read in the wrong grammar; retry storage is the bridge's, and keeps the header.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bridge.addressing import TableAddress
from bridge.commands.failed_messages import (
    FailedMessage,
    QueueOwners,
    describe,
    redirected_headers,
    replay_headers,
)
from bridge.config.catalogs import database_catalog
from bridge.config.model import BridgeConfig
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import Connection
from bridge.exceptions import TableNotFound
from bridge.forwarding.claim import decode_row
from bridge.forwarding.proxies import proxy_destination
from bridge.forwarding.writes import QueueWriter
from bridge.headers import (
    ADDRESS_DATABASE_HEADER,
    DESTINATION_HEADER,
    Headers,
    parse_headers,
    serialize_headers,
)
from bridge.messages import ClaimedMessage, utcnow
from bridge.routing import Destination
from bridge.storage.archive import ArchiveRow, store_archived
from bridge.storage.retries import store_retry
from bridge.storage.tables import forwarder_tables, owned_table

# Rows per replay or purge transaction (and per multi-row statement).
BATCH_SIZE = 100
# Rows per read of an error queue's headers.
PAGE_SIZE = 2000


@dataclass(frozen=True)
class ErrorQueue:
    """One error queue table: its database, address, the forwarders that write to it, and who
    drains each queue of that database (what its rows' `NServiceBus.FailedQ` may name)."""

    database: str
    address: TableAddress
    name: str
    forwarders: tuple[str, ...]
    owners: QueueOwners
    forwarding_queues: dict[str, TableAddress] = field(compare=False)
    # Each forwarder's retry storage: where a replayed row that needs a bridge header goes.
    retry_tables: dict[str, TableAddress] = field(compare=False, default_factory=dict)
    # Proxy forwarders of the database and where they deliver: their messages carry no
    # routing header, so this is their destination.
    proxies: dict[str, Destination] = field(compare=False, default_factory=dict)

    def describe(self) -> str:
        return f"error queue {self.name} in database '{self.database}'"

    def destination_of(self, message: FailedMessage) -> str | None:
        """Where `message` was going: its proxy forwarder's destination, else its routing
        header (`FailedMessage.destination`)."""
        fixed = self.proxies.get(message.forwarder or "")
        if fixed is not None:
            return f"{fixed.canonical} in database '{fixed.database}'"
        return message.destination

    def proxy_names(self, message: FailedMessage) -> tuple[str, ...]:
        """What `errors --destination` matches for a proxy forwarder's message: its proxy's
        destination queue, as canonical address and as table name; nothing for others."""
        fixed = self.proxies.get(message.forwarder or "")
        return () if fixed is None else (fixed.canonical, fixed.address.table)


def error_queues(config: BridgeConfig, forwarder: str | None = None) -> list[ErrorQueue]:
    """Every forwarder's error queue, each table once, in config order; with `forwarder`, the
    error queues of that forwarder's database only."""
    databases = [f.database for f in config.forwarders if forwarder in (None, f.name)]
    found: dict[tuple[str, str], tuple[TableAddress, list[str]]] = {}
    for each in config.forwarders:
        if each.database not in databases:
            continue
        dialect = dialect_for(config.databases[each.database].dialect)
        address = forwarder_tables(config, each).error_queue
        key = (each.database, dialect.grammar.qualified_name(address))
        found.setdefault(key, (address, []))[1].append(each.name)
    queues = []
    for (database, _), (address, writers) in found.items():
        settings = config.databases[database]
        dialect = dialect_for(settings.dialect)
        drained = {
            f.name: forwarder_tables(config, f).queue
            for f in config.forwarders
            if f.database == database
        }
        queues.append(
            ErrorQueue(
                database=database,
                address=address,
                name=dialect.grammar.render(address),
                forwarders=tuple(writers),
                owners=QueueOwners(
                    database,
                    dialect.grammar,
                    settings.schema,
                    drained,
                    default_catalog=database_catalog(settings),
                ),
                forwarding_queues=drained,
                retry_tables={
                    f.name: forwarder_tables(config, f).retry
                    for f in config.forwarders
                    if f.database == database
                },
                proxies={
                    f.name: fixed
                    for f in config.forwarders
                    if f.database == database
                    and (fixed := proxy_destination(config, f)) is not None
                },
            )
        )
    return queues


def read_failed_messages(
    connection: Connection, dialect: Dialect, queue: ErrorQueue
) -> list[FailedMessage] | None:
    """Every row of the error queue in queue order, read without taking any; None when the
    table does not exist (nothing has failed there yet). Raises the DatabaseError family."""
    messages: list[FailedMessage] = []
    statement = dialect.sql("error_queue_page", queue=queue.address)
    after = 0
    try:
        connection.begin_read()
        while True:
            rows = connection.query_named(statement, (after, PAGE_SIZE))
            for row in rows:
                seq = int(row["seq"])
                messages.append(describe(row["id"], seq, row["headers"], queue.owners))
                after = max(after, seq)
            if len(rows) < PAGE_SIZE:
                return messages
    except TableNotFound:
        return None
    finally:
        connection.rollback()


@dataclass(frozen=True)
class FullMessage:
    """One error-queue row with its body, for `errors show`."""

    message: FailedMessage
    headers_text: str | None
    body: bytes | None


def read_full_message(
    connection: Connection, dialect: Dialect, queue: ErrorQueue, seq: int
) -> FullMessage | None:
    """The row with sequence value `seq`, body included; None when it is gone."""
    try:
        connection.begin_read()
        rows = connection.query_named(dialect.sql("error_queue_row", queue=queue.address), (seq,))
    finally:
        connection.rollback()
    if not rows:
        return None
    row = rows[0]
    body = row["body"]
    return FullMessage(
        describe(row["id"], int(row["seq"]), row["headers"], queue.owners),
        row["headers"],
        None if body is None else bytes(body),
    )


@dataclass
class MoveReport:
    """What a replay or purge of one error queue did."""

    moved: list[FailedMessage] = field(default_factory=list)
    gone: list[FailedMessage] = field(default_factory=list)  # taken by someone else meanwhile


def replay_messages(
    connection: Connection,
    dialect: Dialect,
    queue: ErrorQueue,
    messages: Sequence[FailedMessage],
    *,
    writer: QueueWriter | None = None,
    batch_size: int = BATCH_SIZE,
    on_batch: Callable[[list[FailedMessage], str], None] | None = None,
    in_batch: Callable[[Connection, int], None] | None = None,
    redirect: str | None = None,
) -> MoveReport:
    """Move `messages` (replayable ones, read from `queue`) back into the forwarding queues
    their `NServiceBus.FailedQ` names, without the failure headers; one transaction per batch.

    `in_batch(connection, moved)` runs in each batch's transaction before its commit (the
    audit record counts what it moved), `on_batch(moved, forwarder)` after it. `redirect`: an
    address (checked against the routes by the caller) each message goes to instead. Raises
    BridgeTableMissing for a missing queue and the DatabaseError family; the batch in hand is
    then rolled back (the batches before it are committed).
    """
    writer = writer or QueueWriter()
    report = MoveReport()
    by_forwarder: dict[str, list[FailedMessage]] = {}
    for message in messages:
        if message.forwarder is None:
            raise ValueError(f"message {message.row_id} is not replayable")
        by_forwarder.setdefault(message.forwarder, []).append(message)
    for forwarder, chosen in by_forwarder.items():
        target = queue.forwarding_queues[forwarder]
        for start in range(0, len(chosen), batch_size):
            batch = chosen[start : start + batch_size]
            moved = _replay_batch(
                connection,
                dialect,
                queue,
                (forwarder, target, queue.retry_tables.get(forwarder)),
                batch,
                writer,
                in_batch,
                redirect,
            )
            report.moved += moved
            moved_seqs = {message.seq for message in moved}
            report.gone += [message for message in batch if message.seq not in moved_seqs]
            if on_batch is not None and moved:
                on_batch(moved, forwarder)
    return report


def _replay_batch(
    connection: Connection,
    dialect: Dialect,
    queue: ErrorQueue,
    forwarder: tuple[str, TableAddress, TableAddress | None],
    batch: Sequence[FailedMessage],
    writer: QueueWriter,
    in_batch: Callable[[Connection, int], None] | None = None,
    redirect: str | None = None,
) -> list[FailedMessage]:
    """`forwarder`: its name, its queue and its retry storage (None: none known)."""
    name, target, retry = forwarder
    by_seq = {message.seq: message for message in batch}
    try:
        connection.begin()
        with owned_table("error queue", queue.name):
            rows = connection.query_named(
                dialect.sql("error_queue_claim_many", rows=len(batch), queue=queue.address),
                [message.seq for message in batch],
            )
        claimed = sorted((decode_row(dialect, row) for row in rows), key=lambda m: m.order)
        if claimed:
            parameters: list[object] = []
            queued = 0
            for row in claimed:
                headers = replay_headers(parse_headers(row.headers_text))
                if redirect is not None:
                    headers = redirected_headers(headers, redirect)
                if retry is not None and headers.get(ADDRESS_DATABASE_HEADER):
                    _retry_now(connection, dialect, retry, name, row, headers)
                    continue
                queued += 1
                parameters += [
                    dialect.encode_id(row.row_id),
                    dialect.encode_timestamp(row.expires),
                    serialize_headers(headers),
                    row.body,
                ]
            if queued:
                with owned_table("forwarding queue", dialect.grammar.render(target)):
                    writer.write(connection, dialect, "send_many", target, parameters, queued)
            if in_batch is not None:
                in_batch(connection, len(claimed))
        connection.commit()
    except BaseException:
        connection.rollback()
        raise
    return [by_seq[row.order] for row in claimed]


def _retry_now(
    connection: Connection,
    dialect: Dialect,
    retry: TableAddress,
    forwarder: str,
    row: ClaimedMessage,
    headers: Headers,
) -> None:
    """Put one replayed row into `forwarder`'s retry storage, due now, no attempt spent."""
    now = utcnow()  # naive UTC, as the tables keep it
    store_retry(
        connection,
        dialect,
        retry,
        row.row_id,
        forwarder,
        (headers.get(DESTINATION_HEADER) or "", None),
        (row.expires, serialize_headers(headers), row.body),
        0,
        now,
        now,
        "replayed from the error queue (sfbridge errors replay)",
    )


def purge_messages(
    connection: Connection,
    dialect: Dialect,
    queue: ErrorQueue,
    messages: Sequence[FailedMessage],
    *,
    batch_size: int = BATCH_SIZE,
    in_batch: Callable[[Connection, int], None] | None = None,
) -> int:
    """Delete `messages` from `queue`, one transaction per batch; returns how many rows were
    deleted (fewer when someone else took some meanwhile). `in_batch(connection, deleted)`
    runs in each batch's transaction before its commit. Raises the DatabaseError family."""
    deleted = 0
    for start in range(0, len(messages), batch_size):
        batch = messages[start : start + batch_size]
        try:
            connection.begin()
            with owned_table("error queue", queue.name):
                count = connection.execute(
                    dialect.sql("error_queue_delete_many", rows=len(batch), queue=queue.address),
                    [message.seq for message in batch],
                )
            if in_batch is not None:
                in_batch(connection, count)
            connection.commit()
            deleted += count
        except BaseException:
            connection.rollback()
            raise
    return deleted


def archive_messages(
    connection: Connection,
    dialect: Dialect,
    queue: ErrorQueue,
    archive: TableAddress,
    messages: Sequence[FailedMessage],
    *,
    batch_size: int = BATCH_SIZE,
    in_batch: Callable[[Connection, int], None] | None = None,
) -> int:
    """Move `messages` from `queue` into the error archive `archive`, as they are (Id, Expires,
    Headers, Body), one transaction per batch; returns how many moved (fewer when someone
    took some meanwhile). `in_batch(connection, moved)` runs before each commit. Raises
    BridgeTableMissing for a missing archive and the DatabaseError family."""
    moved = 0
    for start in range(0, len(messages), batch_size):
        batch = messages[start : start + batch_size]
        try:
            connection.begin()
            with owned_table("error queue", queue.name):
                rows = connection.query_named(
                    dialect.sql("error_queue_claim_many", rows=len(batch), queue=queue.address),
                    [message.seq for message in batch],
                )
            claimed = sorted((decode_row(dialect, row) for row in rows), key=lambda m: m.order)
            store_archived(
                connection,
                dialect,
                archive,
                queue.name,
                [
                    ArchiveRow(str(row.row_id), row.expires, row.headers_text or "", row.body)
                    for row in claimed
                ],
            )
            if in_batch is not None:
                in_batch(connection, len(claimed))
            connection.commit()
            moved += len(claimed)
        except BaseException:
            connection.rollback()
            raise
    return moved
