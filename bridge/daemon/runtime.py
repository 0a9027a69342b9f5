"""The daemon: per forwarding database a watcher and a pool of workers, upkeep, signals, systemd.

Work is looked for per database, not per worker (`bridge.daemon.watcher`): one query tells
which queues and retry stores have work, and the database's pool workers
(`bridge.daemon.workers`), shared by its forwarders, go where it is, taking turns round-robin
(`bridge.daemon.board`) so one busy queue cannot starve the others, each forwarder capped at its
`concurrency`. Pools are sized so that the daemon never holds more than a database's
`max_connections` (`bridge.daemon.budget`). With `daemon.processes` above one, further worker
processes run parts of every pool, each on an interpreter of its own
(`bridge.daemon.processes`); the rest stays here. Scheduled jobs on APScheduler, one at a time
(`bridge.daemon.upkeep`), probe destination databases in trouble (one probe per database per
interval, so no worker waits on a dead database), publish states for `status`, and clean up
ledgers; each forwarding database's heartbeat job has a thread of its own there
(`bridge.daemon.heartbeat`).
SIGTERM / SIGINT let every worker finish the batch it holds (each batch is one source
transaction, so stopping between batches loses nothing), record the daemon stopped and exit 0.
SIGHUP reloads the configuration, keeping the old one if the new one is invalid.
"""

from __future__ import annotations

import logging
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from types import FrameType

from bridge.config.model import BridgeConfig
from bridge.connections import Connections, load_drivers
from bridge.daemon.budget import (
    MAX_AUTO_PROCESSES,
    pool_sizes,
    process_count,
    shares,
    worker_count,
)
from bridge.daemon.catch_up import needs_catch_up
from bridge.daemon.cpus import Cpus, usable_cpus
from bridge.daemon.forwarder_health import ForwarderHealth
from bridge.daemon.heartbeat import Heartbeat
from bridge.daemon.login_check import start_login_check
from bridge.daemon.metrics import SAMPLE_INTERVAL, BridgeMetrics
from bridge.daemon.pools import STOP_GRACE_SECONDS, Pools, progress_limit, start_pools
from bridge.daemon.probes import PROBE_TICK, probe_databases
from bridge.daemon.processes import WorkerProcesses
from bridge.daemon.readiness import DestinationChecks, Liveness, Seen, readiness
from bridge.daemon.servicecontrol.reporter import ServiceControlReporter
from bridge.daemon.state_publisher import StatePublisher
from bridge.daemon.systemd import notify, watchdog_interval
from bridge.daemon.tracing import ProcessTracer, start_tracing, stop_tracing
from bridge.daemon.upkeep import HEARTBEAT_LANE, Upkeep
from bridge.exceptions import ExitCode, MetricsStartError, TracingUnavailable
from bridge.forwarding.in_doubt import SETTLE_INTERVAL_MAX, needs_resolving, resolve_in_doubt
from bridge.forwarding.notices import Notices
from bridge.forwarding.spine import probe_interval
from bridge.outages import OutageTracker
from bridge.storage.archive import expire_archives
from bridge.storage.ledger import cleanup_ledgers

__all__ = ["Daemon", "probe_databases", "worker_count"]

log = logging.getLogger(__name__)


