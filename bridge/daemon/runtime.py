"""The daemon: worker threads per forwarder, scheduled upkeep, signals, systemd.

Each worker loops peek -> receive batches until the queue looks empty -> sleep the peek
interval, like the NServiceBus transport's own receive loop. Every worker also forwards due
retries, one retry batch in turn with one queue batch while both have work, so a backlog
that built up during an outage drains at full speed without holding up new messages.
Scheduled jobs probe destination databases in trouble (one probe per database per interval,
so no worker waits on a dead database), publish their states for `status`, and clean up
ledgers. SIGTERM / SIGINT let every worker finish the batch it holds (each batch is one
source transaction, so stopping between batches loses nothing) and exit 0. SIGHUP reloads
the configuration, keeping the old one if the new one is invalid.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from types import FrameType

from apscheduler.schedulers.background import BackgroundScheduler

from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.connections import Connections
from bridge.daemon.forwarder_health import ForwarderHealth
from bridge.daemon.metrics import SAMPLE_INTERVAL, BridgeMetrics
from bridge.daemon.observability import report_exception
from bridge.daemon.state_publisher import StatePublisher
from bridge.daemon.systemd import notify, watchdog_interval
from bridge.dialects import dialect_for
from bridge.exceptions import (
    BridgeTableMissing,
    DatabaseError,
    DatabaseUnavailable,
    ExitCode,
    MetricsStartError,
    PermissionDenied,
    TableNotFound,
)
from bridge.forwarding.in_doubt import SETTLE_INTERVAL_MAX, needs_resolving, resolve_in_doubt
from bridge.forwarding.observers import ForwardingObserver, safe_observer
from bridge.forwarding.spine import BatchForwarder, BatchReport, probe_interval
from bridge.forwarding.writes import QueueWriter
from bridge.outages import OutageTracker
from bridge.storage.ledger import (
    RUNTIME_DDL_OFF_ADVICE,
    cannot_create_advice,
    cleanup_ledgers,
    ensure_ledger,
    ledger_problem,
)
from bridge.storage.tables import forwarder_tables

log = logging.getLogger(__name__)


# How long a worker waits after a failed batch: doubling from the first to the most, so a
# forwarder that keeps failing costs its databases little and the log nothing (see
# bridge.daemon.forwarder_health).
FIRST_BACKOFF = 0.5
MAX_FAILURE_BACKOFF = 10.0
# How often a worker looks again for its forwarding tables when they do not exist, at least.
MISSING_TABLE_RETRY = 5.0
# How long SIGTERM waits for the batches in flight before the process leaves without them.
STOP_GRACE_SECONDS = 10.0


class Worker(threading.Thread):
    """Forwards one forwarder's queue and its due retries."""

    def __init__(
        self,
        config: BridgeConfig,
        forwarder: ForwarderConfig,
        index: int,
        stop: threading.Event,
        outages: OutageTracker,
        writer: QueueWriter,
        health: ForwarderHealth,
        observer: ForwardingObserver | None = None,
    ) -> None:
        super().__init__(name=f"{forwarder.name}-{index}", daemon=True)
        self.config = config
        self.forwarder = forwarder
        self.index = index
        self.stop = stop
        self.totals: Counter[str] = Counter()
        self.last_progress = time.monotonic()
        self._outages = outages
        self._writer = writer
        self._health = health
        # Every call through SafeObserver: a failing observer must not end the worker thread.
        self._observer = safe_observer(observer)
        self._lock = threading.Lock()

    def run(self) -> None:
        connections = Connections(self.config.databases)
        batches = BatchForwarder(
            self.config,
            self.forwarder,
            connections,
            slot=self.index,
            outages=self._outages,
            writer=self._writer,
            observer=self._observer,
        )
        name, database = self.forwarder.name, self.forwarder.database
        next_retry_poll = 0.0
        retry_backlog = queue_backlog = False
        source_down = False
        backoff = FIRST_BACKOFF
        try:
            while not self.stop.is_set():
                self.last_progress = time.monotonic()
                try:
                    if batches.pause_state().forwarder is not None:
                        retry_backlog = queue_backlog = False
                        self._health.succeeded(name)
                        self.stop.wait(self.forwarder.peek_interval)
                        continue
                    if retry_backlog or time.monotonic() >= next_retry_poll:
                        retry_backlog = self._forward(batches, "retry").full
                        if not retry_backlog:
                            next_retry_poll = time.monotonic() + self.forwarder.slow_poll_interval
                    estimate = 1 if queue_backlog else batches.queue_estimate()
                    queue_backlog = estimate > 0 and self._forward(batches, "queue").full
                    self._health.succeeded(name)
                    backoff = FIRST_BACKOFF
                    if source_down:
                        source_down = False
                        self._observer.database_seen(database, True)
                    if not (retry_backlog or queue_backlog):
                        self.stop.wait(self.forwarder.peek_interval)
                    continue
                except DatabaseUnavailable as error:
                    # Down, or silent past its query_timeout: the batch was rolled back (or
                    # its connection closed, which the server rolls back).
                    connections.discard(database)
                    if not source_down:
                        source_down = True
                        self._observer.database_seen(database, False)
                    self._health.failed(name, f"cannot read its queue: {error}")
                    wait = backoff
                except TableNotFound as error:
                    # What could be healed was (BatchForwarder heals its own tables).
                    connections.discard(database)
                    advice = "" if error.advice else "; run 'sfbridge install'"
                    self._health.failed(name, f"{error}{advice}")
                    wait = max(backoff, MISSING_TABLE_RETRY)
                except DatabaseError as error:
                    self._health.failed(name, str(error))
                    wait = backoff
                except Exception as error:  # the daemon must survive anything a batch throws
                    if self._health.failed(name, f"unexpected error: {error!r}"):
                        log.exception("forwarder '%s': unexpected error", name)
                        report_exception(error)
                    wait = backoff
                retry_backlog = queue_backlog = False
                self.stop.wait(wait)
                backoff = min(backoff * 2, MAX_FAILURE_BACKOFF)
        finally:
            connections.close()

    def _forward(self, batches: BatchForwarder, source: str) -> BatchReport:
        report = batches.forward_batch("retry" if source == "retry" else "queue")
        self.last_progress = time.monotonic()
        with self._lock:
            self.totals.update(report.counts)
        return report

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.totals)


