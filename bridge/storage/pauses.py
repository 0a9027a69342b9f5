"""Pausing a forwarder, or its deliveries to one database, for planned maintenance.

The state is a row per pause in the forwarding database's `sfbridge_pauses` table, so every
daemon draining that queue obeys it (each reads it once per peek interval) and it survives
restarts. A paused forwarder claims nothing. A paused destination database gets nothing: its
messages wait in retry storage without spending attempts (as during an outage with
`retries.during_outage: wait`, whatever that setting is), and go once it is resumed.
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
    "read_pauses",
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
        with owned_table("pauses", dialect.grammar.render(tables.pauses)):
            rows = connection.query(dialect.sql("pauses_read", pauses=tables.pauses), (forwarder,))
    finally:
        connection.rollback()
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