# How much longer the daemon waits for its worker processes, which keep the same grace.
PROCESS_GRACE_MARGIN = 3.0


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
        self._pools = Pools()
        self._processes: WorkerProcesses | None = None
        self._catch_up_folder: str | None = None  # `bridge.daemon.catch_up`'s shared state
        self._worker_stop = threading.Event()
        self._upkeep: Upkeep | None = None
        self._earlier_totals: Counter[str] = Counter()  # from workers replaced by a reload
        # Metrics live as long as the process: a reload keeps the server and the counters.
        self.metrics: BridgeMetrics | None = (
            BridgeMetrics(config) if config.metrics.listen is not None else None
        )
        self._sampling: Connections | None = None  # the metrics sampler's, while running
        # Whether each forwarder's batches succeed; kept across reloads, like the metrics.
        self.health = ForwarderHealth()
        self._outages: OutageTracker | None = None
        # This process in every forwarding database's daemons table, for `status`.
        self.heartbeat = Heartbeat(config)
        # Heartbeats and custom checks for ServiceControl, when configured.
        self.servicecontrol = ServiceControlReporter()
        # Worker threads still inside a database call when the daemon stopped (see `stop`).
        self.abandoned: list[str] = []
        # What `/healthz` and `/readyz` answer (`bridge.daemon.readiness`).
        self.liveness = Liveness()
        self._checks: DestinationChecks | None = None
        self._started = False
        self.tracer: ProcessTracer | None = None  # made by `run` when tracing is on

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
        try:
            # Made once, for the process's life, like the metrics: a reload keeps it.
            self.tracer = start_tracing(self.config)
        except TracingUnavailable as error:
            log.error("cannot start: %s; %s", error, error.advice)
            return ExitCode.FAILED
        if self.metrics is not None and self.config.metrics.listen is not None:
            try:
                self.metrics.serve(self.config.metrics.listen, self.liveness.check, self.readiness)
            except MetricsStartError as error:
                log.error("cannot start: %s", error)
                stop_tracing(self.tracer)
                return ExitCode.FAILED
        try:
            return self._run_started()
        finally:
            if self.metrics is not None:
                self.metrics.close()
            stop_tracing(self.tracer)

    def _run_started(self) -> int:
        self.start()
        notify("READY=1")
        if self._workers_alive():
            self.liveness.fed()
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
            if self._workers_alive():
                self.liveness.fed()
                if interval:
                    notify("WATCHDOG=1")
        notify("STOPPING=1")
        self.stop()
        self.heartbeat.stopped()
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
            for kind, word in (
                ("unreachable", "DOWN"),
                ("read-only", "READ-ONLY"),
                ("not-ready", "NOT READY"),
                ("auth-failed", "AUTH FAILED"),
            ):
                names = [state.database for state in troubled if state.state == kind]
                if names:
                    parts.append(f"{word}: " + ", ".join(names))
        return "; ".join(parts)

    def readiness(self) -> tuple[bool, dict[str, object]]:
        """(ready, the body of `/readyz`): from memory only (`bridge.daemon.readiness`)."""
        config, outages, checks = self.config, self._outages, self._checks
        metrics = self.metrics
        seen = Seen(
            started=self._started,
            workers_alive=self._workers_alive(),
            failing={state.forwarder: state.last_error for state in self.health.failing()},
            heartbeats=self.heartbeat.checks.states(),
            destination_checks=checks.checks.states() if checks is not None else {},
            databases={state.database: state for state in outages.states()} if outages else {},
            paused=metrics.paused_forwarders() if metrics is not None else (),
            now=time.monotonic(),
        )
        return readiness(config, seen, config.daemon.heartbeat)

    def totals(self) -> Counter[str]:
        total: Counter[str] = Counter(self._earlier_totals)
        total.update(self._pools.totals())
        if self._processes is not None:
            total.update(self._processes.totals())
        return total

    def start(self) -> None:
        """Start watchers, workers and upkeep in background threads; returns at once."""
        load_drivers(self.config.databases)
        start_login_check(self.config)
        self._worker_stop = stop = threading.Event()
        outages = OutageTracker(probe_interval(self.config), external_probe=True)
        self._outages = outages
        self.heartbeat.logins = outages
        publisher = StatePublisher(self.config, outages, self.health)
        if self.metrics is not None:
            self.metrics.use_config(self.config, outages, self.health)
            self.metrics.set_workers(
                {f.name: worker_count(self.config, f) for f in self.config.forwarders}
            )
        cpus = usable_cpus()
        count = process_count(self.config, cpus.usable)
        parts = shares(self.config, count)
        if needs_catch_up(self.config):
            # Their state, shared by the processes; a reload starts afresh.
            self._catch_up_folder = tempfile.mkdtemp(prefix="sfbridge-catch-up-")
            parts = [replace(part, catch_up_folder=self._catch_up_folder) for part in parts]
        notices = Notices()  # what every process learns of a table, said once
        if count > 1 or self.config.daemon.processes == "auto":
            log.info(
                "%d process%s run%s the workers (daemon.processes: %s)",
                count,
                "es" if count > 1 else "",
                "" if count > 1 else "s",
                _processes_said(self.config, count, cpus),
            )
        if count > 1:
            self._processes = WorkerProcesses(
                self.config, parts[1:], self.health, self.metrics, outages, notices
            )
            self._processes.start()
        else:
            self._processes = None
        if self.metrics is not None:
            self.metrics.use_worker_processes(
                self._processes.states if self._processes is not None else None
            )
        # The watchers are all here: they mark the worker processes' boards too.
        self._pools = start_pools(
            self.config,
            parts[0],
            stop,
            outages,
            self.health,
            self.metrics,
            watched=sorted({database for part in parts for database in part.pools}),
            relay=self._processes.mark if self._processes is not None else None,
            backlog=self._processes.backlog if self._processes is not None else None,
            notices=notices,
            tracer=self.tracer,
        )
        if self._processes is not None:
            self._processes.mark_here = self._pools.mark
        forwarding_databases = self.heartbeat.forwarding_databases()
        checks = DestinationChecks(self.config, outages) if self.metrics is not None else None
        self._checks = checks
        checked = checks.databases if checks is not None else []
        upkeep = Upkeep(heartbeats=len(forwarding_databases) + len(checked))
        if self.config.ledger.cleanup:
            upkeep.add(
                lambda: cleanup_ledgers(self.config, outages),
                self.config.ledger.cleanup_interval,
                name="ledger cleanup",
                at_once=True,
            )
        if self.config.error_archive.cleanup:
            upkeep.add(
                lambda: expire_archives(self.config, outages),
                self.config.error_archive.cleanup_interval,
                name="error archive expiry",
                at_once=True,
            )
        if needs_resolving(self.config):
            upkeep.add(
                self._settle_in_doubt,
                min(self.config.retries.delay, SETTLE_INTERVAL_MAX),
                name="settling in-doubt transactions",
                at_once=True,
            )
        upkeep.add(
            lambda: probe_databases(self.config, outages),
            min(PROBE_TICK, outages.probe_interval),
            name="probes",
        )
        upkeep.add(publisher.publish, 2.0, name="state publishing")
        upkeep.add(self._log_progress, 60.0, name="progress log")
        if self.metrics is not None:
            self._sampling = sampling = Connections(self.config.databases, outages)
            metrics = self.metrics
            upkeep.add(
                lambda: metrics.sample(sampling),
                SAMPLE_INTERVAL,
                name="depth readings",
                at_once=True,
            )
        # Heartbeats apart from the other jobs, a thread per forwarding database: a database
        # that does not answer delays only its own row, never another's, where this daemon
        # would otherwise look missing while it runs (`bridge.daemon.budget` counts the
        # connection).
        for database in forwarding_databases:
            upkeep.add(
                partial(self.heartbeat.beat, database),
                self.config.daemon.heartbeat,
                name=f"heartbeat {database}",
                at_once=True,
                lane=HEARTBEAT_LANE,
            )
        # The destinations' checks for `/readyz`, every heartbeat, in threads of their own too:
        # a silent destination holds up only its own check.
        for database in checked:
            assert checks is not None
            upkeep.add(
                partial(checks.check, database),
                self.config.daemon.heartbeat,
                name=f"readiness check {database}",
                at_once=True,
                lane=HEARTBEAT_LANE,
            )
        self.servicecontrol.schedule(upkeep, self.config, outages, self.health, stop)
        self._upkeep = upkeep
        upkeep.start()
        if self._processes is not None:
            self._processes.wait_until_ready(give_up=self._stop)
            for process in self._processes.processes:
                process.on_ready = self._pools.look_again
        # Only now: what the watchers' first look marks reaches every process's boards.
        self._pools.start_watchers()
        self._started = True

    def _settle_in_doubt(self) -> None:
        """The scheduled job: settle what crashed batches left (`bridge.forwarding.in_doubt`)."""
        connections = Connections(self.config.databases, self._outages)
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
        """Let every worker finish its batch and stop the watchers and upkeep, waiting for them
        at most `STOP_GRACE_SECONDS` in all. A worker still inside a database call then (a
        database that does not answer, on a driver without a client-side deadline) is left
        behind and named in `abandoned`: its source transaction is open only on a connection
        that goes away with the process, so the server rolls it back, and a destination commit
        it made is in the dedup ledger."""
        self._started = False
        self._worker_stop.set()
        upkeep, self._upkeep = self._upkeep, None
        if upkeep is not None:
            upkeep.stop()
        processes, self._processes = self._processes, None
        if processes is not None:
            processes.ask_to_stop()
        self._pools.close()
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        threads: list[threading.Thread] = self._pools.threads()
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self.abandoned = [thread.name for thread in threads if thread.is_alive()]
        if upkeep is not None:
            self.abandoned += upkeep.join(deadline)
        if processes is not None:
            self.abandoned += processes.wait(deadline + PROCESS_GRACE_MARGIN)
            self._earlier_totals.update(processes.totals())
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
        if self._checks is not None:
            self._checks.close()
            self._checks = None
        if self._catch_up_folder is not None:
            shutil.rmtree(self._catch_up_folder, ignore_errors=True)
            self._catch_up_folder = None

    def _workers_alive(self) -> bool:
        # A worker that has not looped for a long time is hung (a statement that never
        # returns); withholding the watchdog ping lets systemd restart the daemon.
        limit = progress_limit(self.config)
        processes = self._processes
        return self._pools.alive(limit) and (processes is None or processes.alive(limit))

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
        if new_config.tracing.enabled != self.config.tracing.enabled:
            log.warning(
                "tracing.enabled changed to %s: that takes a restart; tracing stays %s",
                str(new_config.tracing.enabled).lower(),
                "on" if self.tracer is not None else "off",
            )
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
        self.heartbeat.use_config(new_config)
        self.start()
        notify("READY=1")
        if self._workers_alive():
            self.liveness.fed()

    def _log_progress(self) -> None:
        log.info("progress: %s", _format_counts(self.totals()))


def _format_counts(counts: Counter[str]) -> str:
    return ", ".join(f"{name} {value}" for name, value in sorted(counts.items())) or "nothing"


def _processes_said(config: BridgeConfig, count: int, cpus: Cpus) -> str:
    """`daemon.processes` as set, and for `auto` what it found and what limited it."""
    setting = config.daemon.processes
    if setting != "auto":
        return setting
    said = f"auto: {cpus.affinity} CPU(s)"
    if cpus.quota is not None:
        said += f", a CPU quota of {cpus.quota:g}"
    if count < min(cpus.usable, MAX_AUTO_PROCESSES):
        said += f", the largest pool has {max(pool_sizes(config).values())} worker(s)"
    elif cpus.usable > MAX_AUTO_PROCESSES:
        said += f", at most {MAX_AUTO_PROCESSES}"
    return said