def worker_count(config: BridgeConfig, forwarder: ForwarderConfig) -> int:
    """How many workers drain `forwarder`'s queue: its `concurrency`, or one where the database
    serialises writers (SQLite), since a second worker would only wait for the first."""
    dialect = dialect_for(config.databases[forwarder.database].dialect)
    return 1 if dialect.single_writer else forwarder.concurrency


def probe_databases(config: BridgeConfig, tracker: OutageTracker) -> None:
    """Look at each database in trouble whose probe is due; record what is found.

    A probe connects and makes sure the ledger is there (creating it when allowed), which is
    what delivery needs of a destination database. Never raises.
    """
    due = tracker.due_for_probe()
    if not due:
        return
    connections = Connections(config.databases)
    try:
        for database in due:
            try:
                connection = connections.get(database)
                ensure_ledger(connection, config, database, create=config.install.at_runtime)
                tracker.record_up(database)
            except BridgeTableMissing:
                tracker.record_trouble(
                    database, "not-ready", ledger_problem(config, database, RUNTIME_DDL_OFF_ADVICE)
                )
            except PermissionDenied as error:
                connections.discard(database)
                advice = cannot_create_advice(error.detail)
                tracker.record_trouble(
                    database, "not-ready", ledger_problem(config, database, advice)
                )
            except DatabaseError as error:
                connections.discard(database)
                tracker.record_trouble(database, "unreachable", str(error))
    finally:
        connections.close()


