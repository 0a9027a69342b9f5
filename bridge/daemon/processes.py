"""Worker processes: the daemon's pools dealt out over several interpreters.

Python runs one thread at a time per process, so a daemon whose workers all share one
interpreter forwards on little more than one core however many it has (docs/performance.md,
"Throughput: where the time goes"). With `daemon.processes` above one, `sfbridge run` starts
that many processes less one beside its own; each runs its `Share` of every pool and of every
forwarder's `concurrency` (`bridge.daemon.budget.shares`): the same data path and the same
claims as two daemons side by side, which is safe: claims skip locked rows, batches are source
transactions, and worker numbers (counter slots) differ between processes. Work is still looked
for once per database, by the daemon's watchers, which mark the worker processes' boards over
the pipe: a worker process holds no connection but its workers'.

What stays in the daemon's own process: upkeep (ledger cleanup, settling what crashes left,
`status` states), heartbeats, the metrics endpoint and systemd's READY, STATUS and WATCHDOG.
A worker process tells it, over a pipe: what its workers report to metrics, its forwarders'
health when it changes, and every `BEAT_INTERVAL` whether its threads loop and what it has
forwarded. Outages are one state for all processes (`bridge.outages`): a process that finds a
database in trouble (or a table locked) tells the daemon, which logs it once and tells every
worker process; only the daemon probes, and tells them all when a database is usable again.

Nothing the daemon's threads do waits on a worker process: what goes to one (marks, outages) is
queued for a sender thread of its own, marks merged and outages sent as they stand when sent,
so a worker process that reads slowly (or not at all) holds up nobody but itself, and an outage
state sent late is never older than one sent before it.

Lifetimes: SIGTERM (or SIGINT) reaches the daemon, which passes SIGTERM on to each worker
process; they finish the batches they hold within the daemon's grace and are killed after it
(what they held is rolled back). A worker process that dies is started again, after a pause
that doubles while it keeps dying. A worker process whose daemon dies (SIGKILL included) sees
its pipe close and stops the same way: nothing outlives the daemon by more than a batch. Worker
processes ignore SIGHUP: the daemon reloads by stopping and starting them with the new
configuration.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from types import MappingProxyType
from typing import Any

from bridge.config.model import BridgeConfig
from bridge.daemon.board import Key
from bridge.daemon.budget import Share
from bridge.daemon.forwarder_health import ForwarderHealth
from bridge.daemon.worker_main import serve
from bridge.forwarding.notices import Notices
from bridge.forwarding.observers import ForwardingObserver
from bridge.outages import OutageTracker

log = logging.getLogger(__name__)

# Pauses before starting a worker process again that died: the first, and the longest.
FIRST_RESTART_PAUSE = 1.0
MAX_RESTART_PAUSE = 30.0
# A worker process that ran this long before it died starts again after the first pause.
STEADY_SECONDS = 60.0
# How long a worker process that stopped on a signal of its own may be waited for by its daemon
# stopping too (systemd and a terminal signal them all at once) before it is started again.
SIGNALLED_GRACE = 3.0
# How long the daemon waits for its worker processes' workers to start before it says READY.
READY_TIMEOUT = 30.0
# How long `wait` gives the killed processes' readers once the deadline has passed.
KILL_WAIT = 5.0


def _mapping_proxy(items: dict[Any, Any]) -> MappingProxyType[Any, Any]:
    return MappingProxyType(items)


# The configuration's read-only mappings travel to a worker process as what they show.
ForkingPickler.register(MappingProxyType, lambda proxy: (_mapping_proxy, (dict(proxy),)))


class Outbox:
    """What goes to one worker process, sent by a thread of its own: marks merged by database,
    outages by database and table, each sent as the daemon's tracker has it when sent."""

    def __init__(self, name: str, outages: OutageTracker) -> None:
        self._outages = outages
        self._changed = threading.Condition()
        self._marks: dict[str, set[Key]] = {}
        self._databases: set[str] = set()  # whose outage state to send
        self._tables: set[tuple[str, str]] = set()  # whose busy state to send
        self._connection: Connection | None = None
        self._thread = threading.Thread(target=self._run, name=f"sfbridge-{name}-out", daemon=True)
        self._thread.start()

    def use(self, connection: Connection | None) -> None:
        """Send to `connection` from now on (a new process), with the outages as they stand."""
        troubled, busy = self._outages.in_trouble_now()
        with self._changed:
            self._connection = connection
            self._marks.clear()
            self._databases = set(troubled)
            self._tables = set(busy)
            self._changed.notify()

    def mark(self, database: str, keys: list[Key]) -> None:
        with self._changed:
            self._marks.setdefault(database, set()).update(keys)
            self._changed.notify()

    def outage(self, change: str, args: tuple[Any, ...]) -> None:
        with self._changed:
            if change in ("record_busy", "record_free"):
                self._tables.add((args[0], args[1]))
            else:
                self._databases.add(args[0])
            self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not (self._marks or self._databases or self._tables):
                    self._changed.wait()
                connection = self._connection
                marks, self._marks = self._marks, {}
                databases, self._databases = self._databases, set()
                tables, self._tables = self._tables, set()
            if connection is None:
                continue  # between processes: `use` sends the outages again
            messages: list[tuple[Any, ...]] = [
                ("mark", database, sorted(keys)) for database, keys in marks.items()
            ]
            for database in databases:
                state = self._outages.state(database)
                if state is not None and state.in_trouble:
                    args = (database, state.state, state.last_error or "", state.login)
                    messages.append(("outage", "record_trouble", args))
                else:
                    messages.append(("outage", "record_up", (database,)))
            for database, table in tables:
                error = self._outages.busy(database, table)
                if error is not None:
                    messages.append(("outage", "record_busy", (database, table, error)))
                else:
                    messages.append(("outage", "record_free", (database, table)))
            try:
                for message in messages:
                    connection.send(message)
            except (OSError, ValueError):
                pass  # the process is gone; its reader starts another, which gets `use`d


