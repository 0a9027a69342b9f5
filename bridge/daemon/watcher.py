"""Looking for work per database, not per worker.

One `WorkWatcher` per forwarding database asks, with one statement (`Dialect.work_query`),
which of the database's forwarding queues hold a row and when each forwarder's earliest retry
is due, and marks those sources on the database's `WorkBoard` for its pool workers. Where the
database pushes (`bridge.daemon.push`), the watcher listens on its connection between looks:
a notified queue is marked at once, without a query, and every source is looked at only every
`PUSH_POLL_INTERVAL`; sources that do not push, and all of them while the listening connection
is down, are looked at every peek interval. An idle daemon thus sends at most one cheap query
per database per poll, however many forwarders it has. A retry is looked for when it is due.

A queue missing from the database fails the whole statement: the watcher then probes each
part alone, marks the missing ones (a worker heals them, or reports why it cannot) and leaves
them out for `MISSING_TABLE_RETRY`. A database that cannot be reached marks every source, so
that each forwarder's workers find out, report it and back off as they would alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bridge.addressing import TableAddress
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.daemon.board import Key, WorkBoard
from bridge.daemon.forwarder_health import ForwarderHealth
from bridge.daemon.push import PUSH_POLL_INTERVAL, PushChannels, push_off_reason
from bridge.dialects import dialect_for
from bridge.exceptions import DatabaseError, DatabaseUnavailable, TableNotFound
from bridge.forwarding.observers import ForwardingObserver, safe_observer
from bridge.messages import utcnow
from bridge.outages import OutageTracker
from bridge.storage.tables import forwarder_tables

log = logging.getLogger(__name__)

# How long a source whose table is missing is left out of the database's work query.
MISSING_TABLE_RETRY = 5.0
# Backing off after a failed work query, from the first to the most.
FIRST_BACKOFF = 0.5
MAX_BACKOFF = 10.0
_NEVER = float("inf")
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
        also: Callable[[list[Key]], None] | None = None,
        *,
        logins: OutageTracker | None = None,
    ) -> None:
        """`also`: told the marks no worker on `board` can start on now (the daemon's
        worker processes, whose boards this watcher marks through it:
        `bridge.daemon.processes`). `logins`: see `bridge.connections.Connections`."""
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
        self._also = also
        self._logins = logins
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
        self.listening = False
        self.listens = 0  # times listening started, for tests
        self._push_tables = {part.key: part.table for part in self._parts}
        # Why nobody listens here (None: the watcher listens), said once when it starts.
        self.push_off = push_off_reason(config.databases[database], self._dialect)
        self._push: PushChannels | None = (
            PushChannels(database, self._dialect, self._push_tables.items())
            if self.push_off is None
            else None
        )
        self._missing: dict[Key, float] = {}  # left out of the query until (monotonic)
        self._next_due = _NEVER  # monotonic time of the earliest retry not yet due
        self._statements: dict[tuple[int, ...], str] = {}
        self._database_up: bool | None = None
        self._reported = False
        self._look_again = False

    def wake(self) -> None:
        """Look again now (a stop, or a sign of new work)."""
        self._wake.set()

    def look_again(self) -> None:
        """Look at every source soon (within `LONGEST_NAP`), even while pushes come: a board
        that was not there when the last look marked it (a worker process started again)."""
        self._look_again = True
        self._wake.set()

    def run(self) -> None:
        connections = Connections(self.config.databases, self._logins)
        backoff = FIRST_BACKOFF
        next_poll = next_fast = 0.0
        next_listen = 0.0
        if self.push_off is not None and self._dialect.pushes:
            # A database that could push but is not listened to: said, so that nobody expects
            # the pickup in milliseconds that push gives.
            log.info(
                "database '%s': push off (%s), polled every %g s",
                self.database,
                self.push_off,
                self.poll_interval,
            )
        try:
            while not self.stop.is_set():
                self.last_progress = now = time.monotonic()
                if self._look_again:
                    self._look_again = False
                    next_poll = 0.0
                if self._push is not None and not self.listening and now >= next_listen:
                    if self._listen(connections):
                        next_poll = 0.0  # what was sent while nobody listened
                    else:
                        next_listen = now + PUSH_POLL_INTERVAL
                if now >= min(next_poll, self._next_due, next_fast):
                    full = now >= min(next_poll, self._next_due)
                    if self._poll(connections, full=full):
                        backoff = FIRST_BACKOFF
                        now = time.monotonic()
                        if full:
                            next_poll = now + self._full_interval()
                        next_fast = now + self.poll_interval if self._unpushed() else _NEVER
                    else:
                        next_poll = next_fast = time.monotonic() + backoff
                        backoff = min(backoff * 2, MAX_BACKOFF)
                        next_listen = min(next_listen, next_poll)
                wait = min(next_poll, self._next_due, next_fast) - time.monotonic()
                if wait > 0:
                    was_listening = self.listening
                    self._nap(connections, min(wait, LONGEST_NAP))
                    if was_listening and not self.listening:
                        # Listen again at once; until then, every source is polled.
                        next_listen = next_fast = 0.0
        finally:
            connections.close()

    def _full_interval(self) -> float:
        """Every source is looked at this often: slowly while pushes tell of new rows."""
        if self.listening:
            return max(PUSH_POLL_INTERVAL, self.poll_interval)
        return self.poll_interval

    def _unpushed(self) -> list[Key]:
        """Sources to poll at the fast interval between full polls: those that do not push
        (all of them while not listening)."""
        if self._push is None or not self.listening:
            return [part.key for part in self._parts]
        return [part.key for part in self._parts if part.key not in self._push.pushed]

    def _listen(self, connections: Connections) -> bool:
        """Start listening on the watcher's connection; False (and polling) when it cannot."""
        assert self._push is not None
        try:
            connection = connections.get(self.database)
            if not connection.listens:
                self._push = None  # this driver cannot: polling it is
                log.info(
                    "database '%s': polled every %g s (its driver cannot listen for pushes)",
                    self.database,
                    self.poll_interval,
                )
                return False
            self._push.listen(connection)
        except DatabaseError as error:
            connections.discard(self.database)
            log.debug("database '%s': cannot listen yet: %s", self.database, error)
            return False
        self.listening = True
        self.listens += 1
        log.info(
            "database '%s': %d of %d table(s) push (LISTEN/NOTIFY); polled every %g s, "
            "those without push every %g s",
            self.database,
            len({self._push_tables[key] for key in self._push.pushed}),
            len(set(self._push_tables.values())),
            self._full_interval(),
            self.poll_interval,
        )
        return True

    def _nap(self, connections: Connections, seconds: float) -> None:
        """Wait up to `seconds` for a notification (while listening) or a wake-up."""
        if not self.listening or self._push is None:
            self._wake.wait(seconds)
            self._wake.clear()
            return
        try:
            channels = connections.get(self.database).notifications(seconds)
        except DatabaseError as error:
            connections.discard(self.database)
            self.listening = False
            log.warning(
                "database '%s': the listening connection is lost (%s); polling every %g s "
                "until it is back",
                self.database,
                error,
                self.poll_interval,
            )
            return
        keys = self._push.keys(channels)
        if any(source == "retry" for _, source in keys):
            self._next_due = 0.0  # look when the new retries are due
        self._mark_board([key for key in keys if key[1] == "queue"])

    # -- one look --------------------------------------------------------------------------

    def _poll(self, connections: Connections, *, full: bool = True) -> bool:
        """Run the work query, over every source (`full`) or those that do not push, and mark
        what has work. False when it failed."""
        now = time.monotonic()
        wanted = None if full else set(self._unpushed())
        parts = [
            (index, part)
            for index, part in enumerate(self._parts)
            if self._missing.get(part.key, 0.0) <= now and (wanted is None or part.key in wanted)
        ]
        if full:
            self._next_due = _NEVER
        try:
            if full and self.listening and self._push is not None:
                self._push.read_triggers(connections.get(self.database))
            rows = self._query(connections, parts)
        except TableNotFound:
            connections.discard(self.database)
            self.listening = False
            rows = self._query_one_by_one(connections, parts)
        except DatabaseError as error:
            connections.discard(self.database)
            self.listening = False
            if isinstance(error, DatabaseUnavailable):
                self._seen(False)
            log.debug("looking for work in database '%s' failed: %s", self.database, error)
            # Every forwarder's workers find out for themselves, and report it.
            self._mark_board([part.key for part in self._parts])
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
                self.listening = False
                self._missing[entry[1].key] = time.monotonic() + MISSING_TABLE_RETRY
                self._mark_board([entry[1].key])
        return rows

    def _mark(self, rows: list[tuple[Any, ...]]) -> None:
        now_utc = utcnow()
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
        self._mark_board(marked)

    def _mark_board(self, keys: list[Key]) -> None:
        if not keys:
            return
        not_now = self.board.mark(keys)
        if self._also is not None and not_now:
            self._also(not_now)

    def _seen(self, up: bool) -> None:
        if self._database_up is not up:
            if self._database_up is not None or not up:
                self._observer.database_seen(self.database, up)
            self._database_up = up