class Daemon:
    """Runs workers for every forwarder until told to stop."""

    def __init__(
        self, config: BridgeConfig, reload_config: Callable[[], BridgeConfig] | None = None
    ) -> None:
        self.config = config
        self._reload_config = reload_config
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._reload_requested = False
        self._workers: list[Worker] = []
        self._worker_stop = threading.Event()
        self._scheduler: BackgroundScheduler | None = None
        self._earlier_totals: Counter[str] = Counter()  # from workers replaced by a reload
        # Metrics live as long as the process: a reload keeps the server and the counters.
        self.metrics: BridgeMetrics | None = (
            BridgeMetrics(config) if config.metrics.listen is not None else None
        )
        self._sampling: Connections | None = None  # the metrics sampler's, while running
        # Whether each forwarder's batches succeed; kept across reloads, like the metrics.
        self.health = ForwarderHealth()
        self._outages: OutageTracker | None = None
        # Worker threads still inside a database call when the daemon stopped (see `stop`).
        self.abandoned: list[str] = []

    # -- control -------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def request_reload(self) -> None:
        self._reload_requested = True
        self._wake.set()

    def install_signal_handlers(self) -> None:
        def on_stop(signum: int, frame: FrameType | None) -> None:
            log.info("received %s; finishing in-flight batches", signal.Signals(signum).name)
            self.request_stop()

        def on_reload(signum: int, frame: FrameType | None) -> None:
            self.request_reload()

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, on_reload)

    # -- lifecycle -----------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped. Returns the process exit code (0: clean stop; 1: it could not
        start, said in the log)."""
        if self.metrics is not None and self.config.metrics.listen is not None:
            try:
                self.metrics.serve(self.config.metrics.listen)
            except MetricsStartError as error:
                log.error("cannot start: %s", error)
                return ExitCode.FAILED
        try:
            return self._run_started()
        finally:
            if self.metrics is not None:
                self.metrics.close()

    def _run_started(self) -> int:
        self.start()
        notify("READY=1")
        status = ""
        interval = watchdog_interval()
        while not self._stop.is_set():
            if (line := self.status_line()) != status:
                status = line
                notify(f"STATUS={status}")
            self._wake.wait(timeout=min(interval or 1.0, 1.0))
            self._wake.clear()
            if self._reload_requested:
                self._reload_requested = False
                self._reload()
            if interval and self._workers_alive():
                notify("WATCHDOG=1")
        notify("STOPPING=1")
        self.stop()
        log.info("stopped; forwarded since start: %s", _format_counts(self.totals()))
        return ExitCode.OK

    def status_line(self) -> str:
        """What `systemctl status` shows: how many queues, and what is wrong right now."""
        parts = [f"forwarding {len(self.config.forwarders)} queue(s)"]
        failing = self.health.failing()
        if failing:
            parts.append("FAILING: " + ", ".join(state.forwarder for state in failing))
        if self._outages is not None:
            troubled = [state for state in self._outages.states() if state.in_trouble]
            for kind, word in (("unreachable", "DOWN"), ("not-ready", "NOT READY")):
                names = [state.database for state in troubled if state.state == kind]
                if names:
                    parts.append(f"{word}: " + ", ".join(names))
        return "; ".join(parts)

    def totals(self) -> Counter[str]:
        total: Counter[str] = Counter(self._earlier_totals)
        for worker in self._workers:
            total.update(worker.snapshot())
        return total

    def start(self) -> None:
        """Start workers and scheduled jobs in background threads; returns at once."""
        self._worker_stop = threading.Event()
        self._workers = []
        outages = OutageTracker(probe_interval(self.config), external_probe=True)
        self._outages = outages
        publisher = StatePublisher(self.config, outages, self.health)
        if self.metrics is not None:
            self.metrics.use_config(self.config, outages, self.health)
            self.metrics.set_workers(
                {f.name: worker_count(self.config, f) for f in self.config.forwarders}
            )
        # Queue table shapes (SQL Server's optional Recoverable column) are learnt once.
        writer = QueueWriter()
        for forwarder in self.config.forwarders:
            count = worker_count(self.config, forwarder)
            tables = forwarder_tables(self.config, forwarder)
            log.info(
                "forwarder '%s': %d worker(s) on %s in database '%s'",
                forwarder.name,
                count,
                tables.queue_canonical,
                forwarder.database,
            )
            for index in range(count):
                self._workers.append(
                    Worker(
                        self.config,
                        forwarder,
                        index,
                        self._worker_stop,
                        outages,
                        writer,
                        self.health,
                        self.metrics,
                    )
                )
        for worker in self._workers:
            worker.start()
        self._scheduler = BackgroundScheduler(timezone="UTC")
        if self.config.ledger.cleanup:
            self._scheduler.add_job(
                cleanup_ledgers,
                "interval",
                args=[self.config, outages],
                seconds=self.config.ledger.cleanup_interval,
                max_instances=1,
                coalesce=True,
                next_run_time=datetime.now(UTC),
            )
        if needs_resolving(self.config):
            self._scheduler.add_job(
                self._settle_in_doubt,
                "interval",
                seconds=min(self.config.retries.delay, SETTLE_INTERVAL_MAX),
                max_instances=1,
                coalesce=True,
                next_run_time=datetime.now(UTC),
            )
        self._scheduler.add_job(
            probe_databases,
            "interval",
            args=[self.config, outages],
            seconds=min(1.0, outages.probe_interval),
            max_instances=1,
            coalesce=True,
        )
        self._scheduler.add_job(
            publisher.publish, "interval", seconds=2, max_instances=1, coalesce=True
        )
        self._scheduler.add_job(
            self._log_progress, "interval", seconds=60, max_instances=1, coalesce=True
        )
        if self.metrics is not None:
            self._sampling = Connections(self.config.databases)
            self._scheduler.add_job(
                self.metrics.sample,
                "interval",
                args=[self._sampling],
                seconds=SAMPLE_INTERVAL,
                max_instances=1,
                coalesce=True,
                next_run_time=datetime.now(UTC),
            )
        self._scheduler.start()

    def _settle_in_doubt(self) -> None:
        """The scheduled job: settle what crashed batches left (`bridge.forwarding.in_doubt`)."""
        connections = Connections(self.config.databases)
        try:
            settled = resolve_in_doubt(self.config, connections)
        except Exception:
            log.exception("settling prepared transactions and in-flight records failed")
            return
        finally:
            connections.close()
        for problem in settled.problems:
            log.warning("settling prepared transactions: %s", problem)
        if self.metrics is not None:
            self.metrics.settled(
                settled.committed, settled.rolled_back, settled.suspected_duplicates
            )

    def stop(self) -> None:
        """Let every worker finish its batch and stop the scheduled jobs, waiting for them at
        most `STOP_GRACE_SECONDS` in all. A worker still inside a database call then (a
        database that does not answer, on a driver without a client-side deadline) is left
        behind and named in `abandoned`: its source transaction is open only on a connection
        that goes away with the process, so the server rolls it back, and a destination commit
        it made is in the dedup ledger."""
        self._worker_stop.set()
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
        for worker in self._workers:
            worker.join(timeout=max(0.0, deadline - time.monotonic()))
        self.abandoned = [worker.name for worker in self._workers if worker.is_alive()]
        if self.abandoned:
            log.warning(
                "worker(s) %s still waiting on a database after %.0f s; leaving without them "
                "(their batches are rolled back)",
                ", ".join(self.abandoned),
                STOP_GRACE_SECONDS,
            )
        if self._sampling is not None:
            self._sampling.close()
            self._sampling = None

    def _workers_alive(self) -> bool:
        # A worker that has not looped for a long time is hung (a statement that never
        # returns); withholding the watchdog ping lets systemd restart the daemon.
        limit = max(60.0, max((w.forwarder.peek_interval for w in self._workers), default=1) * 5)
        now = time.monotonic()
        return all(w.is_alive() and now - w.last_progress < limit for w in self._workers)

    def _reload(self) -> None:
        if self._reload_config is None:
            return
        notify("RELOADING=1")
        try:
            new_config = self._reload_config()
        except Exception as error:
            # One line per problem: a log argument's line breaks are escaped.
            log.error("reload failed, keeping the running configuration:")
            for line in str(error).splitlines():
                log.error("  %s", line)
            notify("READY=1")
            return
        if new_config.metrics.listen != self.config.metrics.listen:
            log.warning(
                "metrics.listen changed (%s -> %s): that takes a restart; metrics stay %s",
                self.config.metrics.listen or "off",
                new_config.metrics.listen or "off",
                f"at {self.config.metrics.listen}" if self.metrics else "off",
            )
        log.info("configuration reloaded; restarting workers")
        self.stop()
        self._earlier_totals = self.totals()
        self.config = new_config
        self.start()
        notify("READY=1")

    def _log_progress(self) -> None:
        log.info("progress: %s", _format_counts(self.totals()))


def _format_counts(counts: Counter[str]) -> str:
    return ", ".join(f"{name} {value}" for name, value in sorted(counts.items())) or "nothing"
