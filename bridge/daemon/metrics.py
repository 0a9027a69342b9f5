"""Prometheus metrics for the daemon (`metrics.listen`), with the official prometheus-client.

Three kinds of figures, each from where it is known:

- what happens, counted as it happens (the data path tells a `ForwardingObserver`): messages
  by forwarder and outcome, deliveries and their latency per database, batch durations, busy
  workers. These start at zero with the process, as Prometheus expects of counters; the totals
  since install that `status` shows come from the database.
- what is there, sampled from the forwarding databases every few seconds by a scheduled job,
  never per scrape: queue, retry storage and error queue depths, the oldest message's age,
  pauses.
- what the bridge believes about each database (the outage tracker and the workers), read at
  scrape time from memory.

Label values are configuration names (forwarders, databases) and fixed words, never connection
strings or message content. The registry is this object's own, not the library's global one.
"""

from __future__ import annotations

import logging
import platform
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bridge.config.listen import parse_listen
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.daemon.forwarder_health import ForwarderHealth
from bridge.daemon.listener import Check, Listener
from bridge.daemon.process_metrics import WorkerProcessCollector
from bridge.daemon.processes import WorkerProcessState
from bridge.exceptions import DatabaseError, MetricsStartError
from bridge.forwarding.settle import (
    DELIVERED,
    DUPLICATES,
    ERRORS,
    EXPIRED,
    NO_SUBSCRIBERS,
    POISON,
    RETRIES,
)
from bridge.outages import OutageTracker
from bridge.storage.error_counts import read_error_counts
from bridge.storage.pauses import PauseState
from bridge.storage.queue_depths import QueueDepths, read_pause_state, read_queue_depths

log = logging.getLogger(__name__)

# How often queue depths are read from the forwarding databases.
SAMPLE_INTERVAL = 5.0

# Settle's counter names -> the `outcome` label (Prometheus label values use underscores).
OUTCOME_LABELS: Mapping[str, str] = {
    DELIVERED: "delivered",
    DUPLICATES: "duplicate_skipped",
    EXPIRED: "expired",
    RETRIES: "retry_scheduled",
    ERRORS: "error_queue",
    NO_SUBSCRIBERS: "no_subscribers",
}
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass
class _Sample:
    """What one forwarder held when last sampled; `depths` None when it could not be read."""

    depths: QueueDepths | None = None
    pauses: PauseState = field(default_factory=PauseState)
    # Messages in the error queue that this forwarder failed (by NServiceBus.FailedQ).
    in_error: int | None = None