@dataclass(frozen=True)
class WorkerProcessState:
    """What metrics show of a worker process (`bridge.daemon.process_metrics`)."""

    number: int  # 2, 3, ...: the daemon's own process is 1
    pid: int | None  # None: not running (between a death and its restart)
    restarts: int  # started again after it ended by itself


class WorkerProcess:
    """The daemon's handle on one worker process, started again whenever it dies."""

    def __init__(
        self,
        config: BridgeConfig,
        share: Share,
        health: ForwarderHealth,
        observer: ForwardingObserver | None,
        outages: OutageTracker,
        stopping: threading.Event,
        notices: Notices,
    ) -> None:
        self.config = config
        self.share = share
        self.name = f"worker process {share.index + 1}"
        self._health = health
        self._observer = observer
        self._notices = notices
        self._stopping = stopping
        self._lock = threading.Lock()
        self._process: multiprocessing.process.BaseProcess | None = None
        self._connection: Connection | None = None
        self._outbox = Outbox(self.name, outages)
        self._outages = outages
        self._totals: Counter[str] = Counter()  # of the process running now
        self._earlier: Counter[str] = Counter()  # of the ones that ended
        self._open: Counter[str] = Counter()  # its batches started and not finished
        self._last_beat = time.monotonic()
        self._beat_alive = True
        self._signalled: str | None = None  # the signal it said it stopped on
        self.restarts = 0  # started again after it ended by itself
        self.ready = threading.Event()  # its workers have started (the first time)
        self.on_ready: Callable[[], None] | None = None  # each time they have
        # A source turned into a backlog there: (database, key, this process).
        self.on_backlog: Callable[[str, Key, WorkerProcess], None] | None = None
        self._reader = threading.Thread(target=self._run, name=f"sfbridge-{self.name}", daemon=True)

    def start(self) -> None:
        self._reader.start()

    def _spawn(self) -> None:
        """Start the process (the caller holds `_lock`)."""
        # A fresh interpreter, not a fork: the daemon has threads (and their locks) that a
        # forked child would inherit mid-use.
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe(duplex=True)
        process = context.Process(
            target=serve,
            args=(self.config, self.share, theirs, self._observer is not None, _log_level()),
            name=f"sfbridge-{self.name}",
            daemon=True,
        )
        try:
            process.start()
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._process, self._connection = process, ours
        self._last_beat = time.monotonic()
        self._beat_alive = True
        self._outbox.use(ours)
        log.info("%s started (pid %s)", self.name, process.pid)

    def _run(self) -> None:
        """Start the process, read what it says until it ends, and start it again unless the
        daemon is stopping, after a pause that doubles while it keeps dying."""
        pause = 0.0
        while True:
            if pause and self._stopping.wait(pause):
                return
            with self._lock:
                # Under the lock that `ask_to_stop` takes: a process started here is either
                # seen by it or not started at all.
                if self._stopping.is_set():
                    return
                try:
                    self._spawn()
                except Exception:
                    pause = min(max(pause * 2, FIRST_RESTART_PAUSE), MAX_RESTART_PAUSE)
                    log.exception(
                        "%s could not be started; trying again in %.0f s", self.name, pause
                    )
                    continue
                process = self._process
            assert process is not None
            started = time.monotonic()
            self._read()
            process.join(timeout=5)
            self._ended()
            signalled, self._signalled = self._signalled, None
            if signalled is not None and self._stopping.wait(SIGNALLED_GRACE):
                return  # the whole service was told to stop
            if self._stopping.is_set():
                return
            self.restarts += 1
            if time.monotonic() - started >= STEADY_SECONDS:
                pause = 0.0
            pause = min(max(pause * 2, FIRST_RESTART_PAUSE), MAX_RESTART_PAUSE)
            if signalled is not None:
                log.warning(
                    "%s (pid %s) stopped on %s of its own; starting it again in %.0f s",
                    self.name,
                    process.pid,
                    signalled,
                    pause,
                )
            else:
                log.error(
                    "%s (pid %s) ended unexpectedly (exit code %s); starting it again in "
                    "%.0f s (the batches it held were rolled back)",
                    self.name,
                    process.pid,
                    process.exitcode,
                    pause,
                )

    def _ended(self) -> None:
        """Account for a process that has ended: its counts kept, its open batches failed."""
        self._outbox.use(None)
        with self._lock:
            self._earlier.update(self._totals)
            self._totals = Counter()
            if self._connection is not None:
                self._connection.close()
                self._connection = None
            open_batches, self._open = self._open, Counter()
        if self._observer is not None:
            # Batches it had started and never finished were rolled back with it.
            for forwarder, count in open_batches.items():
                for _ in range(count):
                    self._observer.batch_finished(forwarder, "queue", 0, None, 0.0)

    def _read(self) -> None:
        connection = self._connection
        assert connection is not None
        while True:
            try:
                event = connection.recv()
            except (EOFError, OSError):
                return
            except Exception:  # a message that cannot be unpickled: say so, keep reading
                log.exception("%s sent something unreadable", self.name)
                continue
            try:
                self._apply(event)
            except Exception:  # watching the bridge must never stop it
                log.exception("%s: could not take in %r", self.name, event[:2])

    def _apply(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == "ready":
            # Marks sent before its boards were there are lost (it was started again).
            if self.on_ready is not None:
                self.on_ready()
            self.ready.set()
        elif kind == "signalled":
            self._signalled = str(event[1])
        elif kind == "beat":
            with self._lock:
                self._last_beat = time.monotonic()
                self._beat_alive = bool(event[1])
                self._totals = Counter(event[2])
        elif kind == "outage":
            # Recorded here as if seen here: logged once, and told to every worker process.
            getattr(self._outages, event[1])(*event[2])
        elif kind == "observer" and self._observer is not None:
            method, args = event[1], event[2]
            if method == "batch_started":
                self._open[args[0]] += 1
            elif method == "batch_finished":
                self._open[args[0]] -= 1
            getattr(self._observer, method)(*args)
        elif kind == "health":
            if event[1] == "succeeded":
                self._health.succeeded(event[2])
            else:
                self._health.failed(event[2], event[3])
        elif kind == "backlog":
            if self.on_backlog is not None:
                self.on_backlog(event[1], tuple(event[2]), self)
        elif kind == "notice":
            self._notices.say(*event[1:])
        elif kind == "repeat":
            self._notices.repeats.tell(*event[1:])
        # Each event (a beat comes every second) ends the repeat windows that are over, also
        # when the daemon's own process runs no workers that would.
        self._notices.repeats.flush()

    def mark(self, database: str, keys: list[Key]) -> None:
        """Mark these sources on its board of `database`, those of its share."""
        if database not in self.share.pools:
            return
        mine = [key for key in keys if key[0] in self.share.caps]
        if mine:
            self._outbox.mark(database, mine)

    def tell(self, change: str, args: tuple[Any, ...]) -> None:
        """Pass on an outage recorded here or in another process (`OutageTracker.listener`)."""
        self._outbox.outage(change, args)

    def alive(self, limit: float) -> bool:
        """Whether the process runs and its threads looped within `limit` seconds."""
        with self._lock:
            process = self._process
            return (
                process is not None
                and self._connection is not None
                and process.exitcode is None
                and self._beat_alive
                and time.monotonic() - self._last_beat < limit
            )

    def totals(self) -> Counter[str]:
        with self._lock:
            return self._earlier + self._totals

    def state(self) -> WorkerProcessState:
        with self._lock:
            process = self._process
            running = process is not None and process.exitcode is None
            pid = process.pid if running and process is not None else None
        return WorkerProcessState(self.share.index + 1, pid, self.restarts)

    def ask_to_stop(self) -> None:
        """SIGTERM to the process, which stops as the daemon does (the caller has set the
        stopping event, so no process is started after this)."""
        with self._lock:
            process = self._process
            if process is not None and process.exitcode is None:
                process.terminate()

    def kill(self) -> None:
        with self._lock:
            process = self._process
            if process is not None and process.exitcode is None:
                process.kill()

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` for its reader to end (the process ended and was accounted
        for); whether it did."""
        self._reader.join(timeout=max(0.0, timeout))
        return not self._reader.is_alive()


class WorkerProcesses:
    """All the daemon's worker processes, for the shares after its own."""

    def __init__(
        self,
        config: BridgeConfig,
        shares: list[Share],
        health: ForwarderHealth,
        observer: ForwardingObserver | None,
        outages: OutageTracker,
        notices: Notices,
    ) -> None:
        self._stopping = threading.Event()
        self._outages = outages
        self.processes = [
            WorkerProcess(config, share, health, observer, outages, self._stopping, notices)
            for share in shares
        ]
        for process in self.processes:
            process.on_backlog = self.backlog
        # Marks the daemon's own boards (`Pools.mark`), once they are there.
        self.mark_here: Callable[[str, list[Key]], None] | None = None

    def start(self) -> None:
        self._outages.listener = self._tell
        for process in self.processes:
            process.start()

    def wait_until_ready(self, give_up: threading.Event, timeout: float = READY_TIMEOUT) -> None:
        """Wait for every process's workers to have started (the daemon's READY means that
        all of them forward), at most `timeout` seconds in all, and not once `give_up` is set
        (SIGTERM)."""
        deadline = time.monotonic() + timeout
        for process in self.processes:
            while not process.ready.wait(0.2):
                if give_up.is_set():
                    return
                if time.monotonic() >= deadline:
                    log.warning(
                        "%s has not started its workers after %.0f s; going on without waiting",
                        process.name,
                        timeout,
                    )
                    break

    def _tell(self, change: str, args: tuple[Any, ...]) -> None:
        for process in self.processes:
            process.tell(change, args)

    def mark(self, database: str, keys: list[Key]) -> None:
        """What a watcher of the daemon marked, for the worker processes' boards."""
        for process in self.processes:
            process.mark(database, keys)

    def backlog(self, database: str, key: Key, origin: WorkerProcess | None = None) -> None:
        """A source turned into a backlog in the daemon's process (`origin` None) or in
        `origin`: marked on every other process's board, so that their workers join in."""
        for process in self.processes:
            if process is not origin:
                process.mark(database, [key])
        if origin is not None and self.mark_here is not None:
            self.mark_here(database, [key])

    def ask_to_stop(self) -> None:
        self._stopping.set()
        self._outages.listener = None
        for process in self.processes:
            process.ask_to_stop()

    def wait(self, deadline: float) -> list[str]:
        """Wait for every process until `deadline` (monotonic), then kill those still running
        and give them `KILL_WAIT` in all; the names of those that had to be killed."""
        for process in self.processes:
            process.join(deadline - time.monotonic())
        killed = [process for process in self.processes if not process.join(0)]
        for process in killed:
            process.kill()
        end = time.monotonic() + KILL_WAIT
        for process in killed:
            process.join(end - time.monotonic())
        return [process.name for process in killed]

    def alive(self, limit: float) -> bool:
        return all(process.alive(limit) for process in self.processes)

    def totals(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for process in self.processes:
            total.update(process.totals())
        return total

    def states(self) -> list[WorkerProcessState]:
        return [process.state() for process in self.processes]


def _log_level() -> int:
    return logging.getLogger().level
