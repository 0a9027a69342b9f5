"""How much a forwarder holds: its queue and its retry storage, counted in one read transaction
(for `sfbridge status` and the metrics; its error queue, which it may share, is counted per
forwarder by `bridge.storage.error_counts`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.dialects import dialect_for
from bridge.drivers import Connection
from bridge.exceptions import PoisonHeaders, TableNotFound
from bridge.headers import TIME_SENT_HEADER, parse_headers, parse_wire_date
from bridge.storage.pauses import PauseState, read_pauses
from bridge.storage.tables import forwarder_tables


@dataclass(frozen=True)
class QueueDepths:
    """How much one forwarder holds: its queue and its retry storage."""

    queued: int
    oldest_age_seconds: float | None  # of the oldest queued message, by its TimeSent
    # Retry storage per destination: the `retry_summary` rows (destination, messages,
    # failing since, next attempt, most attempts made, last error, destination database).
    retry_summary: tuple[tuple[Any, ...], ...]

    @property
    def waiting_for_retry(self) -> int:
        return sum(int(row[1]) for row in self.retry_summary)

    def held_by(self, pauses: PauseState) -> int:
        """How many of the retries wait for a pause, not a failure: all of them while the whole
        forwarder is paused, else those for a paused destination database."""
        if pauses.forwarder is not None:
            return self.waiting_for_retry
        paused = pauses.destinations
        return sum(int(row[1]) for row in self.retry_summary if row[6] in paused)


def read_queue_depths(
    config: BridgeConfig, forwarder: ForwarderConfig, connection: Connection
) -> QueueDepths:
    """Counts the forwarder's queues in one read transaction. Raises the DatabaseError family
    (TableNotFound when a table is missing)."""
    dialect = dialect_for(config.databases[forwarder.database].dialect)
    tables = forwarder_tables(config, forwarder)
    try:
        connection.begin_read()
        queued = connection.query(dialect.sql("queue_count", queue=tables.queue))[0][0]
        oldest = connection.query(dialect.sql("queue_oldest_headers", queue=tables.queue))
        retries = connection.query(
            dialect.sql("retry_summary", retry=tables.retry), (forwarder.name,)
        )
    finally:
        connection.rollback()  # it only read
    return QueueDepths(
        queued=int(queued),
        oldest_age_seconds=_age_of(oldest[0][0]) if oldest else None,
        retry_summary=tuple(tuple(row) for row in retries),
    )


def read_pause_state(
    config: BridgeConfig, forwarder: ForwarderConfig, connection: Connection
) -> PauseState:
    """The forwarder's pauses; none when the table is not there yet (made on first pause)."""
    dialect = dialect_for(config.databases[forwarder.database].dialect)
    try:
        return read_pauses(connection, dialect, forwarder_tables(config, forwarder), forwarder.name)
    except TableNotFound:
        return PauseState()


def _age_of(headers_text: str | None) -> float | None:
    try:
        sent = parse_headers(headers_text).get(TIME_SENT_HEADER)
    except PoisonHeaders:
        return None
    moment = parse_wire_date(sent) if sent else None
    if moment is None:
        return None
    return max(0.0, (datetime.now(UTC) - moment).total_seconds())
