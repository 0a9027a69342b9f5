"""Deliver messages into destination databases, exactly once, without a distributed transaction.

Every destination database has one `Delivery` with the same interface, `deliver(items) ->
results`:

- `LocalDelivery`, for queues in the forwarding database itself: the rows are written inside
  the source transaction (in a savepoint), so one commit makes receive and send atomic and no
  ledger is needed;
- `RemoteDelivery`, for any other database, in one destination transaction per attempt that
  ends as the route's transaction mode says (`Target.transaction`): `ledger` writes every
  message's dedup-ledger row with its queue row and commits before the source transaction
  does (if the bridge dies between the two commits the source rows come back, and
  redelivering them only hits the ledger); `two-phase` prepares the transaction instead, to
  be committed after the source, and `at-least-once` commits with no ledger
  (`bridge.forwarding.transactions` holds their source side).

Both isolate a failure that concerns one message (its destination table is missing, the server
rejects a value): the attempt is undone and made again without that message, so one bad message
never holds up the others in its batch (`Isolation`). A remote batch that misses the statement
deadline is written again in halves, down to one message, before anything is blamed
(`DeadlineSplit`, `bridge.forwarding.isolation`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from bridge.addressing import TableAddress
from bridge.config.model import BridgeConfig, ForwarderConfig, TransactionMode
from bridge.connections import Connections
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import Connection
from bridge.exceptions import (
    AuthenticationFailed,
    BridgeTableMissing,
    ConnectionLost,
    DatabaseError,
    DatabaseReadOnly,
    DatabaseUnavailable,
    LedgerDenied,
    LockTimeout,
    NoAnswer,
    QueryTimeout,
    TransientDatabaseError,
)
from bridge.forwarding.healing import heal_ledger
from bridge.forwarding.isolation import (
    ChunkLimit,
    DeadlineMissed,
    DeadlineSplit,
    Isolation,
    too_large_for_deadline,
)
from bridge.forwarding.local import LocalDelivery
from bridge.forwarding.side_by_side import SideBySide
from bridge.forwarding.table_failures import (
    busy_tables,
    item_failure,
    note_busy,
    with_busy_items,
)
from bridge.forwarding.transactions import (
    BatchTransactions,
    DestinationNotReady,
    require_prepared_transactions,
)
from bridge.forwarding.writes import (
    ItemWriteError,
    LedgerConflict,
    NotIsolated,
    QueueWriter,
    write_messages,
)
from bridge.messages import Delivered, DeliveryReport, DeliveryResult, Failed, Forward, Item, Unit
from bridge.outages import DatabaseState, OutageTracker
from bridge.storage.ledger import cannot_create_advice, ledger_address, ledger_problem
from bridge.storage.pauses import Pause
from bridge.storage.tables import bridge_queue_names

log = logging.getLogger(__name__)

_IMMEDIATE_RETRY_WAIT = wait_exponential(multiplier=0.05, max=1.0)


class Delivery(Protocol):
    # True when `deliver` touches nothing but its own database through its own connection
    # (no record in the source transaction), so that it may run beside the deliveries to
    # other databases (`deliver_units`).
    independent: bool

    def deliver(
        self, items: Sequence[Item], transactions: BatchTransactions
    ) -> list[DeliveryResult]:
        """A result for every item, in order. `transactions` is the source side of the batch
        (two-phase and at-least-once record there)."""
        ...


Group = tuple[str, TransactionMode]  # a destination database and a transaction mode

# Threads of one worker that deliver to other databases beside its own (`SideBySide`).
MAX_DELIVERY_THREADS = 16


class Destinations:
    """Where one worker delivers: a `Delivery` per destination database and transaction mode
    (the remote ones kept from batch to batch: they keep nothing of a batch), and the threads
    that deliver to different databases side by side."""

    def __init__(
        self,
        config: BridgeConfig,
        forwarder: ForwarderConfig,
        connections: Connections,
        outages: OutageTracker,
        writer: QueueWriter,
        *,
        slot: int = 0,
    ) -> None:
        self._config = config
        self._database = forwarder.database
        self._dialect = dialect_for(config.databases[forwarder.database].dialect)
        self._connections = connections
        self._outages = outages
        self._writer = writer
        self._remote: dict[Group, RemoteDelivery] = {}
        # At most one thread per other configured database, started when a batch first
        # needs them.
        self._side_by_side = SideBySide(
            min(MAX_DELIVERY_THREADS, len(config.databases) - 1),
            f"sfbridge-{forwarder.name}-{slot}-delivery",
        )

    def deliver(
        self,
        units: Sequence[Unit],
        source: Connection,
        pauses: Mapping[str, Pause],
        transactions: BatchTransactions,
    ) -> DeliveryReport:
        """Deliver every unit that is to be delivered (`deliver_units`), given the source
        transaction's connection and side, and the paused databases. Groups for a database
        that failed lately (they may wait out the query timeout) go last among those run one
        after the other, so that the others are committed first.

        Raises SourceFailed when a statement on the forwarding database failed, and the
        DatabaseError family for failures of its own queues (`LocalDelivery`)."""
        groups = list(delivery_groups(units))
        if len(groups) > 1:
            groups.sort(key=lambda group: self._outages.suspect(group[0]))
        deliveries = {group: self._delivery(source, pauses, *group) for group in groups}
        return deliver_units(units, deliveries, transactions, self._side_by_side)

    def _delivery(
        self,
        source: Connection,
        pauses: Mapping[str, Pause],
        database: str,
        mode: TransactionMode,
    ) -> Delivery:
        pause = pauses.get(database)
        if pause is not None:
            return PausedDelivery(database, pause)
        if database == self._database:
            return LocalDelivery(
                source,
                self._dialect,
                self._writer,
                self._outages,
                bridge_queue_names(self._config, database),
            )
        delivery = self._remote.get((database, mode))
        if delivery is None:
            target = Target(
                name=database,
                dialect=dialect_for(self._config.databases[database].dialect),
                ledger=ledger_address(self._config, database),
                config=self._config,
                create_ledger=self._config.install.at_runtime,
                transaction=mode,
            )
            delivery = RemoteDelivery(target, self._connections, self._outages, self._writer)
            self._remote[(database, mode)] = delivery
        return delivery


def delivery_groups(units: Sequence[Unit]) -> dict[Group, list[int]]:
    """The offsets of the units to be delivered, per destination database and transaction
    mode, in the order first seen."""
    groups: dict[Group, list[int]] = {}
    for index, unit in enumerate(units):
        if isinstance(unit.decision, Forward):
            destination = unit.decision.destination
            groups.setdefault((destination.database, destination.transaction), []).append(index)
    return groups


def deliver_units(
    units: Sequence[Unit],
    deliveries: Mapping[Group, Delivery],
    transactions: BatchTransactions,
    side_by_side: SideBySide | None = None,
) -> DeliveryReport:
    """Deliver every unit that is to be delivered with the delivery of its group
    (`deliveries`: one for every group of `delivery_groups`, in the order to run them).

    With `side_by_side`, databases whose deliveries are all `independent` (remote, with the
    ledger) are delivered at the same time, each in its own transaction as before, beside the
    others, which run one after the other on the calling thread, in order. Without it
    everything runs so.
    """
    groups = delivery_groups(units)

    def deliver_group(group: Group) -> tuple[Group, list[DeliveryResult]]:
        items = [_item(units[index]) for index in groups[group]]
        return group, deliveries[group].deliver(items, transactions)

    def deliver_groups(chunk: list[Group]) -> list[tuple[Group, list[DeliveryResult]]]:
        return [deliver_group(group) for group in chunk]

    order = list(deliveries)
    chunks = [order] if side_by_side is None else _chunks(order, deliveries)
    calls = [partial(deliver_groups, chunk) for chunk in chunks]
    if side_by_side is not None and len(calls) > 1:
        runs = side_by_side.run(calls)
    else:
        runs = [call() for call in calls]
    done = dict(pair for run in runs for pair in run)
    results: list[DeliveryResult | None] = [None] * len(units)
    delivered: dict[str, int] = {}
    for group in order:
        for index, result in zip(groups[group], done[group], strict=True):
            results[index] = result
        count = sum(isinstance(result, Delivered) for result in done[group])
        delivered[group[0]] = delivered.get(group[0], 0) + count
    return DeliveryReport(results, delivered)


def _chunks(order: Sequence[Group], deliveries: Mapping[Group, Delivery]) -> list[list[Group]]:
    """The groups in chunks that may run beside each other: first those that must run one
    after the other (not independent, and any group of a database that has one, since a
    database's groups share its connection), then one chunk per other database."""
    shared = {database for database, mode in order if not deliveries[(database, mode)].independent}
    together = [group for group in order if group[0] in shared]
    apart: dict[str, list[Group]] = {}
    for group in order:
        if group[0] not in shared:
            apart.setdefault(group[0], []).append(group)
    return [chunk for chunk in (together, *apart.values()) if chunk]


def _item(unit: Unit) -> Item:
    assert isinstance(unit.decision, Forward)
    return Item(unit.message, unit.decision)


@dataclass(frozen=True)
class Target:
    """A destination database as remote delivery needs it. `create_ledger`: create the
    ledger when it is missing (`install.at_runtime`); it is written only with `ledger`."""

    name: str
    dialect: Dialect
    ledger: TableAddress
    config: BridgeConfig
    create_ledger: bool
    transaction: TransactionMode = "ledger"


class RemoteDelivery:
    """Into one other database, in its own transaction, ended as `target.transaction` says.
    One per worker, destination and mode; it keeps nothing of a batch between calls."""

    def __init__(
        self,
        target: Target,
        connections: Connections,
        outages: OutageTracker,
        writer: QueueWriter,
    ) -> None:
        self._target = target
        self._connections = connections
        self._immediate_attempts = max(1, target.config.retries.immediate_attempts)
        self._outages = outages
        self._writer = writer
        self._can_prepare = False  # max_prepared_transactions seen above 0
        self._chunk_limit = ChunkLimit()
        # Two-phase and at-least-once record in the source transaction; the ledger does not.
        self.independent = target.transaction == "ledger"

    def deliver(
        self, items: Sequence[Item], transactions: BatchTransactions
    ) -> list[DeliveryResult]:
        """Every item gets a result; database errors never escape.

        A database in trouble fails every item at once (an outage); a missing ledger is
        created once and the items tried again.
        """
        name, dialect = self._target.name, self._target.dialect
        busy = None
        if self._outages.suspect(name):  # else (nearly always) no trouble and no busy table
            trouble = self._outages.trouble(name)
            if trouble is not None:
                return [_trouble_failure(trouble)] * len(items)
            ledger = self._target.ledger if self._target.transaction == "ledger" else None
            busy = busy_tables(self._outages, name, dialect, items, ledger)
        tried = items if busy is None else [items[o] for o in range(len(items)) if o not in busy]
        results = self._deliver_in_time(tried, transactions) if tried else []
        return with_busy_items(self._outages, name, dialect, items, busy, results)

    def _deliver_in_time(
        self, items: Sequence[Item], transactions: BatchTransactions
    ) -> list[DeliveryResult]:
        """The items in one destination transaction (nearly always), else in the chunks of
        `DeadlineSplit`, each a delivery of its own: a chunk written stays written."""
        name = self._target.name
        split = DeadlineSplit(len(items), self._chunk_limit.current(time.monotonic()))
        while (chunk := split.current()) is not None:
            if split.misses and (trouble := self._outages.state(name)) and trouble.in_trouble:
                split.give_up(_trouble_failure(trouble))  # it went down meanwhile
                break
            part = items if len(chunk) == len(items) else items[chunk.start : chunk.stop]
            try:
                split.settled(self._deliver_to_database(part, transactions))
            except DeadlineMissed as missed:
                if split.missed():
                    log.info("database '%s': %d messages missed the deadline (%s); writing "
                             "them in halves", name, len(part), missed.error.detail)  # fmt: skip
                else:
                    split.settled([self._missed_alone(part[0], missed.error)])
        self._chunk_limit.learn(split, time.monotonic())
        return split.results()

    def _missed_alone(self, item: Item, error: QueryTimeout) -> Failed:
        """`item`, written alone, missed the deadline: its own failure (it spends an attempt)
        when the database answers a read of its table, else the database's (an outage)."""
        target, address = self._target, item.forward.destination.address
        try:
            connection = self._connections.get(target.name)
            connection.begin()
            connection.query(target.dialect.sql("table_probe", table=address))
            connection.rollback()
        except DatabaseUnavailable:
            self._connections.discard(target.name)
            (failure,) = self._fail_all([item], error)
            assert isinstance(failure, Failed)
            return failure
        except DatabaseError:
            self._connections.discard(target.name)  # it answered: the message's fault
        query_timeout = target.config.databases[target.name].query_timeout
        table = target.dialect.grammar.render(address)
        reason = too_large_for_deadline(item, table, target.name, query_timeout, error.detail)
        log.warning("database '%s': %s", target.name, reason)
        return Failed(reason)

    def _deliver_to_database(
        self, items: Sequence[Item], transactions: BatchTransactions
    ) -> list[DeliveryResult]:
        name = self._target.name
        healed = False
        while True:
            try:
                results = self._isolated(items, transactions)
            except BridgeTableMissing as missing:
                try:
                    problem = (
                        missing.detail
                        if healed
                        else heal_ledger(
                            self._connections,
                            self._target.config,
                            name,
                            missing,
                            allowed=self._target.create_ledger,
                        )
                    )
                except DatabaseError as error:
                    return self._fail_all(items, error)
                if problem is None:
                    healed = True
                    continue
                return self._not_ready(items, problem)
            except LedgerDenied as error:
                advice = cannot_create_advice(error.detail)
                return self._not_ready(items, ledger_problem(self._target.config, name, advice))
            except DestinationNotReady as not_ready:
                return self._not_ready(items, not_ready.problem)
            except LockTimeout as error:  # on the ledger: a queue's is an item failure
                ledger = self._target.dialect.grammar.render(self._target.ledger)
                self._outages.record_busy(name, ledger, error.detail)
                failure = f"the dedup ledger {ledger} is locked by another session: {error.detail}"
                return [Failed(failure, outage=True)] * len(items)
            except DatabaseError as error:
                return self._fail_all(items, error)
            self._outages.record_up(name)
            return results

    def _isolated(
        self, items: Sequence[Item], transactions: BatchTransactions
    ) -> list[DeliveryResult]:
        """The items written in as few attempts as `Isolation` allows."""
        isolation = Isolation(items)
        while (pending := isolation.pending()) is not None:
            try:
                isolation.succeeded(self._attempt(pending, isolation.one_by_one, transactions))
            except NotIsolated:
                isolation.not_isolated()
            except ItemWriteError as failure:
                isolation.failed(*self._item_failure(pending, failure))
        return isolation.results()

    def _not_ready(self, items: Sequence[Item], problem: str) -> list[DeliveryResult]:
        """The database is reachable but not usable by the bridge: a state, like an outage."""
        self._outages.record_trouble(self._target.name, "not-ready", problem)
        return [Failed(problem, outage=True)] * len(items)

    def _fail_all(self, items: Sequence[Item], error: DatabaseError) -> list[DeliveryResult]:
        outage = isinstance(error, DatabaseUnavailable)
        refused = isinstance(error, AuthenticationFailed)
        if isinstance(error, AuthenticationFailed):
            self._outages.record_trouble(self._target.name, "auth-failed", str(error), error.login)
        elif isinstance(error, DatabaseReadOnly):
            # A session that saw the database read-only stays so after it is writable again
            # (`_transaction` discarded it already, unless healing the ledger was what failed).
            self._connections.discard(self._target.name)
            self._outages.record_trouble(self._target.name, "read-only", str(error))
        elif outage:
            self._outages.record_trouble(self._target.name, "unreachable", str(error))
        return [Failed(str(error), outage=outage, login_refused=refused)] * len(items)

    def _attempt(
        self, items: Sequence[Item], one_by_one: bool, transactions: BatchTransactions
    ) -> dict[int, DeliveryResult]:
        """One destination transaction, tried again at once for transient errors."""
        retrying = Retrying(
            stop=stop_after_attempt(self._immediate_attempts),
            wait=_IMMEDIATE_RETRY_WAIT,
            retry=retry_if_exception_type((TransientDatabaseError, ConnectionLost)),
            before_sleep=self._before_immediate_retry,
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                return self._transaction(items, one_by_one, transactions)
        raise AssertionError("unreachable: tenacity re-raises the last error")

    def _transaction(
        self, items: Sequence[Item], one_by_one: bool, transactions: BatchTransactions
    ) -> dict[int, DeliveryResult]:
        target = self._target
        connection = self._connections.get(target.name)
        ledger = target.ledger if target.transaction == "ledger" else None
        write = partial(write_messages, connection, target.dialect, self._writer, items)
        try:
            connection.begin()
            try:
                try:
                    results = write(ledger=ledger, one_by_one=one_by_one)
                except LedgerConflict:
                    # Some message was recorded before: again, skipping those.
                    connection.rollback()
                    connection.begin()
                    results = write(ledger=ledger, one_by_one=one_by_one, expect_duplicates=True)
            except NoAnswer:
                raise  # the server is silent, not slow with these rows: an outage
            except QueryTimeout as error:
                # Only a write: a commit or prepare that timed out may have happened after
                # all, and writing its messages again could deliver them twice.
                raise DeadlineMissed(error) from None
            self._end(connection, items, results, transactions)
        except (NotIsolated, ItemWriteError, BridgeTableMissing):
            connection.rollback()
            raise
        except BaseException:
            # Anything else (a lost connection, a bug, a value that cannot be bound) must not
            # leave this transaction open: its ledger rows, committed later by another batch
            # on the same connection, would turn these messages into "duplicates" never sent.
            self._connections.discard(target.name)
            raise
        if not target.dialect.keep_destination_connections:
            self._connections.discard(target.name)
        return results

    def _end(
        self,
        connection: Connection,
        items: Sequence[Item],
        results: dict[int, DeliveryResult],
        transactions: BatchTransactions,
    ) -> None:
        """End the destination transaction as the transaction mode says."""
        mode = self._target.transaction
        if mode == "ledger":
            connection.commit()
            return
        written = [
            items[p] for p, result in sorted(results.items()) if isinstance(result, Delivered)
        ]
        if not written:
            connection.commit()
        elif mode == "two-phase":
            if not self._can_prepare:
                require_prepared_transactions(connection, self._target.dialect, self._target.name)
                self._can_prepare = True
            transactions.prepare(connection, self._target.dialect, self._target.name)
        else:
            transactions.commit_in_flight(connection, self._target.name, written)

    def _item_failure(
        self, items: Sequence[Item], failure: ItemWriteError
    ) -> tuple[list[int], Failed]:
        connection = self._connections.get(self._target.name)
        note_busy(self._outages, self._target.name, self._target.dialect, items, failure)
        if isinstance(failure.error, LockTimeout):
            connection.rollback()  # before anything else: the transaction is aborted
        try:
            return item_failure(
                connection,
                self._target.dialect,
                self._target.name,
                items,
                failure,
                bridge_queue_names(self._target.config, self._target.name),
            )
        finally:
            connection.rollback()

    def _before_immediate_retry(self, retry_state: object) -> None:
        log.info("transient error on database '%s'; retrying at once", self._target.name)
        self._connections.discard(self._target.name)


def _trouble_failure(trouble: DatabaseState) -> Failed:
    """What an item for a database in `trouble` fails with: an outage."""
    refused = trouble.state == "auth-failed"
    return Failed(trouble.last_error or "unavailable", outage=True, login_refused=refused)


class PausedDelivery:
    """The delivery to a paused destination database: nothing is tried, every item waits."""

    independent = False  # nothing to wait for

    def __init__(self, database: str, pause: Pause) -> None:
        self._error = f"database '{database}' is {pause.describe()} (sfbridge resume)"

    def deliver(
        self, items: Sequence[Item], transactions: BatchTransactions
    ) -> list[DeliveryResult]:
        return [Failed(self._error, paused=True)] * len(items)
