"""Looking for work per database, not per worker.

One `WorkWatcher` per forwarding database asks, with a statement per `PARTS_PER_STATEMENT`
sources (`Dialect.work_query`), which of the database's forwarding queues hold a row and when
each forwarder's earliest retry is due, and marks those sources on the database's `WorkBoard`
for its pool workers. Where the database pushes (`bridge.daemon.push`), a listener thread of
the watcher's, on a connection of its own, marks a notified queue at once, without a query and
without waiting for a poll; every source is then looked at only every `PUSH_POLL_INTERVAL`.
Sources that do not push, and all of them while the listening connection is down, are looked
at every peek interval. An idle daemon thus sends a few cheap statements per database per
poll, their number growing with the forwarders but none of them taking longer. A retry is
looked for when it is due, and retry storage a notification tells of at once (its slice
only).

A look held up (a statement waiting for another client's lock, up to the database's
`query_timeout`) holds up no push: queues are marked by the listener, and retry storage too,
once the look has waited `HELD_UP`: from the listener's thread, each retry storage it was told
of is marked when its retries may come due (the retry policy's shortest delay after the
notification), and each one whose earliest retry the watcher knew of when that comes due;
both again every shortest delay while the look waits, since what is due after is not known
then. A worker's claim takes only what is due.

A queue missing from the database fails its slice's statement: the watcher then probes each
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
from bridge.daemon.push import (
    LISTEN_NAP,
    PUSH_POLL_INTERVAL,
    PushChannels,
    PushListener,
    push_off_reason,
)
from bridge.dialects import dialect_for
from bridge.exceptions import DatabaseError, DatabaseUnavailable, TableNotFound
from bridge.forwarding.observers import ForwardingObserver, safe_observer
from bridge.messages import utcnow
from bridge.outages import OutageTracker
from bridge.retry_policy import delay_before_attempt
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
# A statement of a look that has waited this long is held up: the listener marks retry storage
# in its stead (see the module docstring).
HELD_UP = 1.0
# Sources (a forwarder's queue and its retry storage are two) per work statement. PostgreSQL's
# planning time grows faster than the number of UNION ALL branches (about 0.13 ms a branch up
# to 50, 0.5 ms at 200, 1.5-3 ms at 1,000: a poll of 500 forwarders in one statement took
# 1.4-3 s before its plan was cached, docs/performance.md): slices keep each statement cheap
# and its cost bounded whatever the number of forwarders.
PARTS_PER_STATEMENT = 32


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
        # Fixed slices of the parts, a statement each: a forwarder's two parts in one.
        self._slices = [
            range(first, min(first + PARTS_PER_STATEMENT, len(self._parts)))
            for first in range(0, len(self._parts), PARTS_PER_STATEMENT)
        ]
        self.poll_interval = min(f.peek_interval for f in forwarders)
        # Why nobody listens here (None: the watcher listens), said once when it starts.
        self.push_off = push_off_reason(config.databases[database], self._dialect)
        self._push: PushChannels | None = None
        self._listener: PushListener | None = None
        if self.push_off is None:
            self._push = PushChannels(
                database, self._dialect, [(part.key, part.table) for part in self._parts]
            )
            self._listener = PushListener(
                config.databases,
                self._push,
                stop,
                self._told,
                self._listening_changed,
                self.poll_interval,
                logins,
                tick=self._while_held_up,
            )
        self._missing: dict[Key, float] = {}  # left out of the query until (monotonic)
        # Retry storage to look at again at (monotonic): the earliest retry not yet due, or
        # 0 for one the listener was told of.
        self._due: dict[Key, float] = {}
        self._due_lock = threading.Lock()
        # Retry storage whose look has not come back (told of by the listener, or taken from
        # `_due` by a look that runs), and when its retries may come due (monotonic): marked
        # from there by the listener while a look is held up.
        self._unlooked: dict[Key, float] = {}
        self._shortest_delay = delay_before_attempt(1, config.retries)
        self._looking_since: float | None = None  # when the running statement of a look began
        self._statements: dict[tuple[int, ...], str] = {}
        self._database_up: bool | None = None
        self._reported = False
        self._look_again = False

    @property
    def listening(self) -> bool:
        """Whether pushes are listened for now (`bridge.daemon.push.PushListener`)."""
        return self._listener is not None and self._listener.listening

    @property
    def listens(self) -> int:
        """Times listening started, for tests."""
        return self._listener.listens if self._listener is not None else 0

    def listener_hung(self, now: float, limit: float) -> bool:
        """Whether the listener runs but has not looped within `limit` seconds (a wait for
        notifications that never returns), as `last_progress` tells of the watcher."""
        listener = self._listener
        return (
            listener is not None and listener.is_alive() and now - listener.last_progress >= limit
        )

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
        if self.push_off is not None and self._dialect.pushes:
            # A database that could push but is not listened to: said, so that nobody expects
            # the pickup in milliseconds that push gives.
            log.info(
                "database '%s': push off (%s), polled every %g s",
                self.database,
                self.push_off,
                self.poll_interval,
            )
        if self._listener is not None:
            self._listener.start()
        try:
            while not self.stop.is_set():
                self.last_progress = now = time.monotonic()
                if self._look_again:
                    self._look_again = False
                    next_poll = 0.0
                due = self._due_retries(now)
                full, fast = now >= next_poll, now >= next_fast
                if full or fast or due:
                    wanted = None if full else {*(self._unpushed() if fast else ()), *due}
                    if self._poll(connections, wanted):
                        backoff = FIRST_BACKOFF
                        now = time.monotonic()
                        if full:
                            next_poll = now + self._full_interval()
                        if full or fast:
                            next_fast = now + self.poll_interval if self._unpushed() else _NEVER
                    else:
                        next_poll = next_fast = time.monotonic() + backoff
                        backoff = min(backoff * 2, MAX_BACKOFF)
                wait = min(next_poll, next_fast, self._next_due()) - time.monotonic()
                if wait > 0:
                    self._wake.wait(min(wait, LONGEST_NAP))
                    self._wake.clear()
        finally:
            connections.close()
            if self._listener is not None and self._listener.is_alive():
                self._listener.join(2 * LISTEN_NAP)

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

    # -- what the listener is told ---------------------------------------------------------

    def _told(self, keys: list[Key]) -> None:
        """Notified sources (in the listener's thread): a queue is marked at once; retry
        storage is looked at for when the new retries are due."""
        retries = [key for key in keys if key[1] == "retry"]
        if retries:
            told_due = time.monotonic() + self._shortest_delay
            with self._due_lock:
                for key in retries:
                    self._due[key] = 0.0
                    self._unlooked.setdefault(key, told_due)
            self._wake.set()
        self._mark_board([key for key in keys if key[1] == "queue"])

    def _while_held_up(self, now: float) -> None:
        """In the listener's thread, every time it loops: while a statement of a look has
        waited `HELD_UP` or more, mark the retry storage that may have come due (see the
        module docstring) instead of waiting for the look."""
        since = self._looking_since
        if since is None or now - since < HELD_UP:
            return
        marked: list[Key] = []
        again = now + self._shortest_delay
        with self._due_lock:
            for due in (self._unlooked, self._due):
                for key, at in due.items():
                    if 0.0 < at <= now:
                        marked.append(key)
                        due[key] = again
        if marked:
            self._mark_board(sorted(set(marked)))

    def _listening_changed(self, listening: bool) -> None:
        """Listening started (what was sent while nobody listened is polled for at once) or
        stopped (every source is polled, at once and then every peek interval)."""
        self.look_again()

    # -- one look --------------------------------------------------------------------------

    def _due_retries(self, now: float) -> set[Key]:
        with self._due_lock:
            return {key for key, due in self._due.items() if due <= now}

    def _next_due(self) -> float:
        """Monotonic time of the earliest retry not yet due (or told of, not yet looked at)."""
        with self._due_lock:
            return min(self._due.values(), default=_NEVER)

    def _poll(self, connections: Connections, wanted: set[Key] | None) -> bool:
        """Run the work query over every source (`wanted` None) or those `wanted`, slice by
        slice, and mark what has work. False when it failed."""
        now = time.monotonic()
        slices = [
            [(index, self._parts[index]) for index in indexes]
            for indexes in self._slices
            if wanted is None or any(self._parts[index].key in wanted for index in indexes)
        ]
        if not slices:
            return True  # nothing wanted a look (a database not looked at is not seen up)
        with self._due_lock:
            # Looked at now, or (a failure) by the full poll after the backoff; until the look
            # comes back, the listener has them (`_while_held_up`).
            for entries in slices:
                for _, part in entries:
                    at = self._due.pop(part.key, 0.0)
                    if at > 0.0:
                        self._unlooked[part.key] = min(self._unlooked.get(part.key, at), at)
        try:
            if wanted is None and self.listening and self._push is not None:
                self._push.read_triggers(connections.get(self.database))
            for entries in slices:
                parts = [(i, part) for i, part in entries if self._missing.get(part.key, 0) <= now]
                try:
                    rows = self._query(connections, parts)
                except TableNotFound:
                    connections.discard(self.database)
                    rows = self._query_one_by_one(connections, parts)
                self._mark(rows)
        except DatabaseError as error:
            connections.discard(self.database)
            if isinstance(error, DatabaseUnavailable):
                self._seen(False)
            log.debug("looking for work in database '%s' failed: %s", self.database, error)
            # Every forwarder's workers find out for themselves, and report it.
            self._mark_board([part.key for part in self._parts])
            return False
        self._seen(True)
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
        self._looking_since = time.monotonic()
        try:
            connection.begin_read()
            rows = connection.query(sql, params)
            connection.commit()
        except BaseException:
            connection.rollback()
            raise
        finally:
            self._looking_since = None
        with self._due_lock:  # looked at: when their retries come due is known now
            for _, part in parts:
                self._unlooked.pop(part.key, None)
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
                with self._due_lock:
                    self._due[part.key] = min(
                        self._due.get(part.key, _NEVER),
                        now + (due_at - now_utc).total_seconds(),
                    )
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
