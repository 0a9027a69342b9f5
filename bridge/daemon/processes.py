"""Worker processes: the daemon's pools dealt out over several interpreters.

Python runs one thread at a time per process, so a daemon whose workers all share one
interpreter forwards on little more than one core however many it has (README, "Throughput:
where the time goes"). With `daemon.processes` above one, `sfbridge run` starts that many
processes less one beside its own; each runs its `Share` of every pool and of every forwarder's
`concurrency` (`bridge.daemon.budget.shares`): the same data path and the same claims as two
daemons side by side, which is safe: claims skip locked rows, batches are source transactions,
and worker numbers (counter slots) differ between processes. Work is still looked for once per
database, by the daemon's watchers, which mark the worker processes' boards over the pipe: a
worker process holds no connection but its workers'.

What stays in the daemon's own process: upkeep (ledger cleanup, settling what crashes left,
`status` states), heartbeats, the metrics endpoint and systemd's READY, STATUS and WATCHDOG.
A worker process tells it, over a pipe: what its workers report to metrics, its forwarders'
health when it changes, and every `BEAT_INTERVAL` whether its threads loop and what it has
forwarded. Outages are one state for all processes (`bridge.outages`): a process that finds a
database in trouble (or a table locked) tells the daemon, which logs it once and tells every
worker process; only the daemon probes, and tells them all when a database is usable again.

Lifetimes: SIGTERM (or SIGINT) reaches the daemon, which tells each worker process to stop;
they finish the batches they hold within the daemon's grace and are killed after it (what they
held is rolled back). A worker process that dies is started again, after a pause that doubles
while it keeps dying. A worker process whose daemon dies (SIGKILL included) sees its pipe close
and stops the same way: nothing outlives the daemon by more than a batch. Worker processes
ignore SIGHUP: the daemon reloads by stopping and starting them with the new configuration.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from types import FrameType, MappingProxyType
from typing import Any

from bridge.config.model import BridgeConfig
from bridge.connections import load_drivers
from bridge.daemon.board import Key, WorkBoard
from bridge.daemon.budget import Share
from bridge.daemon.forwarder_health import ForwarderHealth
from bridge.daemon.observability import flush_sentry, setup_logging, setup_sentry
from bridge.daemon.pools import STOP_GRACE_SECONDS, progress_limit, start_pools
from bridge.forwarding.observers import ForwardingObserver
from bridge.forwarding.spine import probe_interval, tune_garbage_collection
from bridge.outages import OutageTracker

log = logging.getLogger(__name__)

# How often a worker process tells the daemon it is alive and what it has forwarded.
BEAT_INTERVAL = 1.0
# Pauses before starting a worker process again that died: the first, and the longest.
FIRST_RESTART_PAUSE = 1.0
MAX_RESTART_PAUSE = 30.0
# A worker process that ran this long before it died starts again after the first pause.
STEADY_SECONDS = 60.0
# What the daemon sends a worker process to make it stop.
STOP = "stop"
# How long a worker process that stopped on a signal of its own may be waited for by its daemon
# stopping too (systemd and a terminal signal them all at once) before it is started again.
SIGNALLED_GRACE = 3.0
# How long the daemon waits for its worker processes' workers to start before it says READY.
READY_TIMEOUT = 30.0


# -- in the daemon's process ----------------------------------------------------------------


def _mapping_proxy(items: dict[Any, Any]) -> MappingProxyType[Any, Any]:
    return MappingProxyType(items)


# The configuration's read-only mappings travel to a worker process as what they show.
ForkingPickler.register(MappingProxyType, lambda proxy: (_mapping_proxy, (dict(proxy),)))


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
    ) -> None:
        self.config = config
        self.share = share
        self.name = f"worker process {share.index + 1}"
        self._health = health
        self._outages = outages
        self._send_lock = threading.Lock()
        self._observer = observer
        self._stopping = stopping
        self._lock = threading.Lock()
        self._process: multiprocessing.process.BaseProcess | None = None
        self._connection: Connection | None = None
        self._totals: Counter[str] = Counter()  # of the process running now
        self._earlier: Counter[str] = Counter()  # of the ones that died
        self._last_beat = time.monotonic()
        self._beat_alive = True
        self._pause = FIRST_RESTART_PAUSE
        self._signalled: str | None = None  # the signal it said it stopped on
        self.ready = threading.Event()  # its workers have started (the first time)
        self.on_ready: Callable[[], None] | None = None  # each time they have
        self._reader = threading.Thread(target=self._run, name=f"sfbridge-{self.name}", daemon=True)

    def start(self) -> None:
        self._spawn()
        self._reader.start()

    def _spawn(self) -> None:
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
        process.start()
        theirs.close()
        with self._lock:
            self._process, self._connection = process, ours
            self._last_beat = time.monotonic()
            self._beat_alive = True
        log.info("%s started (pid %s)", self.name, process.pid)
        # What it would otherwise find out by waiting out timeouts itself.
        for change, args in self._outages.replay():
            self.tell(change, args)

    def mark(self, database: str, keys: list[Key]) -> None:
        """Mark these sources on its board of `database`, those of its share."""
        if database not in self.share.pools:
            return
        mine = [key for key in keys if key[0] in self.share.caps]
        if mine:
            self._send(("mark", database, mine))

    def tell(self, change: str, args: tuple[Any, ...]) -> None:
        """Pass on an outage recorded in another process (`OutageTracker.listener`)."""
        self._send(("outage", change, args))

    def _send(self, message: object) -> None:
        with self._lock:
            connection = self._connection
        if connection is None:
            return
        with self._send_lock:
            try:
                connection.send(message)
            except (OSError, ValueError):
                pass  # gone; its reader starts it again

    def _run(self) -> None:
        """Read what the process says until it ends; start it again unless stopping."""
        while True:
            started = time.monotonic()
            self._read()
            process = self._process
            assert process is not None
            process.join(timeout=5)
            with self._lock:
                self._earlier.update(self._totals)
                self._totals = Counter()
            signalled, self._signalled = self._signalled, None
            if signalled is not None and self._stopping.wait(SIGNALLED_GRACE):
                return  # the whole service was told to stop
            if self._stopping.is_set():
                return
            if time.monotonic() - started >= STEADY_SECONDS:
                self._pause = FIRST_RESTART_PAUSE
            if signalled is not None:
                log.warning(
                    "%s (pid %s) stopped on %s of its own; starting it again in %.0f s",
                    self.name,
                    process.pid,
                    signalled,
                    self._pause,
                )
            else:
                log.error(
                    "%s (pid %s) ended unexpectedly (exit code %s); starting it again in "
                    "%.0f s (the batches it held were rolled back)",
                    self.name,
                    process.pid,
                    process.exitcode,
                    self._pause,
                )
            if self._stopping.wait(self._pause):
                return
            self._pause = min(self._pause * 2, MAX_RESTART_PAUSE)
            try:
                self._spawn()
            except Exception:
                log.exception("%s could not be started again", self.name)
                self._stopping.wait(self._pause)

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
            getattr(self._observer, event[1])(*event[2])
        elif kind == "health":
            if event[1] == "succeeded":
                self._health.succeeded(event[2])
            else:
                self._health.failed(event[2], event[3])

    def alive(self, limit: float) -> bool:
        """Whether the process runs and its threads looped within `limit` seconds."""
        with self._lock:
            process = self._process
            return (
                process is not None
                and process.is_alive()
                and self._beat_alive
                and time.monotonic() - self._last_beat < limit
            )

    def totals(self) -> Counter[str]:
        with self._lock:
            return self._earlier + self._totals

    def ask_to_stop(self) -> None:
        self._send(STOP)

    def wait(self, deadline: float) -> bool:
        """Wait for the process to end until `deadline` (monotonic); kill it if it has not.
        Returns whether it ended by itself."""
        # The reader alone reaps the process (two threads waiting for one child race); it
        # returns once the process has ended and `ask_to_stop` was called.
        self._reader.join(timeout=max(0.0, deadline - time.monotonic()))
        ended = not self._reader.is_alive()
        if not ended:
            with self._lock:
                process = self._process
            if process is not None:
                process.kill()
            self._reader.join(timeout=10)
        with self._lock:
            if self._connection is not None:
                self._connection.close()
        return ended


class WorkerProcesses:
    """All the daemon's worker processes, for the shares after its own."""

    def __init__(
        self,
        config: BridgeConfig,
        shares: list[Share],
        health: ForwarderHealth,
        observer: ForwardingObserver | None,
        outages: OutageTracker,
    ) -> None:
        self._stopping = threading.Event()
        self._outages = outages
        self.processes = [
            WorkerProcess(config, share, health, observer, outages, self._stopping)
            for share in shares
        ]

    def start(self) -> None:
        self._outages.listener = self._tell
        for process in self.processes:
            process.start()

    def wait_until_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Wait for every process's workers to have started (the daemon's READY means that
        all of them forward), at most `timeout` seconds in all."""
        deadline = time.monotonic() + timeout
        for process in self.processes:
            if not process.ready.wait(max(0.0, deadline - time.monotonic())):
                log.warning(
                    "%s has not started its workers after %.0f s; going on without waiting",
                    process.name,
                    timeout,
                )

    def _tell(self, change: str, args: tuple[Any, ...]) -> None:
        for process in self.processes:
            process.tell(change, args)

    def mark(self, database: str, keys: list[Key]) -> None:
        """What a watcher of the daemon marked, for the worker processes' boards."""
        for process in self.processes:
            process.mark(database, keys)

    def ask_to_stop(self) -> None:
        self._stopping.set()
        self._outages.listener = None
        for process in self.processes:
            process.ask_to_stop()

    def wait(self, deadline: float) -> list[str]:
        """Wait for every process until `deadline`; the names of those that had to be killed."""
        return [process.name for process in self.processes if not process.wait(deadline)]

    def alive(self, limit: float) -> bool:
        return all(process.alive(limit) for process in self.processes)

    def totals(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for process in self.processes:
            total.update(process.totals())
        return total


def _log_level() -> int:
    return logging.getLogger().level


# -- in a worker process ----------------------------------------------------------------------


class DaemonLink:
    """A worker process's end of its pipe to the daemon; safe to use from every thread."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._lock = threading.Lock()

    def send(self, *event: Any) -> None:
        with self._lock:
            try:
                self._connection.send(event)
            except (OSError, ValueError):
                pass  # the daemon is gone; the listener stops this process

    def listen(
        self, stop: threading.Event, outages: OutageTracker, boards: dict[str, WorkBoard]
    ) -> None:
        """Take in the outages and marks the daemon passes on; set `stop` when it says so or
        goes away (its end of the pipe closes)."""
        try:
            while (message := self._connection.recv()) != STOP:
                if not isinstance(message, tuple):
                    continue
                if message[0] == "outage":
                    getattr(outages, message[1])(*message[2], relayed=True)
                elif message[0] == "mark" and message[1] in boards:
                    boards[message[1]].mark(message[2])
        except (EOFError, OSError):
            log.warning("the daemon is gone; stopping after the batches in flight")
        stop.set()


class RelayedObserver:
    """What this process's workers tell metrics, passed on to the daemon's metrics."""

    def __init__(self, link: DaemonLink) -> None:
        self._link = link

    def batch_started(self, forwarder: str) -> None:
        self._link.send("observer", "batch_started", (forwarder,))

    def batch_finished(
        self,
        forwarder: str,
        source: str,
        claimed: int,
        counts: Mapping[str, int] | None,
        seconds: float,
    ) -> None:
        args = (forwarder, source, claimed, None if counts is None else dict(counts), seconds)
        self._link.send("observer", "batch_finished", args)

    def delivered(self, database: str, count: int, seconds_since_claim: float) -> None:
        self._link.send("observer", "delivered", (database, count, seconds_since_claim))

    def database_seen(self, database: str, up: bool) -> None:
        self._link.send("observer", "database_seen", (database, up))


class RelayedHealth(ForwarderHealth):
    """This process's forwarder health, its changes passed on to the daemon's, which logs them
    once for all processes (and tells `status`, metrics and systemd's STATUS)."""

    def __init__(self, link: DaemonLink) -> None:
        super().__init__()
        self._link = link

    def succeeded(self, forwarder: str, *, quiet: bool = False) -> None:
        version = self.version
        super().succeeded(forwarder, quiet=True)
        if self.version != version:  # most batches change nothing: nothing to send
            self._link.send("health", "succeeded", forwarder)

    def failed(self, forwarder: str, error: str, *, quiet: bool = False) -> bool:
        logged = super().failed(forwarder, error, quiet=True)
        self._link.send("health", "failed", forwarder, error)
        return logged


def serve(
    config: BridgeConfig, share: Share, connection: Connection, metrics: bool, level: int
) -> None:
    """A worker process's life: run `share` until the daemon says stop or goes away."""
    # systemd listens to the daemon's process only (NotifyAccess=main).
    os.environ.pop("NOTIFY_SOCKET", None)
    setup_logging(logging.getLevelName(level))
    stop = threading.Event()
    signalled: list[str] = []

    def on_stop(signum: int, frame: FrameType | None) -> None:
        signalled.append(signal.Signals(signum).name)
        stop.set()

    # SIGINT and SIGTERM reach the whole process group from a terminal, and the whole
    # service from systemd: stop as the daemon does. SIGHUP is the daemon's to handle.
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    setup_sentry(config.sentry)
    tune_garbage_collection()
    link = DaemonLink(connection)
    code = _serve(config, share, link, stop, metrics)
    if signalled:
        link.send("signalled", signalled[0])
    flush_sentry()
    logging.shutdown()
    sys.stderr.flush()
    # Threads still inside a database call must not hold the process: their transactions
    # are rolled back when the connections go away with it.
    os._exit(code)


def _serve(
    config: BridgeConfig, share: Share, link: DaemonLink, stop: threading.Event, metrics: bool
) -> int:
    # Probed by the daemon only: this process hears from it when a database is usable again.
    outages = OutageTracker(probe_interval(config), external_probe=True, quiet=True)
    outages.listener = lambda change, args: link.send("outage", change, args)
    boards: dict[str, WorkBoard] = {}  # filled once the workers start
    threading.Thread(
        target=link.listen, args=(stop, outages, boards), name="daemon-link", daemon=True
    ).start()
    load_drivers(config.databases)
    health = RelayedHealth(link)
    observer = RelayedObserver(link) if metrics else None
    pools = start_pools(config, share, stop, outages, health, observer)
    boards.update(pools.boards)
    link.send("ready")
    limit = progress_limit(config)
    while not stop.wait(BEAT_INTERVAL):
        link.send("beat", pools.alive(limit), dict(pools.totals()))
    pools.close()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for thread in pools.threads():
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    link.send("beat", True, dict(pools.totals()))
    abandoned = [thread.name for thread in pools.threads() if thread.is_alive()]
    if abandoned:
        log.warning(
            "worker(s) %s still waiting on a database after %.0f s; leaving without them "
            "(their batches are rolled back)",
            ", ".join(abandoned),
            STOP_GRACE_SECONDS,
        )
    return 0
