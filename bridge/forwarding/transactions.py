"""How a batch's deliveries into other databases end, per transaction mode, on the source side.

`ledger` needs nothing here: the destination commits with its ledger rows, then the source.
The other two modes keep records in the forwarding database's transactions table:

- **two-phase**: the destination's work is prepared (`PREPARE TRANSACTION gid`) instead of
  committed. Just before, the decision to commit is recorded under that gid *inside the open
  source transaction*; so it becomes durable with the source commit, atomically with the
  claim. After the source commit the prepared transaction is committed. A crash anywhere
  leaves a prepared transaction whose fate the source knows: committed decision -> commit it;
  no decision (the source rolled back) -> roll it back. `bridge.forwarding.in_doubt` settles those.
  A prepare that fails, or whose outcome is unknown (the connection broke during it), takes
  its decision back in the source transaction: if it was prepared after all, it is rolled
  back as undecided, and its messages are still where the source keeps them.
- **at-least-once**: no ledger. Before the destination commits, a record of the messages in
  flight is committed on a second connection to the forwarding database, then deleted inside
  the source transaction (which holds its lock until the source commits). A crash between the
  destination and source commits leaves the record there and unlocked: those messages come
  back and are delivered again, and `bridge.forwarding.in_doubt` counts them as suspected
  duplicates. Only what may really be twice there is counted: a record whose destination
  commit is known not to have happened (the record's own commit or the source failed before
  the COMMIT went out, or the server answered the COMMIT with an error) is dropped again
  when the source transaction does not commit (`forget_not_committed`); a COMMIT that went
  out and got no answer (`DatabaseError.outcome_unknown`) keeps its record, and its message
  ids are logged at once.

Global transaction ids are `sfbridge:<store>:<random>`, `<store>` being a random id kept in the
forwarding database's transactions table, so every daemon knows which prepared transactions
are its own to settle, and where their decisions are.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from bridge.addressing import TableAddress
from bridge.connections import Connections
from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.exceptions import DatabaseError, UndefinedObject
from bridge.messages import Item, utcnow
from bridge.storage.tables import owned_table

log = logging.getLogger(__name__)


class SourceFailed(Exception):
    """A statement on the forwarding database failed while a destination was being finished:
    the batch fails as a whole (`error` is what the source raised), not the destination."""

    def __init__(self, error: DatabaseError) -> None:
        super().__init__(str(error))
        self.error = error


class DestinationNotReady(Exception):
    """The destination cannot take this mode now (e.g. prepared transactions are off there):
    a state, like an outage, with what a person should do."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


GID_PREFIX = "sfbridge"
TRANSACTIONS_DESCRIPTION = "transactions table"
# outcome column values
COMMIT, ABORT, IN_FLIGHT, STORE = "C", "A", "P", "S"
# The second connection to the forwarding database, for records committed apart from a batch.
RECORDS_ROLE = "records"
# Tries at dropping the records of commits that did not happen (`forget_not_committed`).
FORGET_ATTEMPTS = 3


def gid_pattern(store: str) -> str:
    """A LIKE pattern matching the gids of one forwarding database."""
    return f"{GID_PREFIX}:{store}:%"


def new_gid(store: str) -> str:
    return f"{GID_PREFIX}:{store}:{secrets.token_hex(16)}"


def store_id(connection: Connection, dialect: Dialect, table: TableAddress) -> str:
    """The forwarding database's store id, made on first use. Committed on its own (never in a
    batch: a gid must not outlive the id it names). `connection` has no transaction open."""
    try:
        with owned_table(TRANSACTIONS_DESCRIPTION, dialect.grammar.render(table)):
            connection.begin()
            connection.execute(
                dialect.sql("store_id_claim", transactions=table),
                (dialect.encode_timestamp(utcnow()), secrets.token_hex(8)),
            )
            rows = connection.query(dialect.sql("store_id_read", transactions=table))
            connection.commit()
    except BaseException:
        connection.rollback()
        raise
    return str(rows[0][0])


