"""A forwarding database's pool workers: shared by its forwarders, going where the work is.

Each worker takes a source (a forwarder's queue or its retries) from the database's
`WorkBoard`, forwards one batch of it (one source transaction) and gives it back, saying
whether the batch was full. It keeps one connection per database it has needed and one
`BatchForwarder` per forwarder it has served, so a pool of N workers holds at most N
connections to its database (and one to each destination), however many forwarders share it.
A failed batch holds its source back, doubling from `FIRST_BACKOFF` to `MAX_FAILURE_BACKOFF`
(`MISSING_TABLE_RETRY` at least for a missing table), while the other sources go on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.daemon.board import Entry, WorkBoard
from bridge.daemon.forwarder_health import ForwarderHealth
from bridge.daemon.observability import report_exception
from bridge.exceptions import DatabaseError, DatabaseUnavailable, TableNotFound
from bridge.forwarding.catch_up import CatchUpLimits
from bridge.forwarding.hops import HopTracer
from bridge.forwarding.observers import ForwardingObserver, safe_observer
from bridge.forwarding.repeats import RepeatedLines
from bridge.forwarding.spine import BatchForwarder
from bridge.forwarding.writes import QueueWriter
from bridge.outages import OutageTracker

log = logging.getLogger(__name__)

FIRST_BACKOFF = 0.5
MAX_FAILURE_BACKOFF = 10.0
# How long a source waits after its forwarding table was found missing, at least.
MISSING_TABLE_RETRY = 5.0
# The longest a worker waits for a turn in one go, so that `last_progress` shows it alive.
TURN_WAIT = 1.0


class PoolWorker(threading.Thread):
    """Forwards batches of whatever source of its database's forwarders the board gives it."""

    def __init__(
        self,
        config: BridgeConfig,
        database: str,
        index: int,
        board: WorkBoard,
        stop: threading.Event,
        outages: OutageTracker,
        writer: QueueWriter,
        health: ForwarderHealth,
        observer: ForwardingObserver | None = None,
        *,
        catch_up: CatchUpLimits | None = None,
        repeats: RepeatedLines | None = None,
        tracer: HopTracer | None = None,
    ) -> None:
        """`repeats`: the daemon's failures that repeat (`Notices.repeats`), told once a window;
        `tracer`: this process's (`bridge.daemon.tracing`), None when tracing is off."""
        super().__init__(name=f"{database}-{index}", daemon=True)
        self.config = config
        self.database = database
        self.index = index
        self.board = board
        self.stop = stop
        self.totals: Counter[str] = Counter()
        self.last_progress = time.monotonic()
        self._outages = outages
        self._writer = writer
        self._health = health
        self._catch_up = catch_up
        # Every call through SafeObserver: a failing observer must not end the worker thread.
        self._observer = safe_observer(observer)
        self._lock = threading.Lock()
        self._source_down = False
        self._repeats = repeats
        self._tracer = tracer

    def run(self) -> None:
        connections = Connections(self.config.databases, self._outages)
        forwarders: dict[str, BatchForwarder] = {}
        try:
            while not self.stop.is_set():
                self.last_progress = time.monotonic()
                # A failure held for its repeats is told when its window ends, not only when
                # the next one comes (a lock and a few keys: nothing beside a batch).
                if self._repeats is not None:
                    self._repeats.flush()
                entry = self.board.take(TURN_WAIT)
                if entry is None:
                    continue
                batches = forwarders.get(entry.forwarder)
                if batches is None:
                    batches = BatchForwarder(
                        self.config,
                        self.config.forwarder(entry.forwarder),
                        connections,
                        # Counter rows per worker: two batches never update the same row.
                        slot=self.index,
                        outages=self._outages,
                        writer=self._writer,
                        observer=self._observer,
                        catch_up=self._catch_up,
                        repeats=self._repeats,
                        tracer=self._tracer,
                    )
                    forwarders[entry.forwarder] = batches
                self._turn(entry, batches, connections)
        finally:
            connections.close()

    def _turn(self, entry: Entry, batches: BatchForwarder, connections: Connections) -> None:
        """One batch of `entry`, and what the board should know of it. Never raises."""
        name = entry.forwarder
        forwarder = batches.forwarder
        try:
            if batches.pause_state(entry.source).forwarder is not None:
                self._health.succeeded(name)
                self.board.finish(entry, hold=forwarder.slow_poll_interval, again=True)
                return
            report = batches.forward_batch(
                entry.source, on_full=lambda: self.board.more_waiting(entry)
            )
            self.last_progress = time.monotonic()
            with self._lock:
                self.totals.update(report.counts)
        except DatabaseUnavailable as error:
            # Down, or silent past its query_timeout: the batch was rolled back (or its
            # connection closed, which the server rolls back).
            connections.discard(self.database)
            if not self._source_down:
                self._source_down = True
                self._observer.database_seen(self.database, False)
            self._failed(entry, f"cannot read its queue: {error}", _backoff(entry))
            return
        except TableNotFound as error:
            # What could be healed was (BatchForwarder heals its own tables).
            connections.discard(self.database)
            advice = "" if error.advice else "; run 'sfbridge install'"
            wait = max(_backoff(entry), MISSING_TABLE_RETRY)
            self._failed(entry, f"{error}{advice}", wait)
            return
        except DatabaseError as error:
            self._failed(entry, str(error), _backoff(entry))
            return
        except Exception as error:  # the daemon must survive anything a batch throws
            wait = _backoff(entry)
            self.board.finish(entry, failing=True, hold=wait)
            if self._health.failed(name, f"unexpected error: {error!r}"):
                log.exception("forwarder '%s': unexpected error", name)
                report_exception(error)
            return
        if self._source_down:
            self._source_down = False
            self._observer.database_seen(self.database, True)
        # Retries are looked at once per slow poll unless a batch came back full (see
        # `ForwarderConfig.slow_poll_interval`): some may wait for a database in trouble.
        hold = forwarder.slow_poll_interval if entry.source == "retry" and not report.full else 0
        # A short batch that took something is no sign of an empty queue: claims racing for the
        # head of one queue come back short (PostgreSQL locks after the LIMIT), and rows may
        # have come meanwhile. Only a batch that finds nothing ends the source's turns.
        self.board.finish(
            entry, full=report.full, hold=hold, again=report.claimed > 0 and not report.full
        )
        # Well only when its other source is well too (its retries, or its queue).
        if not any(failing == name for failing, _ in self.board.failing()):
            self._health.succeeded(name)

    def _failed(self, entry: Entry, error: str, wait: float) -> None:
        self.board.finish(entry, failing=True, hold=wait)
        self._health.failed(entry.forwarder, error)

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.totals)


def _backoff(entry: Entry) -> float:
    """How long a source waits after this failure: doubling with the failures in a row."""
    return min(FIRST_BACKOFF * 2 ** min(entry.failures, 16), MAX_FAILURE_BACKOFF)
