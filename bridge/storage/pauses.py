"""Pausing a forwarder, or its deliveries to one database, for planned maintenance.

The state is a row per pause in the forwarding database's `sfbridge_pauses` table, so every
daemon draining that queue obeys it and it survives restarts. A paused forwarder claims
nothing. A paused destination database gets nothing: its messages wait in retry storage
without spending attempts (as during an outage with `retries.during_outage: wait`, whatever
that setting is), and go once it is resumed.

Exact, not "within a second": every batch that claimed rows reads the pauses again in its own
source transaction, after its claim (`read_pauses_in_transaction`). A claim that saw a row sent
after the pause was committed ran after that commit, so the read after it sees the pause too:
the batch then puts every row back (a paused forwarder) or holds the paused database's messages.
Batches that claimed before the pause was committed finish as they are: `sfbridge pause` waits
for them where the database can say which they are (`in_flight_writers`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime

from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.storage.tables import ForwarderTables, owned_table

__all__ = [
    "Pause",
    "PauseBoard",
    "PauseState",
    "clear_pause",
    "in_flight_writers",
    "read_pauses",
    "read_pauses_in_transaction",
    "set_pause",
]

# The destination_database value of a pause of the whole forwarder.
WHOLE_FORWARDER = ""


@dataclass(frozen=True)
class Pause:
    """One pause: of the whole forwarder (`database` None) or of one destination database."""

    database: str | None
    paused_at: datetime
    reason: str | None

    def describe(self) -> str:
        because = f": {self.reason}" if self.reason else ""
        return f"paused since {self.paused_at:%Y-%m-%d %H:%M:%S} UTC{because}"


@dataclass(frozen=True)
class PauseState:
    pauses: tuple[Pause, ...] = ()

    @property
    def forwarder(self) -> Pause | None:
        return next((p for p in self.pauses if p.database is None), None)

    @property
    def destinations(self) -> dict[str, Pause]:
        return {p.database: p for p in self.pauses if p.database is not None}


def read_pauses(
    connection: Connection, dialect: Dialect, tables: ForwarderTables, forwarder: str
) -> PauseState:
    """The forwarder's pauses, read in a transaction of their own. Raises BridgeTableMissing
    when the table is missing, and the DatabaseError family.

    The read is ended with a rollback: it wrote nothing, and a commit here would be one more
    commit on the forwarding connection between batches for no reason.
    """
    try:
        connection.begin_read()
        return read_pauses_in_transaction(connection, dialect, tables, forwarder)
    finally:
        connection.rollback()


def read_pauses_in_transaction(
    connection: Connection, dialect: Dialect, tables: ForwarderTables, forwarder: str
) -> PauseState:
    """The forwarder's pauses, read in the caller's open transaction (a batch's, after its
    claim). Raises BridgeTableMissing when the table is missing, and the DatabaseError family."""
    with owned_table("pauses", dialect.grammar.render(tables.pauses)):
        rows = connection.query(dialect.sql("pauses_read", pauses=tables.pauses), (forwarder,))
    return PauseState(
        tuple(
            Pause(
                None if database == WHOLE_FORWARDER else str(database),
                _timestamp(dialect, paused_at),
                reason,
            )
            for database, paused_at, reason in rows
        )
    )


def set_pause(
    connection: Connection,
    dialect: Dialect,
    tables: ForwarderTables,
    forwarder: str,
    database: str | None,
    reason: str | None,
    now: datetime,
) -> None:
    """Pause the forwarder (`database` None) or its deliveries to `database`; pausing again
    keeps the time the pause began and takes the new reason."""
    _write(
        connection,
        dialect,
        tables,
        "pause_set",
        (forwarder, database or WHOLE_FORWARDER, dialect.encode_timestamp(now), reason),
    )


def clear_pause(
    connection: Connection,
    dialect: Dialect,
    tables: ForwarderTables,
    forwarder: str,
    database: str | None,
) -> bool:
    """Resume; False when it was not paused."""
    return (
        _write(connection, dialect, tables, "pause_clear", (forwarder, database or WHOLE_FORWARDER))
        > 0
    )


def in_flight_writers(
    connection: Connection, dialect: Dialect, tables: ForwarderTables
) -> set[str] | None:
    """The transactions of other sessions that write the forwarder's queue or retry storage
    now (the batches in flight, and senders' and other forwarders' writes), by an id of the
    database's; None when the dialect cannot tell (`in_flight_writers` is optional). Read in a
    transaction of its own."""
    if "in_flight_writers" not in dialect.statements:
        return None
    try:
        connection.begin_read()
        rows = connection.query(
            dialect.sql("in_flight_writers", None, queue=tables.queue, retry=tables.retry)
        )
    finally:
        connection.rollback()
    return {str(row[0]) for row in rows}


def _write(
    connection: Connection,
    dialect: Dialect,
    tables: ForwarderTables,
    statement: str,
    parameters: tuple[object, ...],
) -> int:
    try:
        connection.begin()
        with owned_table("pauses", dialect.grammar.render(tables.pauses)):
            count = connection.execute(dialect.sql(statement, pauses=tables.pauses), parameters)
        connection.commit()
    except BaseException:
        connection.rollback()
        raise
    return count


def _timestamp(dialect: Dialect, value: object) -> datetime:
    decoded = dialect.decode_timestamp(value)
    assert decoded is not None  # the column is NOT NULL
    return decoded


@dataclass
class PauseBoard:
    """A worker's view of its forwarder's pauses, read again at most every `interval` s."""

    interval: float
    state: PauseState = field(default_factory=PauseState)
    _read_at: float | None = None

    def stale(self) -> bool:
        return self._read_at is None or time.monotonic() - self._read_at >= self.interval

    def update(self, state: PauseState) -> None:
        self.state = state
        self._read_at = time.monotonic()
