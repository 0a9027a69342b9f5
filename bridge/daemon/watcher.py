"""Looking for work per database, not per worker.

One `WorkWatcher` per forwarding database asks, with one statement (`Dialect.work_query`),
which of the database's forwarding queues hold a row and when each forwarder's earliest retry
is due, and marks those sources on the database's `WorkBoard` for its pool workers. An idle
daemon thus sends one cheap query per database per poll, however many forwarders it has.

A queue missing from the database fails the whole statement: the watcher then probes each
part alone, marks the missing ones (a worker heals them, or reports why it cannot) and leaves
them out for `MISSING_TABLE_RETRY`. A database that cannot be reached marks every source, so
that each forwarder's workers find out, report it and back off as they would alone.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bridge.addressing import TableAddress
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.daemon.board import Key, WorkBoard
from bridge.daemon.forwarder_health import ForwarderHealth
from bridge.dialects import dialect_for
from bridge.exceptions import DatabaseError, DatabaseUnavailable, TableNotFound
from bridge.forwarding.observers import ForwardingObserver, safe_observer
from bridge.storage.tables import forwarder_tables

log = logging.getLogger(__name__)

# How long a source whose table is missing is left out of the database's work query.
MISSING_TABLE_RETRY = 5.0
# Backing off after a failed work query, from the first to the most.
FIRST_BACKOFF = 0.5
MAX_BACKOFF = 10.0
# The longest the watcher sleeps in one go, so that `last_progress` shows it alive.
LONGEST_NAP = 1.0


@dataclass(frozen=True)
class Part:
    """One row of the work query: a forwarder's queue, or its retries."""

    key: Key
    kind: str  # "queue" | "retry"
    table: TableAddress
    params: tuple[Any, ...]


class WorkWatcher(threading.Thread):
    """Marks one database's sources that have work on its board."""

    def __init__(
        self,
        config: BridgeConfig,
        database: str,
        board: WorkBoard,
        stop: threading.Event,
        health: ForwarderHealth,
        observer: ForwardingObserver | None = None,
    ) -> None:
        super().__init__(name=f"watch-{database}", daemon=True)
        self.config = config
        self.database = database
        self.board = board
        self.stop = stop
        self.last_progress = time.monotonic()
        self.queries = 0  # work queries sent, for tests and the benchmark
        self._health = health
        self._observer = safe_observer(observer)
        self._dialect = dialect_for(config.databases[database].dialect)
        self._wake = threading.Event()
        forwarders = [f for f in config.forwarders if f.database == database]
        self._forwarders = forwarders
        self._parts: list[Part] = []
        for forwarder in forwarders:
            tables = forwarder_tables(config, forwarder)
            index = len(self._parts)
            self._parts.append(Part((forwarder.name, "queue"), "queue", tables.queue, (index,)))
            self._parts.append(
                Part((forwarder.name, "retry"), "retry", tables.retry, (index + 1, forwarder.name))
            )
        self.poll_interval = min(f.peek_interval for f in forwarders)
        self._missing: dict[Key, float] = {}  # left out of the query until (monotonic)
        self._next_due = float("inf")  # monotonic time of the earliest retry not yet due
        self._statements: dict[tuple[int, ...], str] = {}
        self._database_up: bool | None = None
        self._reported = False

    def wake(self) -> None:
        """Look again now (a stop, or a sign of new work)."""
        self._wake.set()

    def run(self) -> None:
        connections = Connections(self.config.databases)
        backoff = FIRST_BACKOFF
        next_poll = 0.0
        try:
            while not self.stop.is_set():
                self.last_progress = now = time.monotonic()
                if now >= min(next_poll, self._next_due):
                    if self._poll(connections):
                        backoff = FIRST_BACKOFF
                        next_poll = time.monotonic() + self.poll_interval
                    else:
                        next_poll = time.monotonic() + backoff
                        backoff = min(backoff * 2, MAX_BACKOFF)
                wait = min(next_poll, self._next_due) - time.monotonic()
                if wait > 0:
                    self._wake.wait(min(wait, LONGEST_NAP))
                    self._wake.clear()
        finally:
            connections.close()

    # -- one look --------------------------------------------------------------------------

    def _poll(self, connections: Connections) -> bool:
        """Run the work query and mark what has work. False when it failed."""
        now = time.monotonic()
        parts = [
            (index, part)
            for index, part in enumerate(self._parts)
            if self._missing.get(part.key, 0.0) <= now
        ]
        self._next_due = float("inf")
        try:
            rows = self._query(connections, parts)
        except TableNotFound:
            connections.discard(self.database)
            rows = self._query_one_by_one(connections, parts)
        except DatabaseError as error:
            connections.discard(self.database)
            if isinstance(error, DatabaseUnavailable):
                self._seen(False)
            log.debug("looking for work in database '%s' failed: %s", self.database, error)
            # Every forwarder's workers find out for themselves, and report it.
            self.board.mark(part.key for part in self._parts)
            return False
        self._seen(True)
        self._mark(rows)
        if not self._reported:
            # Forwarders are well from the first look on; after that, their batches say.
            self._reported = True
            failing = {forwarder for forwarder, _ in self.board.failing()}
            for forwarder in self._forwarders:
                if forwarder.name not in failing:
                    self._health.succeeded(forwarder.name)
        return True

    def _query(
        self, connections: Connections, parts: list[tuple[int, Part]]
    ) -> list[tuple[Any, ...]]:
        if not parts:
            return []
        indexes = tuple(index for index, _ in parts)
        sql = self._statements.get(indexes)
        if sql is None:
            sql = self._dialect.work_query([(part.kind, part.table) for _, part in parts])
            self._statements[indexes] = sql
        params = [value for _, part in parts for value in part.params]
        connection = connections.get(self.database)
        self.queries += 1
        try:
            connection.begin_read()
            rows = connection.query(sql, params)
            connection.commit()
        except BaseException:
            connection.rollback()
            raise
        return rows

    def _query_one_by_one(
        self, connections: Connections, parts: list[tuple[int, Part]]
    ) -> list[tuple[Any, ...]]:
        """The work query part by part: a missing table fails only its own part, which is
        marked (its workers heal it or say why not) and left out for a while."""
        rows: list[tuple[Any, ...]] = []
        for entry in parts:
            try:
                rows += self._query(connections, [entry])
            except TableNotFound:
                connections.discard(self.database)
                self._missing[entry[1].key] = time.monotonic() + MISSING_TABLE_RETRY
                self.board.mark([entry[1].key])
        return rows

    def _mark(self, rows: list[tuple[Any, ...]]) -> None:
        now_utc = datetime.now(UTC).replace(tzinfo=None)
        now = time.monotonic()
        marked: list[Key] = []
        for index, has_rows, due in rows:
            part = self._parts[int(index)]
            if part.kind == "queue":
                if has_rows:
                    marked.append(part.key)
                continue
            due_at = self._dialect.decode_timestamp(due)
            if due_at is None:
                continue
            if due_at <= now_utc:
                marked.append(part.key)
            else:
                self._next_due = min(self._next_due, now + (due_at - now_utc).total_seconds())
        self.board.mark(marked)

    def _seen(self, up: bool) -> None:
        if self._database_up is not up:
            if self._database_up is not None or not up:
                self._observer.database_seen(self.database, up)
            self._database_up = up
