"""The daemon's side of `bridge.storage.daemons`: recording in every forwarding database that
this daemon runs, which configuration (its fingerprint) and which of the database's forwarders
it serves, every `daemon.heartbeat`, and that it stopped, when it stops cleanly.

Each forwarding database gets a heartbeat job of its own, so one that does not answer (a
write waits up to its connect and query timeouts) delays only its own row, never another
database's: there, this daemon would otherwise look missing while it runs.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

from bridge.config.fingerprint import config_fingerprint
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.daemon.readiness import Checks
from bridge.dialects import dialect_for
from bridge.exceptions import (
    BridgeTableMissing,
    DatabaseError,
    DatabaseUnavailable,
    TableNotFound,
)
from bridge.messages import utcnow
from bridge.outages import OutageTracker
from bridge.storage.daemons import (
    DaemonRecord,
    forget_daemons,
    save_daemon,
    served_forwarders,
    this_daemon,
    upgrade_daemons_table,
)
from bridge.storage.grants import lacking_right
from bridge.storage.tables import (
    create_tables,
    forwarder_table_steps,
    forwarder_tables,
    log_created,
)

log = logging.getLogger(__name__)


class Heartbeat:
    """One per daemon process; kept across reloads (the process, and its start, stay)."""

    def __init__(self, config: BridgeConfig) -> None:
        self.config = config
        self._fingerprint = config_fingerprint(config)
        self._started_at = utcnow()
        # Per database: its connection and a lock that keeps a heartbeat in flight and the
        # `stopped` record from overlapping (a late `running` after `stopped` would undo it).
        self._connections: dict[str, Connections] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._stopping = False
        self._introduced: set[str] = set()  # databases where earlier daemons were forgotten
        # Databases whose heartbeat failed and was logged: one warning per failure, not per
        # beat, and again once it recovered and failed anew.
        self._failing: set[str] = set()
        # The daemon's outage tracker, set by each start: no heartbeat logs in while the
        # database's login is refused (`bridge.connections.Connections`).
        self.logins: OutageTracker | None = None
        # Whether each database took the last heartbeat, and one in progress: what `/readyz`
        # calls served (`bridge.daemon.readiness`).
        self.checks = Checks()

    def forwarding_databases(self) -> list[str]:
        return list(dict.fromkeys(forwarder.database for forwarder in self.config.forwarders))

    def use_config(self, config: BridgeConfig) -> None:
        """A reload: a forwarding database the new configuration drops learns that this
        daemon stopped working on it."""
        for database in set(self.forwarding_databases()) - {f.database for f in config.forwarders}:
            self._record(database, "stopped")
        self.config = config
        self._fingerprint = config_fingerprint(config)

    def beat(self, database: str) -> None:
        """Record in `database` that this daemon runs (the scheduled job). Never raises."""
        self._record(database, "running")

    def stopped(self) -> None:
        """Record in every forwarding database that this daemon stopped; then close."""
        self._stopping = True
        for database in self.forwarding_databases():
            self._record(database, "stopped")
            with self._lock_of(database):
                self._connections.pop(database).close()

    def _lock_of(self, database: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(database, threading.Lock())

    def _record(self, database: str, state: str) -> None:
        with self._lock_of(database):
            if state == "running" and self._stopping:
                return
            connections = self._connections.setdefault(database, Connections(self.config.databases))
            connections.logins = self.logins
            if state == "running":
                self.checks.begin(database)
            try:
                self._write(connections, database, state)
            except DatabaseError as error:
                if state == "running":
                    self.checks.end(database, str(error))
                if database not in self._failing:
                    self._failing.add(database)
                    log.warning(
                        "heartbeat not written to database '%s' (%s): 'sfbridge status' will "
                        "show this daemon as missing there; %s",
                        database,
                        error,
                        # Unreachable: the outage is logged as such; asking again would wait
                        # out another connect timeout.
                        "it is written again once the database answers"
                        if isinstance(error, DatabaseUnavailable)
                        # The daemons table lacks what this sfbridge records, and the
                        # columns may not be added: the advice says who adds them.
                        else error.advice
                        if isinstance(error, BridgeTableMissing) and error.advice
                        else self._advice(connections, database),
                    )
                else:
                    log.debug("heartbeat not written to '%s': %s", database, error)
                connections.discard(database)
                return
            if state == "running":
                self.checks.end(database, None)
            if database in self._failing:
                self._failing.discard(database)
                log.info("heartbeat written to database '%s' again", database)

    def _advice(self, connections: Connections, database: str) -> str:
        """What to do about a heartbeat that failed: the GRANT the login lacks to create the
        daemons table when that is the cause, else where to look."""
        forwarder = next(f for f in self.config.forwarders if f.database == database)
        table = forwarder_tables(self.config, forwarder).daemons
        dialect = dialect_for(self.config.databases[database].dialect)
        rendered = dialect.grammar.render(table)
        try:
            connection = connections.get(database)
            exists = bool(
                connection.query(
                    dialect.sql("table_columns", queue=table), (table.schema, table.table)
                )
            )
            connection.rollback()
            lacking = None if exists else lacking_right(connection, dialect, [table.schema])
        except DatabaseError:
            return f"'sfbridge check' says what is wrong with {rendered}"
        if lacking is not None:
            return f"{rendered} is missing and {lacking.advice()}"
        if not exists:
            return f"{rendered} is missing: run 'sfbridge install'"
        return (
            f"the login needs SELECT, INSERT, UPDATE and DELETE on {rendered} "
            "('sfbridge check' says more)"
        )

    def _write(self, connections: Connections, database: str, state: str) -> None:
        forwarder = next(f for f in self.config.forwarders if f.database == database)
        now = utcnow()
        record = DaemonRecord(
            daemon=this_daemon(),
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=self._started_at,
            heartbeat_at=now,
            heartbeat_seconds=self.config.daemon.heartbeat,
            state="stopped" if state == "stopped" else "running",
            stopped_at=now if state == "stopped" else None,
            config_fingerprint=self._fingerprint,
            forwarders=served_forwarders(self.config, database),
        )
        dialect = dialect_for(self.config.databases[database].dialect)
        table = forwarder_tables(self.config, forwarder).daemons
        connection = connections.get(database)
        for attempt in (1, 2):
            try:
                if database not in self._introduced:
                    upgrade_daemons_table(
                        connection, dialect, table, allowed=self.config.install.at_runtime
                    )
                connection.begin()
                if database not in self._introduced:
                    forget_daemons(connection, dialect, table, record)
                save_daemon(connection, dialect, table, record)
                connection.commit()
                self._introduced.add(database)
                return
            except TableNotFound as missing:
                connection.rollback()
                unhealable = isinstance(missing, BridgeTableMissing) and not missing.healable
                if attempt == 2 or not self.config.install.at_runtime or unhealable:
                    raise
                # Only the daemons table (and its schema): the forwarder's other tables are
                # its workers' to create (`healing`).
                steps = [
                    step
                    for step in forwarder_table_steps(self.config, forwarder)
                    if step.table is None or step.table == table
                ]
                created = create_tables(connection, dialect, steps, only_missing=True)
                log_created(forwarder.name, database, created)
