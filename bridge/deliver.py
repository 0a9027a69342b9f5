"""Deliver messages into one destination database, exactly once, without a distributed transaction.

For a remote database, every message's dedup-ledger row and queue row are written in one
destination transaction that commits before the source transaction does. If the bridge dies
between the two commits the source rows come back, and redelivering them only hits the
ledger. For the forwarding database itself the rows are written in the source transaction.

A failure that concerns one message (its destination table is missing, the server rejects a
value) is isolated: the transaction is rolled back and retried without that message, so one
bad message never holds up the others in its batch.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from bridge.addressing import QueueAddress
from bridge.classify import ClaimedMessage, Deliver
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import Dialect
from bridge.drivers import (
    Connection,
    ConnectionLost,
    DatabaseError,
    DatabaseUnavailable,
    PermissionDenied,
    QueueNotFound,
    TransientDatabaseError,
)
from bridge.ledger import (
    LEDGER_DESCRIPTION,
    RUNTIME_DDL_OFF_ADVICE,
    cannot_create_advice,
    ensure_ledger,
    ledger_key,
)
from bridge.outages import OutageTracker
from bridge.routing import Destination, nearest_table
from bridge.tables import BridgeTableMissing, owned_table

log = logging.getLogger(__name__)

_IMMEDIATE_RETRY_WAIT = wait_exponential(multiplier=0.05, max=1.0)


@dataclass(frozen=True)
class Delivered:
    pass


@dataclass(frozen=True)
class Duplicate:
    """The ledger already had this message for this destination: it was delivered before."""


@dataclass(frozen=True)
class Failed:
    """Not delivered. `retryable` False sends it to the error queue without further attempts.

    `outage`: the whole database failed (unreachable, or lacking a bridge table it may not
    create), not this message; with `retries.during_outage: wait` that spends no attempt.
    """

    error: str
    retryable: bool = True
    missing_queue: bool = False
    outage: bool = False


DeliveryResult = Delivered | Duplicate | Failed
Item = tuple[ClaimedMessage, Deliver]


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


# Rows per multi-row statement: well under every driver's parameter limit.
ROWS_PER_STATEMENT = 100


def deliver_in_transaction(
    connection: Connection,
    dialect: Dialect,
    items: Sequence[Item],
    *,
    ledger: QueueAddress | None,
    one_by_one: bool = False,
) -> dict[int, DeliveryResult]:
    """Insert every item inside the caller's open transaction; the caller commits.

    With a `ledger` address each message is first recorded there; a message already recorded
    for the same destination (now or earlier in the same batch) is a Duplicate and is not
    inserted again. Returns results keyed by position in `items`.

    Multi-row statements are used unless `one_by_one`. Raises ItemWriteError for a failure
    that concerns known items (a missing destination table), NotIsolated when a multi-row
    statement failed for an unknown item (roll back and call again with `one_by_one`), and
    the DatabaseUnavailable / TransientDatabaseError family as they are. After any of them
    the transaction must be rolled back.
    """
    if one_by_one or len(items) == 1:
        return _deliver_one_by_one(connection, dialect, items, ledger)
    return _deliver_batched(connection, dialect, items, ledger)


def _deliver_batched(
    connection: Connection, dialect: Dialect, items: Sequence[Item], ledger: QueueAddress | None
) -> dict[int, DeliveryResult]:
    results: dict[int, DeliveryResult] = {}
    to_send = list(range(len(items)))
    if ledger is not None:
        keys = [
            (ledger_key(decision.message_id), decision.destination.canonical)
            for _, decision in items
        ]
        recorded = _record_in_ledger(connection, dialect, ledger, list(dict.fromkeys(keys)))
        to_send = []
        for position, key in enumerate(keys):
            if key in recorded:
                recorded.discard(key)  # a second copy in the same batch is a duplicate too
                to_send.append(position)
            else:
                results[position] = Duplicate()
    by_address: dict[QueueAddress, list[int]] = {}
    for position in to_send:
        by_address.setdefault(items[position][1].destination.address, []).append(position)
    for address, positions in by_address.items():
        for start in range(0, len(positions), ROWS_PER_STATEMENT):
            chunk = positions[start : start + ROWS_PER_STATEMENT]
            parameters: list[Any] = []
            for position in chunk:
                message, decision = items[position]
                parameters += [
                    dialect.encode_id(uuid.uuid4()),
                    dialect.encode_timestamp(message.expires),
                    decision.headers_text,
                    message.body,
                ]
            try:
                dialect.write_queue(connection, "send_many", address, parameters, rows=len(chunk))
            except QueueNotFound as error:
                raise ItemWriteError(chunk[0], error) from None
            except (DatabaseUnavailable, TransientDatabaseError):
                raise
            except (DatabaseError, ValueError, TypeError):
                raise NotIsolated() from None
            for position in chunk:
                results[position] = Delivered()
    return results


def _record_in_ledger(
    connection: Connection,
    dialect: Dialect,
    ledger: QueueAddress,
    keys: Sequence[tuple[str, str]],
) -> set[tuple[str, str]]:
    """Record distinct (message id, destination) keys; returns those that were new."""
    recorded: set[tuple[str, str]] = set()
    for start in range(0, len(keys), ROWS_PER_STATEMENT):
        chunk = keys[start : start + ROWS_PER_STATEMENT]
        try:
            with owned_table(LEDGER_DESCRIPTION, dialect.grammar.render(ledger)):
                rows = connection.query(
                    dialect.sql("ledger_record_many", rows=len(chunk), ledger=ledger),
                    [value for key in chunk for value in key],
                )
        except (DatabaseUnavailable, TransientDatabaseError, BridgeTableMissing):
            raise
        except (DatabaseError, ValueError, TypeError):
            raise NotIsolated() from None
        recorded.update((str(row[0]), str(row[1])) for row in rows)
    return recorded


def _deliver_one_by_one(
    connection: Connection, dialect: Dialect, items: Sequence[Item], ledger: QueueAddress | None
) -> dict[int, DeliveryResult]:
    results: dict[int, DeliveryResult] = {}
    for position, (message, decision) in enumerate(items):
        try:
            if ledger is not None:
                with owned_table(LEDGER_DESCRIPTION, dialect.grammar.render(ledger)):
                    recorded = connection.execute(
                        dialect.sql("ledger_record", ledger=ledger),
                        (ledger_key(decision.message_id), decision.destination.canonical),
                    )
                if recorded == 0:
                    results[position] = Duplicate()
                    continue
            dialect.write_queue(
                connection,
                "send",
                decision.destination.address,
                (
                    dialect.encode_id(uuid.uuid4()),
                    dialect.encode_timestamp(message.expires),
                    decision.headers_text,
                    message.body,
                ),
            )
        except (DatabaseUnavailable, TransientDatabaseError, BridgeTableMissing):
            raise
        except DatabaseError as error:
            raise ItemWriteError(position, error) from None
        except (ValueError, TypeError) as error:  # UnicodeError is a ValueError
            problem = DatabaseError(connection.database, f"the message cannot be written: {error}")
            raise ItemWriteError(position, problem, retryable=False) from None
        results[position] = Delivered()
    return results


@dataclass(frozen=True)
class Target:
    """A destination database as delivery needs it.

    `create_ledger`: create the ledger when it is missing (`install.at_runtime`).
    """

    name: str
    dialect: Dialect
    ledger: QueueAddress
    config: BridgeConfig
    create_ledger: bool


class RemoteDelivery:
    """Deliver groups of messages into one remote database, with the dedup ledger."""

    def __init__(
        self,
        target: Target,
        connections: Connections,
        immediate_attempts: int,
        outages: OutageTracker,
    ) -> None:
        self._target = target
        self._connections = connections
        self._immediate_attempts = max(1, immediate_attempts)
        self._outages = outages

    def deliver(self, items: Sequence[Item]) -> list[DeliveryResult]:
        """Deliver `items`; every item gets a result, database errors never escape."""
        name = self._target.name
        trouble = self._outages.trouble(name)
        if trouble is not None:
            return [Failed(trouble.last_error or "unavailable", outage=True)] * len(items)
        results: dict[int, DeliveryResult] = {}
        pending = list(range(len(items)))
        healed = False
        # Each round commits, settles at least one item, or heals the ledger once.
        while pending:
            try:
                committed = self._deliver_round([items[i] for i in pending])
            except _Settled as settled:
                for offset in settled.offsets:
                    results[pending[offset]] = settled.result
                pending = [p for i, p in enumerate(pending) if i not in settled.offsets]
                continue
            except BridgeTableMissing as missing:
                try:
                    problem = missing.detail if healed else self._heal(missing)
                except DatabaseError as error:
                    self._fail(pending, results, error)
                    break
                if problem is None:
                    healed = True
                    continue
                self._outages.record_trouble(name, "not-ready", problem)
                for position in pending:
                    results[position] = Failed(problem, outage=True)
                break
            except DatabaseError as error:
                self._fail(pending, results, error)
                break
            self._outages.record_up(name)
            for offset, result in committed.items():
                results[pending[offset]] = result
            break
        return [results[i] for i in range(len(items))]

    def _fail(
        self, pending: list[int], results: dict[int, DeliveryResult], error: DatabaseError
    ) -> None:
        outage = isinstance(error, DatabaseUnavailable)
        if outage:
            self._outages.record_trouble(self._target.name, "unreachable", str(error))
        for position in pending:
            results[position] = Failed(str(error), outage=outage)

    def _heal(self, missing: BridgeTableMissing) -> str | None:
        """Create the missing ledger; None when done, else why it cannot be (for people).

        Raises DatabaseUnavailable when the database goes away meanwhile.
        """
        log.warning("database '%s': %s; creating it", self._target.name, missing.detail)
        target = self._target
        if not target.create_ledger:
            return missing.with_advice(RUNTIME_DDL_OFF_ADVICE).detail
        try:
            connection = self._connections.get(target.name)
            ensure_ledger(connection, target.config, target.name, create=True)
            return None
        except PermissionDenied as error:
            self._connections.discard(target.name)
            return missing.with_advice(cannot_create_advice(error.detail)).detail
        except DatabaseUnavailable:
            self._connections.discard(target.name)
            raise
        except DatabaseError as error:
            self._connections.discard(target.name)
            return f"{missing.detail}; creating it failed: {error.detail}"

    def _deliver_round(self, items: Sequence[Item]) -> dict[int, DeliveryResult]:
        retrying = Retrying(
            stop=stop_after_attempt(self._immediate_attempts),
            wait=_IMMEDIATE_RETRY_WAIT,
            retry=retry_if_exception_type((TransientDatabaseError, ConnectionLost)),
            before_sleep=self._before_immediate_retry,
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                return self._try_once(items)
        raise AssertionError("unreachable: tenacity re-raises the last error")

    def _try_once(self, items: Sequence[Item]) -> dict[int, DeliveryResult]:
        connection = self._connections.get(self._target.name)
        try:
            connection.begin()
            try:
                results = deliver_in_transaction(
                    connection, self._target.dialect, items, ledger=self._target.ledger
                )
            except NotIsolated:
                connection.rollback()
                connection.begin()
                results = deliver_in_transaction(
                    connection,
                    self._target.dialect,
                    items,
                    ledger=self._target.ledger,
                    one_by_one=True,
                )
            connection.commit()
            if not self._target.dialect.keep_destination_connections:
                self._connections.discard(self._target.name)
            return results
        except ItemWriteError as failure:
            connection.rollback()
            if isinstance(failure.error, QueueNotFound):
                raise self._missing_queue(connection, items, failure.position) from None
            failed = Failed(str(failure.error), retryable=failure.retryable)
            raise _Settled([failure.position], failed) from None
        except BridgeTableMissing:
            connection.rollback()
            raise
        except DatabaseError:
            self._connections.discard(self._target.name)
            raise

    def _missing_queue(
        self, connection: Connection, items: Sequence[Item], position: int
    ) -> _Settled:
        destination = items[position][1].destination
        offsets = [
            offset
            for offset, (_, decision) in enumerate(items)
            if decision.destination.address == destination.address
        ]
        failure = missing_queue_failure(
            connection, self._target.dialect, self._target.name, destination
        )
        connection.rollback()
        return _Settled(offsets, failure)

    def _before_immediate_retry(self, retry_state: object) -> None:
        log.info("transient error on database '%s'; retrying at once", self._target.name)
        self._connections.discard(self._target.name)


def missing_queue_failure(
    connection: Connection, dialect: Dialect, database: str, destination: Destination
) -> Failed:
    """A Failed result for a destination table that does not exist, with a nearest-match hint.

    Lists the tables through `connection`, which must be usable (rolled back to a savepoint
    or a fresh transaction); the caller rolls back afterwards.
    """
    hint = ""
    try:
        # The address lets SQL Server list the tables of the queue's catalog.
        listed = connection.query(dialect.sql("list_tables", queue=destination.address))
        tables = [row[1] for row in listed]
        suggestion = nearest_table(destination.address.table, tables)
        if suggestion and suggestion != destination.address.table:
            hint = f" (did you mean {suggestion!r}?)"
    except DatabaseError:
        pass
    return Failed(
        f"destination queue {destination.canonical} does not exist in database "
        f"'{database}'{hint}; create it (run the receiving endpoint with installers enabled) "
        "or fix the route or the destination header",
        missing_queue=True,
    )


class _Settled(Exception):
    """Some items of a round are settled (failed); the rest go round again."""

    def __init__(self, offsets: list[int], result: Failed) -> None:
        super().__init__(result.error)
        self.offsets = offsets
        self.result = result
