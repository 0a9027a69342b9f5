"""Settling what a crash left between two databases (see `bridge.forwarding.transactions`).

- **Prepared transactions in doubt** (`transaction: two-phase`): every prepared transaction in
  a two-phase destination whose gid names a forwarding database of this config is settled by
  its decision there. The decision is read by trying to record an abort: the insert waits for
  a batch still inserting the same gid (its source transaction is still open) and is then
  given up for now; it succeeds where nothing was decided (the source rolled back) and the
  transaction is rolled back; where a decision is already there, that decision is carried
  out. Decisions whose transaction is no longer prepared are forgotten afterwards, read
  *before* the list of prepared transactions, so that one still being committed is never
  forgotten early.
- **At-least-once records left behind**: a record in flight that no batch holds any more,
  older than a few seconds, means its batch ended between a destination commit that happened
  (or got no answer) and the source commit, or died just before: its messages are counted as
  suspected duplicates (counter `suspected_duplicates` of its forwarder, a warning naming
  every MessageId) and the record is dropped. Records of commits known not to have happened
  are dropped by their batch (`BatchTransactions.forget_not_committed`), not counted.

Run by the daemon at start and once per retry delay, and by `sfbridge check` (report only).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from bridge.addressing import TableAddress
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import Dialect, dialect_for
from bridge.dialects.base import COUNTERS_TABLE, TRANSACTIONS_TABLE
from bridge.drivers import Connection
from bridge.exceptions import DatabaseError, LockTimeout, TableNotFound, UndefinedObject
from bridge.forwarding.transactions import ABORT, COMMIT, GID_PREFIX, gid_pattern
from bridge.messages import utcnow

log = logging.getLogger(__name__)

# An in-flight record is this old at least before it counts as left behind (a live batch
# holds its own record a round trip after writing it).
ORPHAN_AGE = timedelta(seconds=5)
# A prepared transaction younger than this (seconds) when settled may be a live batch's, decided
# and about to be committed by it (seen behind PgBouncer on a loaded machine): settling it is
# right either way, but it is not said to be left by a batch that did not finish.
PREPARED_GRACE = 5.0
SUSPECTED_DUPLICATES = "suspected_duplicates"
# Prepared transactions older than this are reported by `check` and `status`.
PREPARED_REPORT_AGE = 60.0
# The daemon settles once per retry delay, and at least this often (seconds).
SETTLE_INTERVAL_MAX = 10.0
# The counters row the sweep adds to (workers use their own slot numbers, from 0).
SWEEP_COUNTER_SLOT = -1


@dataclass
class Resolved:
    """What one round did."""

    committed: int = 0
    rolled_back: int = 0
    undecided: int = 0  # a batch was still deciding: left for the next round
    suspected_duplicates: Counter[str] = field(default_factory=Counter)  # by forwarder
    problems: list[str] = field(default_factory=list)


def two_phase_destinations(config: BridgeConfig, source: str) -> list[str]:
    """Databases that forwarders in `source` reach with `transaction: two-phase`."""
    return sorted(
        {
            target
            for origin, target, mode in config.crossings()
            if origin == source and mode == "two-phase"
        }
    )


def needs_resolving(config: BridgeConfig) -> bool:
    """Whether some forwarder of `config` crosses into another database with `two-phase` or
    `at-least-once` from a database that keeps transaction records."""
    recording = set(recording_databases(config))
    return any(mode != "ledger" and origin in recording for origin, _, mode in config.crossings())


def recording_databases(config: BridgeConfig) -> list[str]:
    """Forwarding databases whose dialect keeps transaction records."""
    names = {f.database for f in config.forwarders}
    return sorted(n for n in names if dialect_for(config.databases[n].dialect).records_transactions)


def resolve_in_doubt(config: BridgeConfig, connections: Connections) -> Resolved:
    """One round over every forwarding database of `config`. Database errors are logged and
    reported in `Resolved.problems`; a database that cannot be reached waits for the next."""
    settled = Resolved()
    for source in recording_databases(config):
        dialect = dialect_for(config.databases[source].dialect)
        table = dialect.bridge_table(TRANSACTIONS_TABLE, config.databases[source].schema)
        counters = dialect.bridge_table(COUNTERS_TABLE, config.databases[source].schema)
        try:
            connection = connections.get(source)
            _sweep_in_flight(connection, dialect, table, counters, settled)
            store = _read_store(connection, dialect, table)
        except TableNotFound:
            connections.discard(source)
            continue  # no records yet: nothing was ever left
        except DatabaseError as error:
            connections.discard(source)
            settled.problems.append(str(error))
            continue
        if store is None:
            continue
        for destination in two_phase_destinations(config, source):
            try:
                _resolve_destination(
                    connection, dialect, table, connections, config, destination, store, settled
                )
            except DatabaseError as error:
                connections.discard(destination)
                connections.discard(source)
                settled.problems.append(str(error))
                break
    return settled


def _read_store(connection: Connection, dialect: Dialect, table: TableAddress) -> str | None:
    connection.begin_read()
    try:
        rows = connection.query(dialect.sql("store_id_read", transactions=table))
    finally:
        connection.rollback()
    return str(rows[0][0]) if rows else None


def _resolve_destination(
    source: Connection,
    dialect: Dialect,
    table: TableAddress,
    connections: Connections,
    config: BridgeConfig,
    database: str,
    store: str,
    settled: Resolved,
) -> None:
    target = connections.get(database)
    target_dialect = dialect_for(config.databases[database].dialect)
    # Decisions first, then what is prepared (see the module docstring).
    source.begin_read()
    decided = source.query(dialect.sql("transactions_decided", transactions=table), (database,))
    source.rollback()
    prepared = _prepared(target, target_dialect, store)
    for gid, age in sorted(prepared.items()):
        outcome = _decision(source, dialect, table, gid, database)
        if outcome is None:
            settled.undecided += 1
            continue
        statement = "commit_prepared" if outcome == COMMIT else "rollback_prepared"
        try:
            target.execute_outside_transaction(target_dialect.with_gid(statement, gid))
        except UndefinedObject:
            pass  # settled meanwhile (by its batch or another daemon), the same way
        if outcome == COMMIT:
            settled.committed += 1
        else:
            settled.rolled_back += 1
        done = "committed" if outcome == COMMIT else "rolled back"
        if age >= PREPARED_GRACE:
            log.warning(
                "database '%s': %s the prepared transaction %s left by a batch that did not finish",
                database,
                done,
                gid,
            )
        else:
            log.info(
                "database '%s': %s the prepared transaction %s, prepared %.1f s ago (its batch "
                "may have been about to)",
                database,
                done,
                gid,
                age,
            )
        _forget(source, dialect, table, [gid])
    still = _prepared(target, target_dialect, store)
    _forget(source, dialect, table, [str(gid) for gid, _ in decided if gid not in still])


def _prepared(connection: Connection, dialect: Dialect, store: str) -> dict[str, float]:
    """The store's prepared transactions in the destination, and their age in seconds."""
    connection.rollback()
    rows = connection.query(dialect.sql("prepared_transactions"), (gid_pattern(store),))
    connection.rollback()
    return {str(gid): float(age) for gid, age in rows}


