"""A worker process's life (`bridge.daemon.processes`): its share of the pools, run until the
daemon says stop or goes away, with what the daemon must know passed on over the pipe.

It has no watcher, no upkeep and no probes: the daemon's watchers mark its boards, and the
daemon tells it the outages it learns of (logged there, once for all processes).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from functools import partial
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

from bridge.config.model import BridgeConfig
from bridge.connections import load_drivers
from bridge.daemon.board import WorkBoard
from bridge.daemon.budget import Share
from bridge.daemon.forwarder_health import ForwarderHealth
from bridge.daemon.observability import flush_sentry, setup_logging, setup_sentry
from bridge.daemon.pools import STOP_GRACE_SECONDS, progress_limit, start_pools
from bridge.daemon.tracing import ProcessTracer, start_tracing, stop_tracing
from bridge.exceptions import TracingUnavailable
from bridge.forwarding.notices import Notices
from bridge.forwarding.spine import probe_interval, tune_garbage_collection
from bridge.outages import OutageTracker

log = logging.getLogger(__name__)

# How often a worker process tells the daemon it is alive and what it has forwarded.
BEAT_INTERVAL = 1.0


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
            while True:
                message = self._connection.recv()
                try:
                    _take_in(message, outages, boards)
                except Exception:  # one bad message must not end the listening
                    log.exception("could not take in what the daemon sent")
        except (EOFError, OSError):
            log.warning("the daemon is gone; stopping after the batches in flight")
        except Exception:
            log.exception("cannot read what the daemon sends; stopping")
        finally:
            stop.set()


def _take_in(message: Any, outages: OutageTracker, boards: dict[str, WorkBoard]) -> None:
    if not isinstance(message, tuple):
        return
    if message[0] == "outage":
        getattr(outages, message[1])(*message[2], relayed=True)
    elif message[0] == "mark" and message[1] in boards:
        boards[message[1]].mark(message[2])


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

    def held(self, database: str, messages: int, seconds: float) -> None:
        self._link.send("observer", "held", (database, messages, seconds))


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
    setup_logging(logging.getLevelName(level), log_format=config.logging.format)
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
    try:  # the daemon has made its own first and said what fails
        tracer = start_tracing(config, quiet=True)
    except TracingUnavailable:
        tracer = None
    code = _serve(config, share, link, stop, metrics, tracer)
    if signalled:
        link.send("signalled", signalled[0])
    stop_tracing(tracer)
    flush_sentry()
    logging.shutdown()
    sys.stderr.flush()
    # Threads still inside a database call must not hold the process: their transactions
    # are rolled back when the connections go away with it.
    os._exit(code)


def _serve(
    config: BridgeConfig,
    share: Share,
    link: DaemonLink,
    stop: threading.Event,
    metrics: bool,
    tracer: ProcessTracer | None,
) -> int:
    # Probed by the daemon only: this process hears from it when a database is usable again.
    outages = OutageTracker(probe_interval(config), external_probe=True, quiet=True)
    outages.listener = lambda change, args: link.send("outage", change, args)
    boards: dict[str, WorkBoard] = {}  # filled once the workers start
    threading.Thread(
        target=link.listen, args=(stop, outages, boards), name="daemon-link", daemon=True
    ).start()
    load_drivers(config.databases, quiet=True)  # one it cannot load: the daemon has said so
    health = RelayedHealth(link)
    observer = RelayedObserver(link) if metrics else None
    # Said by the daemon, once for all processes: every process learns the same of a table.
    notices = Notices(
        relay=lambda *notice: link.send("notice", *notice),
        repeats=lambda *told: link.send("repeat", *told),
    )
    # A backlog here: the daemon marks it on its own board and the other processes' boards.
    backlog = partial(link.send, "backlog")
    pools = start_pools(
        config,
        share,
        stop,
        outages,
        health,
        observer,
        backlog=backlog,
        notices=notices,
        tracer=tracer,
    )
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