class BridgeMetrics:
    """The daemon's metrics: an observer for the data path plus sampled and believed state.

    Create one per process; it survives configuration reloads (`use_config`).
    """

    def __init__(self, config: BridgeConfig, outages: OutageTracker | None = None) -> None:
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._config = config
        self._outages = outages
        self._health: ForwarderHealth | None = None
        self._samples: dict[str, _Sample] = {}
        self._error_others: dict[tuple[str, str], int] = {}
        self._forwarding_down: set[str] = set()
        self._server: Listener | None = None
        self._readyz: Check | None = None
        self._sampled_at: float | None = None
        registry = self.registry
        self.messages = Counter(
            "sfbridge_messages",
            "Messages settled, by forwarder and outcome (a published event counts once per "
            "subscriber copy).",
            ["forwarder", "outcome"],
            registry=registry,
        )
        self.claimed = Counter(
            "sfbridge_messages_claimed",
            "Messages claimed from the forwarding queue or retry storage.",
            ["forwarder", "source"],
            registry=registry,
        )
        self.poison = Counter(
            "sfbridge_poison_messages",
            "Rows of the forwarder's own queue whose headers could not be read, moved to the "
            "error queue as they were (also in outcome error_queue; they name no "
            "NServiceBus.FailedQ, so the error-queue gauge counts them as other).",
            ["forwarder"],
            registry=registry,
        )
        self.batch_failures = Counter(
            "sfbridge_batch_failures",
            "Batches rolled back because the forwarding database failed (the rows stay queued).",
            ["forwarder"],
            registry=registry,
        )
        self.deliveries = Counter(
            "sfbridge_destination_deliveries",
            "Messages committed into queues of this database (duplicates not counted).",
            ["database"],
            registry=registry,
        )
        self.delivery_latency = Histogram(
            "sfbridge_delivery_latency_seconds",
            "Time from claiming a message to its commit in the destination database.",
            ["database"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_duration = Histogram(
            "sfbridge_batch_duration_seconds",
            "Time one batch takes: claim, deliver, settle, commit.",
            ["forwarder", "source"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.catch_up_held_seconds = Counter(
            "sfbridge_catch_up_held_seconds",
            "Seconds batches for this database waited for its catch-up limits "
            "(max_messages_per_second, max_batches_in_flight), summed over the batches: "
            "rising while the limits hold traffic back.",
            ["database"],
            registry=registry,
        )
        self.catch_up_held_messages = Counter(
            "sfbridge_catch_up_held_messages",
            "Messages for this database that waited for its catch-up limits.",
            ["database"],
            registry=registry,
        )
        self.suspected_duplicates = Counter(
            "sfbridge_suspected_duplicates",
            "Messages of at-least-once routes that may have arrived twice: their batch ended "
            "between the destination and source commits.",
            ["forwarder"],
            registry=registry,
        )
        self.in_doubt_settled = Counter(
            "sfbridge_in_doubt_settled",
            "Prepared transactions (two-phase) left by a batch that did not finish, settled "
            "by their recorded decision.",
            ["outcome"],
            registry=registry,
        )
        self.workers_busy = Gauge(
            "sfbridge_workers_busy",
            "Workers inside a batch right now.",
            ["forwarder"],
            registry=registry,
        )
        self.workers = Gauge(
            "sfbridge_workers", "Workers running per forwarder.", ["forwarder"], registry=registry
        )
        Info("sfbridge_build", "The running sfbridge.", registry=registry).info(
            {"version": _version(), "python": platform.python_version()}
        )
        # The process's memory, CPU and open files, named sfbridge_process_* (Linux only).
        ProcessCollector(namespace="sfbridge", registry=registry)
        # ... and the worker processes', sfbridge_worker_process_* (`use_worker_processes`).
        self._worker_processes = WorkerProcessCollector()
        registry.register(self._worker_processes)
        registry.register(_StateCollector(self))
        self.use_config(config, outages)

    # -- configuration ---------------------------------------------------------------------

    def use_config(
        self,
        config: BridgeConfig,
        outages: OutageTracker | None,
        health: ForwarderHealth | None = None,
    ) -> None:
        """Follow a (re)loaded configuration, its outage tracker and forwarder health."""
        with self._lock:
            self._config = config
            self._outages = outages
            self._health = health
            names = {forwarder.name for forwarder in config.forwarders}
            self._samples = {n: s for n, s in self._samples.items() if n in names}
            self._forwarding_down &= set(config.databases)
        for forwarder in config.forwarders:
            for outcome in OUTCOME_LABELS.values():
                self.messages.labels(forwarder.name, outcome)  # present at 0 from the start
            # At 0 too, so that increase() sees the first suspected duplicates (an alert).
            self.suspected_duplicates.labels(forwarder.name)
            self.poison.labels(forwarder.name)  # at 0, for increase() and its alert
            self.workers_busy.labels(forwarder.name)

    def use_worker_processes(
        self, states: Callable[[], Iterable[WorkerProcessState]] | None
    ) -> None:
        """Show these worker processes' memory, CPU and restarts (None: there are none)."""
        self._worker_processes.follow(states)

    def set_workers(self, counts: Mapping[str, int]) -> None:
        for name, count in counts.items():
            self.workers.labels(name).set(count)
            # At 0 from the start: a series that first appears at 1 hides that failure from
            # increase(), and so from the SfbridgeBatchFailures alert.
            self.batch_failures.labels(name)

    # -- serving ---------------------------------------------------------------------------

    def serve(self, listen: str, healthz: Check, readyz: Check) -> None:
        """Serve `/metrics`, `/healthz` and `/readyz` on `listen` (HOST:PORT) from background
        threads (`bridge.daemon.listener`); `sfbridge_ready` follows `readyz`. Raises
        MetricsStartError saying what to do when the address cannot be used."""
        host, port = parse_listen(listen)
        try:
            self._server = Listener(host, port, self.registry, healthz, readyz)
        except OSError as error:
            reason = error.strerror or str(error)
            raise MetricsStartError(
                f"metrics.listen {listen}: cannot listen there ({reason}); choose a free port "
                "or an address of this host, or remove 'metrics' to run without metrics"
            ) from None
        self._readyz = readyz
        log.info(
            "serving Prometheus metrics at http://%s/metrics, health at /healthz and /readyz",
            listen,
        )

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()

    def paused_forwarders(self) -> list[str]:
        """Forwarders paused as a whole at the last sample (`sfbridge pause`)."""
        with self._lock:
            return [
                name
                for name, sample in self._samples.items()
                if any(pause.database is None for pause in sample.pauses.pauses)
            ]

    # -- ForwardingObserver ----------------------------------------------------------------

    def batch_started(self, forwarder: str) -> None:
        self.workers_busy.labels(forwarder).inc()

    def batch_finished(
        self,
        forwarder: str,
        source: str,
        claimed: int,
        counts: Mapping[str, int] | None,
        seconds: float,
    ) -> None:
        self.workers_busy.labels(forwarder).dec()
        if counts is None:
            self.batch_failures.labels(forwarder).inc()
            return
        if not claimed:
            return  # an empty poll: not a batch worth timing
        self.batch_duration.labels(forwarder, source).observe(seconds)
        self.claimed.labels(forwarder, source).inc(claimed)
        for name, outcome in OUTCOME_LABELS.items():
            if counts.get(name):
                self.messages.labels(forwarder, outcome).inc(counts[name])
        if counts.get(POISON):
            self.poison.labels(forwarder).inc(counts[POISON])

    def delivered(self, database: str, count: int, seconds_since_claim: float) -> None:
        self.deliveries.labels(database).inc(count)
        self.delivery_latency.labels(database).observe(seconds_since_claim)

    def held(self, database: str, messages: int, seconds: float) -> None:
        self.catch_up_held_seconds.labels(database).inc(seconds)
        self.catch_up_held_messages.labels(database).inc(messages)

    def database_seen(self, database: str, up: bool) -> None:
        with self._lock:
            if up:
                self._forwarding_down.discard(database)
            else:
                self._forwarding_down.add(database)

    # -- sampling --------------------------------------------------------------------------

    def settled(self, committed: int, rolled_back: int, suspected: Mapping[str, int]) -> None:
        """What a round of `bridge.forwarding.in_doubt` settled."""
        if committed:
            self.in_doubt_settled.labels("committed").inc(committed)
        if rolled_back:
            self.in_doubt_settled.labels("rolled_back").inc(rolled_back)
        for forwarder, count in suspected.items():
            self.suspected_duplicates.labels(forwarder).inc(count)

    def sample(self, connections: Connections) -> None:
        """Read every forwarder's depths and pauses (the scheduled job). Never raises: a
        database that cannot be read leaves its forwarders without depth figures."""
        with self._lock:
            config = self._config
        # Error queues: one grouped read per queue, shared by the forwarders that write to it.
        owned: dict[str, int] = {}
        others: dict[tuple[str, str], int] = {}
        for database in dict.fromkeys(f.database for f in config.forwarders):
            try:
                counts = read_error_counts(config, database, connections.get(database))
            except DatabaseError as error:
                connections.discard(database)
                log.debug("metrics: cannot count the error queues of '%s': %s", database, error)
                continue
            for count in counts:
                for name, messages in count.by_forwarder.items():
                    owned[name] = owned.get(name, 0) + messages
                others[(database, count.error_queue)] = count.other
        for forwarder in config.forwarders:
            sample = _Sample()
            try:
                connection = connections.get(forwarder.database)
                sample.depths = read_queue_depths(config, forwarder, connection)
                sample.pauses = read_pause_state(config, forwarder, connection)
                sample.in_error = owned.get(forwarder.name, 0)
            except DatabaseError as error:
                connections.discard(forwarder.database)
                log.debug("metrics: cannot read forwarder '%s': %s", forwarder.name, error)
            with self._lock:
                self._samples[forwarder.name] = sample
        with self._lock:
            self._error_others = others
            self._sampled_at = time.time()

    # -- scrape-time state -----------------------------------------------------------------

    def state_families(self) -> Iterator[Metric]:
        with self._lock:
            config = self._config
            outages = self._outages
            health = self._health
            samples = dict(self._samples)
            error_others = dict(self._error_others)
            forwarding_down = set(self._forwarding_down)
            sampled_at = self._sampled_at
        queue = GaugeMetricFamily(
            "sfbridge_queue_messages",
            "Messages held per forwarder: in its forwarding queue, retry storage, error queue.",
            labels=["forwarder", "queue"],
        )
        oldest = GaugeMetricFamily(
            "sfbridge_oldest_message_age_seconds",
            "Age of the oldest message in the forwarding queue, by its TimeSent (0 if empty).",
            labels=["forwarder"],
        )
        readable = GaugeMetricFamily(
            "sfbridge_queue_sample_ok",
            "1 when the forwarder's tables could be read at the last sample.",
            labels=["forwarder"],
        )
        paused = GaugeMetricFamily(
            "sfbridge_paused",
            "1 per pause (sfbridge pause): destination '' is the whole forwarder.",
            labels=["forwarder", "destination"],
        )
        held = GaugeMetricFamily(
            "sfbridge_retries_paused",
            "Of the forwarder's retry storage, messages held by a pause (of the forwarder or of "
            "their destination database) rather than by a failure.",
            labels=["forwarder"],
        )
        for name, sample in sorted(samples.items()):
            readable.add_metric([name], 0 if sample.depths is None else 1)
            if sample.depths is not None:
                depths = sample.depths
                queue.add_metric([name, "forwarding"], depths.queued)
                queue.add_metric([name, "retry"], depths.waiting_for_retry)
                held.add_metric([name], depths.held_by(sample.pauses))
                if sample.in_error is not None:
                    queue.add_metric([name, "error"], sample.in_error)
                oldest.add_metric([name], depths.oldest_age_seconds or 0.0)
            for pause in sample.pauses.pauses:
                paused.add_metric([name, pause.database or ""], 1)
        other = GaugeMetricFamily(
            "sfbridge_error_queue_other_messages",
            "Messages in an error queue the forwarders write to that no forwarder failed: the "
            "endpoints' own failures, rows without NServiceBus.FailedQ, poison.",
            labels=["database", "error_queue"],
        )
        for (database, error_queue), messages in sorted(error_others.items()):
            other.add_metric([database, error_queue], messages)
        yield from (queue, oldest, readable, paused, held, other)
        if sampled_at is not None:
            yield GaugeMetricFamily(
                "sfbridge_queue_sample_timestamp_seconds",
                "When queue depths were last read (Unix time).",
                value=sampled_at,
            )
        up = GaugeMetricFamily(
            "sfbridge_database_up",
            "1 unless the bridge last saw the database unreachable, read-only or not ready for "
            "delivery.",
            labels=["database"],
        )
        for database in sorted(config.databases):
            trouble = outages.in_trouble(database) if outages is not None else False
            up.add_metric([database], 0 if trouble or database in forwarding_down else 1)
        yield up
        refused = GaugeMetricFamily(
            "sfbridge_database_auth_failed",
            "1 while the database refuses the bridge's login (a wrong password, an unknown or "
            "NOLOGIN role, pg_hba.conf): tried again only every few minutes until a reload.",
            labels=["database"],
        )
        for database in sorted(config.databases):
            state = outages.state(database) if outages is not None else None
            refused.add_metric([database], 1 if state and state.state == "auth-failed" else 0)
        yield refused
        read_only = GaugeMetricFamily(
            "sfbridge_database_read_only",
            "1 while the database answers but takes no writes (a hot standby after a failover, "
            "default_transaction_read_only, a read-only or restoring SQL Server database): its "
            "messages wait in retry storage (sfbridge_database_up is 0 meanwhile).",
            labels=["database"],
        )
        for database in sorted(config.databases):
            state = outages.state(database) if outages is not None else None
            read_only.add_metric([database], 1 if state and state.state == "read-only" else 0)
        yield read_only
        failing = GaugeMetricFamily(
            "sfbridge_forwarder_failing",
            "1 while the forwarder's batches fail (its queue cannot be read, or a batch fails "
            "every time): it forwards nothing until they succeed again.",
            labels=["forwarder"],
        )
        failing_now = {state.forwarder for state in health.failing()} if health else set()
        for forwarder in config.forwarders:
            failing.add_metric([forwarder.name], 1 if forwarder.name in failing_now else 0)
        yield failing
        if self._readyz is not None:
            yield GaugeMetricFamily(
                "sfbridge_ready",
                "1 while /readyz answers 200: every forwarder served and forwarding, every "
                "database it uses usable (a pause counts as ready).",
                value=1 if self._readyz()[0] else 0,
            )


class _StateCollector(Collector):
    def __init__(self, metrics: BridgeMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics.state_families()


def _version() -> str:
    try:
        return metadata.version("sfbridge")
    except metadata.PackageNotFoundError:
        return "unknown"
