"""Pausing a forwarder, or its deliveries to one database, for planned maintenance.

The state is a row per pause in the forwarding database's `sfbridge_pauses` table, so every
daemon draining that queue obeys it (each reads it once per peek interval) and it survives
restarts. A paused forwarder claims nothing. A paused destination database gets nothing: its
messages wait in retry storage without spending attempts (as during an outage with
`retries.during_outage: wait`, whatever that setting is), and go once it is resumed.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.connections import connect
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import Connection
from bridge.ledger import RUNTIME_DDL_OFF_ADVICE
from bridge.messages import DeliveryResult, Failed, Item
from bridge.tables import (
    BridgeTableMissing,
    ForwarderTables,
    create_tables,
    forwarder_table_steps,
    forwarder_tables,
    owned_table,
)

__all__ = [
    "Pause",
    "PauseBoard",
    "PauseRequestError",
    "PauseState",
    "PausedDelivery",
    "change_pause",
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


class PausedDelivery:
    """The delivery to a paused destination database: nothing is tried, every item waits."""

    def __init__(self, database: str, pause: Pause) -> None:
        self._error = f"database '{database}' is {pause.describe()} (sfbridge resume)"

    def deliver(self, items: Sequence[Item]) -> list[DeliveryResult]:
        return [Failed(self._error, paused=True)] * len(items)


# -- `sfbridge pause` / `sfbridge resume` ---------------------------------------------------


class PauseRequestError(ValueError):
    """A pause or resume that names a forwarder or database the config does not have."""


def change_pause(
    config: BridgeConfig,
    forwarder_name: str,
    database: str | None,
    *,
    pause: bool,
    reason: str | None = None,
) -> str:
    """Pause or resume; returns what happened, for a person. Raises PauseRequestError for an
    unknown name, BridgeTableMissing when the pauses table is missing and may not be created,
    and the DatabaseError family."""
    names = [f.name for f in config.forwarders]
    if forwarder_name not in names:
        raise PauseRequestError(
            f"no forwarder named {forwarder_name!r}{_nearest(forwarder_name, names)}"
        )
    if database is not None and database not in config.databases:
        raise PauseRequestError(
            f"no database named {database!r}{_nearest(database, list(config.databases))}"
        )
    forwarder = config.forwarder(forwarder_name)
    dialect = dialect_for(config.databases[forwarder.database].dialect)
    tables = forwarder_tables(config, forwarder)
    connection = connect(config.databases[forwarder.database])
    try:
        changed = _with_pauses_table(
            config,
            forwarder,
            connection,
            lambda: _apply(connection, dialect, tables, forwarder_name, database, pause, reason),
        )
    finally:
        connection.close()
    what = f"forwarder '{forwarder_name}'" + (
        f" deliveries to database '{database}'" if database else ""
    )
    within = f"every daemon on its queue obeys within {forwarder.slow_poll_interval:g} s"
    if pause:
        held = (
            "its messages for that database wait in retry storage, spending no attempts"
            if database
            else "it claims nothing from its queue or retry storage"
        )
        return f"paused {what}: {held}; {within}. Undo with 'sfbridge resume {forwarder_name}" + (
            f" --destination {database}'" if database else "'"
        )
    if not changed:
        return f"{what} was not paused; nothing to do"
    return f"resumed {what}; {within}"


def _apply(
    connection: Connection,
    dialect: Dialect,
    tables: ForwarderTables,
    forwarder: str,
    database: str | None,
    pause: bool,
    reason: str | None,
) -> bool:
    if pause:
        now = datetime.now(UTC).replace(tzinfo=None)
        set_pause(connection, dialect, tables, forwarder, database, reason, now)
        return True
    return clear_pause(connection, dialect, tables, forwarder, database)


def _with_pauses_table(
    config: BridgeConfig,
    forwarder: ForwarderConfig,
    connection: Connection,
    action: Callable[[], bool],
) -> bool:
    """`action()`, creating the forwarder's missing tables first when allowed."""
    try:
        return action()
    except BridgeTableMissing as missing:
        if not config.install.at_runtime:
            raise missing.with_advice(RUNTIME_DDL_OFF_ADVICE) from None
        dialect = dialect_for(config.databases[forwarder.database].dialect)
        create_tables(
            connection, dialect, forwarder_table_steps(config, forwarder), only_missing=True
        )
        return action()


def _nearest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (known: {', '.join(sorted(known))})"