def _decision(
    source: Connection, dialect: Dialect, table: TableAddress, gid: str, database: str
) -> str | None:
    """The decision for `gid`: recorded as abort unless one is there; None while a batch
    that may still decide holds it."""
    now = dialect.encode_timestamp(utcnow())
    try:
        source.begin()
        source.execute(dialect.sql("lock_timeout"))
        recorded = source.execute(
            dialect.sql("transaction_record_unless_decided", transactions=table),
            (gid, ABORT, "", database, now),
        )
        if recorded:
            outcome = ABORT
        else:
            rows = source.query(dialect.sql("transaction_read", transactions=table), (gid,))
            outcome = str(rows[0][0]) if rows else ABORT
        source.commit()
        return outcome
    except LockTimeout:
        source.rollback()  # the lock timeout: the batch that prepared it is still running
        return None
    except BaseException:
        source.rollback()
        raise


def _forget(source: Connection, dialect: Dialect, table: TableAddress, gids: list[str]) -> None:
    if not gids:
        return
    try:
        source.begin()
        for gid in gids:
            source.execute(dialect.sql("transaction_forget", transactions=table), (gid,))
        source.commit()
    except BaseException:
        source.rollback()
        raise


def _sweep_in_flight(
    connection: Connection,
    dialect: Dialect,
    table: TableAddress,
    counters: TableAddress,
    settled: Resolved,
) -> None:
    cutoff = dialect.encode_timestamp(utcnow() - ORPHAN_AGE)
    try:
        connection.begin()
        rows = connection.query(
            dialect.sql("transactions_orphaned", transactions=table),
            (cutoff,),
        )
        for gid, forwarder, database, ids in rows:
            message_ids = [i for i in str(ids or "").split("\n") if i]
            settled.suspected_duplicates[str(forwarder)] += len(message_ids)
            log.warning(
                "forwarder '%s': %d message(s) may have been delivered twice to database '%s' "
                "(transaction: at-least-once; a batch ended between the destination and source "
                "commits): %s",
                forwarder,
                len(message_ids),
                database,
                ", ".join(message_ids),
            )
            connection.execute(dialect.sql("transaction_forget", transactions=table), (gid,))
            connection.execute(
                dialect.sql("counters_add", counters=counters),
                (str(forwarder), SUSPECTED_DUPLICATES, SWEEP_COUNTER_SLOT, len(message_ids)),
            )
        connection.commit()
    except BaseException:
        connection.rollback()
        raise


def all_two_phase_destinations(config: BridgeConfig) -> list[str]:
    """Every database some forwarder of `config` reaches with `transaction: two-phase`."""
    return sorted({target for _, target, mode in config.crossings() if mode == "two-phase"})


def old_prepared_transactions(
    config: BridgeConfig, connections: Connections, older_than: float | None = None
) -> tuple[list[dict[str, object]], list[str]]:
    """The bridge's prepared transactions older than `older_than` seconds in two-phase
    destinations (database, gid, age in seconds), and the databases that could not be read."""
    threshold = PREPARED_REPORT_AGE if older_than is None else older_than
    found: list[dict[str, object]] = []
    unreadable: list[str] = []
    for database in all_two_phase_destinations(config):
        dialect = dialect_for(config.databases[database].dialect)
        try:
            connection = connections.get(database)
            rows = connection.query(dialect.sql("prepared_transactions"), (f"{GID_PREFIX}:%",))
            connection.rollback()
        except DatabaseError:
            connections.discard(database)
            unreadable.append(database)
            continue
        found.extend(
            {"database": database, "gid": str(gid), "age_seconds": round(float(age), 1)}
            for gid, age in rows
            if float(age) >= threshold
        )
    return found, unreadable


def max_prepared_transactions(connection: Connection, dialect: Dialect) -> int:
    rows = connection.query(dialect.sql("max_prepared_transactions"))
    connection.rollback()
    return int(rows[0][0])
