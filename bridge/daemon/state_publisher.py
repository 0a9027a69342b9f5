"""The daemon's side of `bridge.storage.destination_states`: writing its outage tracker's and
forwarder health's states into every forwarding database, on change and every
`HEARTBEAT_SECONDS`, so that `sfbridge status`, another process, can show them."""

from __future__ import annotations

import logging
import time
from typing import Any

from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.daemon.forwarder_health import ForwarderHealth, ForwarderState
from bridge.dialects import dialect_for
from bridge.drivers import Connection
from bridge.exceptions import DatabaseError, TableNotFound
from bridge.messages import utcnow
from bridge.outages import OutageTracker
from bridge.storage.daemons import this_daemon
from bridge.storage.tables import (
    create_tables,
    forwarder_table_steps,
    forwarder_tables,
    log_created,
)

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 30.0


class StatePublisher:
    """Writes the tracker's states into every forwarding database; one per daemon."""

    def __init__(
        self, config: BridgeConfig, tracker: OutageTracker, health: ForwarderHealth | None = None
    ) -> None:
        self._config = config
        self._tracker = tracker
        self._health = health
        self._published_version: tuple[int, int] = (-1, -1)
        self._published_at = 0.0
        self._reporter = this_daemon()  # who wrote a state row: host and process id

    def publish(self, *, force: bool = False) -> None:
        """Write the states if they changed (or the heartbeat is due). Never raises."""
        version = (self._tracker.version, self._health.version if self._health else 0)
        due = time.monotonic() - self._published_at >= HEARTBEAT_SECONDS
        if not (force or due or version != self._published_version):
            return
        states = self._tracker.states()
        health = {state.forwarder: state for state in self._health.states()} if self._health else {}
        if not states and not health:
            return
        connections = Connections(self._config.databases, self._tracker)
        all_written = True
        try:
            for forwarder in _one_forwarder_per_database(self._config):
                forwarders = [
                    health[f.name]
                    for f in self._config.forwarders
                    if f.database == forwarder.database and f.name in health
                ]
                try:
                    self._write(connections.get(forwarder.database), forwarder, states, forwarders)
                except DatabaseError as error:
                    all_written = False
                    connections.discard(forwarder.database)
                    log.debug("states not written to '%s': %s", forwarder.database, error)
        finally:
            connections.close()
        if all_written:
            self._published_version, self._published_at = version, time.monotonic()

    def _write(
        self,
        connection: Connection,
        forwarder: Any,
        states: list[Any],
        forwarders: list[ForwarderState],
    ) -> None:
        dialect = dialect_for(self._config.databases[forwarder.database].dialect)
        tables = forwarder_tables(self._config, forwarder)
        statement = dialect.sql(
            "destination_state_save", destination_states=tables.destination_states
        )
        forwarder_statement = dialect.sql(
            "forwarder_state_save", forwarder_states=tables.forwarder_states
        )
        now = utcnow()
        for attempt in (1, 2):
            try:
                connection.begin()
                for health in forwarders:
                    connection.execute(
                        forwarder_statement,
                        (
                            health.forwarder,
                            self._reporter,
                            "failing" if health.failing else "ok",
                            dialect.encode_timestamp(health.since),
                            health.failures,
                            health.last_error,
                            dialect.encode_timestamp(now),
                        ),
                    )
                for state in states:
                    connection.execute(
                        statement,
                        (
                            state.database,
                            state.state,
                            dialect.encode_timestamp(state.since),
                            state.last_error,
                            dialect.encode_timestamp(state.next_probe_at),
                            dialect.encode_timestamp(now),
                            self._reporter,
                        ),
                    )
                connection.commit()
                return
            except TableNotFound:
                connection.rollback()
                if attempt == 2 or not self._config.install.at_runtime:
                    raise
                steps = forwarder_table_steps(self._config, forwarder)
                created = create_tables(connection, dialect, steps, only_missing=True)
                log_created(forwarder.name, forwarder.database, created)


def _one_forwarder_per_database(config: BridgeConfig) -> list[Any]:
    chosen: dict[str, Any] = {}
    for forwarder in config.forwarders:
        chosen.setdefault(forwarder.database, forwarder)
    return list(chosen.values())