@dataclass
class BatchTransactions:
    """The source side of one batch's two-phase and at-least-once deliveries.

    `source` is the batch's open source transaction; `records` opens the second connection to
    the forwarding database. `prepared` lists (database, gid) to commit after the source
    commits; `in_flight` the at-least-once records the source transaction holds.
    """

    source: Connection
    dialect: Dialect
    table: TableAddress
    forwarder: str
    connections: Connections
    forwarding_database: str
    store: str | None = None
    prepared: list[tuple[str, str]] = field(default_factory=list)
    in_flight: int = 0
    # In-flight records whose destination commit is known not to have happened.
    not_committed: list[str] = field(default_factory=list)

    # -- two-phase ---------------------------------------------------------------------------

    def prepare(self, destination: Connection, dialect: Dialect, database: str) -> None:
        """End `destination`'s open transaction with PREPARE TRANSACTION, its commit decision
        recorded in the source transaction first. Raises what the destination raised (its
        decision taken back), SourceFailed for the source."""
        gid = new_gid(self._store())
        self._source(
            "transaction_record",
            (gid, COMMIT, self.forwarder, database, self.dialect.encode_timestamp(utcnow()), None),
        )
        try:
            destination.execute(dialect.with_gid("prepare_transaction", gid))
            # Nothing is open any more; psqlODBC still thinks a transaction is and needs
            # telling (the COMMIT draws only a warning), psycopg knows.
            destination.commit()
        except BaseException:
            self._source("transaction_forget", (gid,))
            raise
        self.prepared.append((database, gid))

    def commit_prepared(self, dialects: dict[str, Dialect]) -> int:
        """After the source commit: commit every prepared transaction of the batch. One that
        cannot be committed now stays prepared, with its decision, for `bridge.forwarding.in_doubt`.
        Returns how many were left so."""
        left = 0
        for database, gid in self.prepared:
            try:
                connection = self.connections.get(database)
                connection.execute_outside_transaction(
                    dialects[database].with_gid("commit_prepared", gid)
                )
            except UndefinedObject:
                pass  # a resolver committed it meanwhile, after reading the same decision
            except DatabaseError as error:
                left += 1
                self.connections.discard(database)
                log.warning(
                    "database '%s': prepared transaction %s not committed yet (%s); it is "
                    "committed when the database is back",
                    database,
                    gid,
                    error,
                )
        self.prepared.clear()
        return left

    def _store(self) -> str:
        if self.store is None:
            try:
                records = self.connections.get(self.forwarding_database, RECORDS_ROLE)
                self.store = store_id(records, self.dialect, self.table)
            except DatabaseError as error:
                self.connections.discard(self.forwarding_database, RECORDS_ROLE)
                raise SourceFailed(error) from None
        return self.store

    # -- at-least-once -----------------------------------------------------------------------

    def record_in_flight(self, database: str, items: Sequence[Item]) -> str | None:
        """Record `items` as in flight to `database` (committed apart), then lock the record
        in the source transaction by deleting it there. None where the forwarding database
        keeps no records (SQLite: one writer at a time, so nothing can commit apart from the
        open batch); a crash between the commits then goes uncounted. Raises SourceFailed,
        the record then known to stand for nothing committed (`not_committed`)."""
        if not self.dialect.records_transactions:
            return None
        gid = new_gid("in-flight")
        now = self.dialect.encode_timestamp(utcnow())
        try:
            records = self.connections.get(self.forwarding_database, RECORDS_ROLE)
            with owned_table(TRANSACTIONS_DESCRIPTION, self.dialect.grammar.render(self.table)):
                records.begin()
                records.execute(
                    self.dialect.sql("transaction_record", transactions=self.table),
                    (gid, IN_FLIGHT, self.forwarder, database, now, _message_ids(items)),
                )
                records.commit()
        except DatabaseError as error:
            # Its commit may have gone through: the record must not outlive the batch.
            self.not_committed.append(gid)
            self.connections.discard(self.forwarding_database, RECORDS_ROLE)
            raise SourceFailed(error) from None
        try:
            self._source("transaction_forget", (gid,))
        except SourceFailed:
            self.not_committed.append(gid)
            raise
        self.in_flight += 1
        return gid

    def commit_in_flight(
        self, destination: Connection, database: str, items: Sequence[Item]
    ) -> None:
        """Commit `destination`'s open transaction, which wrote `items` into `database`, with
        their record in flight (`record_in_flight`): kept when the COMMIT went out and got no
        answer (`keep_in_flight`), else, the commit failing, noted as `not_committed`."""
        gid = self.record_in_flight(database, items)
        try:
            destination.commit()
        except DatabaseError as error:
            if gid is None:
                raise
            if error.outcome_unknown:
                log.warning(
                    "forwarder '%s': the commit into database '%s' got no answer (%s), so "
                    "whether %d message(s) were delivered there is unknown; they are delivered "
                    "again and counted as suspected duplicates (transaction: at-least-once): %s",
                    self.forwarder,
                    database,
                    error.detail,
                    len(items),
                    _message_ids(items, ", "),
                )
                self.keep_in_flight(gid, database, items)
            else:
                self.not_committed.append(gid)
            raise

    def keep_in_flight(self, gid: str, database: str, items: Sequence[Item]) -> None:
        """The destination commit failed without saying whether it happened: put the record
        back in the source transaction, so that it outlives the batch and is counted."""
        now = self.dialect.encode_timestamp(utcnow())
        self._source(
            "transaction_record",
            (gid, IN_FLIGHT, self.forwarder, database, now, _message_ids(items)),
        )

    def forget_not_committed(self) -> None:
        """After the source transaction ended without committing: drop the records of
        destination commits known not to have happened, which the rollback brought back (the
        source had deleted them). Best effort, on the records connection: one left behind is
        counted as suspected duplicates by `bridge.forwarding.in_doubt`, and said so here."""
        gids, self.not_committed = self.not_committed, []
        if not gids:
            return
        records_failure: DatabaseError | None = None
        for _ in range(FORGET_ATTEMPTS):
            try:
                records = self.connections.get(self.forwarding_database, RECORDS_ROLE)
                with owned_table(TRANSACTIONS_DESCRIPTION, self.dialect.grammar.render(self.table)):
                    records.begin()
                    if "lock_timeout" in self.dialect.statements:
                        # A source whose connection the server has not seen break yet may
                        # still hold a record's lock: give up soon rather than wait for it.
                        records.execute(self.dialect.sql("lock_timeout"))
                    for gid in gids:
                        records.execute(
                            self.dialect.sql("transaction_forget", transactions=self.table),
                            (gid,),
                        )
                    records.commit()
                return
            except DatabaseError as error:
                records_failure = error
                self.connections.discard(self.forwarding_database, RECORDS_ROLE)
        log.warning(
            "forwarder '%s': %d record(s) of messages known not delivered could not be "
            "dropped (%s); their messages may be counted as suspected duplicates",
            self.forwarder,
            len(gids),
            records_failure,
        )

    def _source(self, name: str, parameters: tuple[object, ...]) -> None:
        try:
            with owned_table(TRANSACTIONS_DESCRIPTION, self.dialect.grammar.render(self.table)):
                self.source.execute(self.dialect.sql(name, transactions=self.table), parameters)
        except DatabaseError as error:
            raise SourceFailed(error) from None


def _message_ids(items: Sequence[Item], separator: str = "\n") -> str:
    """The items' MessageIds (`NServiceBus.MessageId`, else the row's Id), as a record keeps
    them (one a line) or a log names them."""
    return separator.join(decision.message_id for _, decision in items)


def require_prepared_transactions(connection: Connection, dialect: Dialect, database: str) -> None:
    """Raises DestinationNotReady where PostgreSQL's prepared transactions are off, so that
    `two-phase` cannot prepare there."""
    rows = connection.query(dialect.sql("max_prepared_transactions"))
    if int(rows[0][0]) > 0:
        return
    raise DestinationNotReady(
        f"database '{database}' has max_prepared_transactions = 0, so "
        "'transaction: two-phase' cannot prepare there: set it above 0 (for example "
        "max_prepared_transactions = 100 in postgresql.conf) and restart PostgreSQL, or "
        "choose another transaction mode for its routes"
    )
