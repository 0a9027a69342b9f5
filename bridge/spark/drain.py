"""`sfbridge spark drain`: a forwarding queue drained by Spark tasks, each running the daemon's
own data path over its share of the queue.

The driver cuts each queue's sequence column into ranges of about equal rows (the database
gives the sequence value of every n-th row), one per task. A task claims batches inside its
range with the same destructive, row-locking `DELETE` as the daemon (never a copy-then-delete
read, which loses rows committed out of order), delivers them with the ledger and settles them,
one source transaction per batch. So a drain is safe beside running daemons, safe to kill at any
moment (a batch in flight rolls back, or its redelivery hits the ledger) and rerun, and a Spark
task retry only claims what is left. Progress is read from the counters every batch writes with
its claim (a few rows), never by counting the queue. What the drain did is counted from the
databases afterwards (`bridge.spark.reconcile`), not from task results, which lose failed
attempts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.connections import Connections
from bridge.dialects import dialect_for
from bridge.exceptions import DatabaseError
from bridge.forwarding.in_doubt import needs_resolving, resolve_in_doubt
from bridge.forwarding.settle import CLAIMED
from bridge.forwarding.spine import BatchForwarder, tune_garbage_collection
from bridge.spark.ranges import rows_per_range, seq_ranges
from bridge.spark.shipped import ShippedConfig
from bridge.storage.tables import forwarder_tables

log = logging.getLogger(__name__)

# Counter slots of drain tasks, apart from the daemon's workers (0, 1, ...).
SLOT_BASE = 1000
MAX_PARTITIONS = 64


@dataclass(frozen=True)
class DrainTask:
    config: ShippedConfig
    forwarder: str
    first: int
    last: int
    index: int


@dataclass(frozen=True)
class QueuePlan:
    forwarder: str
    queued: int
    first: int | None
    last: int | None
    ranges: tuple[tuple[int, int], ...]


def plan_drain(
    config: BridgeConfig, forwarders: Iterable[ForwarderConfig], partitions: int
) -> list[QueuePlan]:
    """Each forwarder's queue bounds and the ranges (inclusive) its tasks will drain: about
    queued / `partitions` rows each."""
    plans = []
    connections = Connections(config.databases)
    try:
        for forwarder in forwarders:
            dialect = dialect_for(config.databases[forwarder.database].dialect)
            queue = forwarder_tables(config, forwarder).queue
            connection = connections.get(forwarder.database)
            connection.begin_read()
            [(first, last, count)] = connection.query(dialect.sql("queue_seq_bounds", queue=queue))
            cuts: list[int] = []
            if count:
                step = rows_per_range(int(count), partitions)
                cuts = [
                    int(value)
                    for (value,) in connection.query(
                        dialect.sql("queue_seq_boundaries", queue=queue), (step,)
                    )
                ]
            connection.commit()
            ranges = [
                (after + 1, up_to) for after, up_to in seq_ranges(int(first), int(last), cuts)
            ] if count else []  # fmt: skip
            plans.append(QueuePlan(forwarder.name, int(count or 0), first, last, tuple(ranges)))
    finally:
        connections.close()
    return plans


def drain_partition(tasks: Iterable[DrainTask]) -> Iterator[dict[str, Any]]:
    """Runs on an executor: drain each task's range with the daemon's BatchForwarder."""
    tune_garbage_collection()  # as the daemon does: this process forwards batches now
    for task in tasks:
        config = task.config.load()
        forwarder = config.forwarder(task.forwarder)
        connections = Connections(config.databases)
        claimed, counts = 0, Counter[str]()
        try:
            batches = BatchForwarder(config, forwarder, connections, slot=SLOT_BASE + task.index)
            while True:
                report = batches.forward_batch("queue", seq_range=(task.first, task.last))
                claimed += report.claimed
                counts.update(report.counts)
                # Not full: the range is empty, or what is left is held by other workers.
                if not report.full:
                    break
        finally:
            connections.close()
        yield {
            "forwarder": task.forwarder,
            "range": [task.first, task.last],
            "claimed": claimed,
            "counts": dict(counts),
        }


def run_drain(
    spark: Any,
    config: BridgeConfig,
    shipped: ShippedConfig,
    plans: list[QueuePlan],
    out: TextIO,
) -> list[dict[str, Any]]:
    """Run the drain's tasks on `spark`, printing progress; returns the tasks' own reports."""
    tasks = [
        DrainTask(shipped, plan.forwarder, first, last, index)
        for plan in plans
        for index, (first, last) in enumerate(plan.ranges)
    ]
    if not tasks:
        return []
    context = spark.sparkContext
    context.setJobGroup("sfbridge-drain", "sfbridge spark drain", interruptOnCancel=True)
    progress = _Progress(config, plans, context, len(tasks), out)
    progress.start()
    try:
        return list(context.parallelize(tasks, len(tasks)).mapPartitions(drain_partition).collect())
    finally:
        progress.stop()
        _settle_what_failed_tasks_left(config)


def _settle_what_failed_tasks_left(config: BridgeConfig) -> None:
    """A task killed (or retried by Spark) between a prepare and its commit leaves a prepared
    transaction or an in-flight record: settle them now, as a daemon would at start, so a
    drain never leaves prepared transactions behind when no daemon runs."""
    if not needs_resolving(config):
        return
    connections = Connections(config.databases)
    try:
        settled = resolve_in_doubt(config, connections)
    finally:
        connections.close()
    for problem in settled.problems:
        log.warning("settling prepared transactions after the drain: %s", problem)


class _Progress(threading.Thread):
    """A line every 2 s: messages claimed from the queues since the drain began (by its tasks
    and by any daemon), rate, tasks done. Read from the counters that every batch writes in
    its own transaction, a few rows per forwarder: a backlog of millions is never counted."""

    def __init__(
        self, config: BridgeConfig, plans: list[QueuePlan], context: Any, tasks: int, out: TextIO
    ) -> None:
        super().__init__(daemon=True)
        self._config = config
        self._forwarders = [plan.forwarder for plan in plans]
        self._context = context
        self._tasks = tasks
        self._out = out
        self._stop_event = threading.Event()
        self._start = time.monotonic()
        self._initial = sum(plan.queued for plan in plans)
        connections = Connections(config.databases)
        try:
            self._before = _claimed(config, connections, self._forwarders)
        finally:
            connections.close()
        self._connections = Connections(config.databases)

    def run(self) -> None:
        while not self._stop_event.wait(2.0):
            self.report()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)
        if not self.is_alive():
            self.report()
            self._connections.close()

    def report(self) -> None:
        claimed = _claimed(self._config, self._connections, self._forwarders)
        moved = claimed - self._before if claimed is not None and self._before is not None else None
        elapsed = time.monotonic() - self._start
        done = _tasks_done(self._context)
        rate = f"{moved / elapsed:,.0f} msg/s" if moved is not None and elapsed > 0 else "-"
        shown = f"{moved:,}" if moved is not None else "?"
        print(
            f"[{elapsed:6.1f}s] moved {shown} of {self._initial:,} ({rate}); "
            f"partitions done {done}/{self._tasks}",
            file=self._out,
            flush=True,
        )


def _claimed(config: BridgeConfig, connections: Connections, names: list[str]) -> int | None:
    """Messages the forwarders `names` claimed so far, all slots summed; None if unreadable."""
    total = 0
    for name in names:
        forwarder = config.forwarder(name)
        dialect = dialect_for(config.databases[forwarder.database].dialect)
        counters = forwarder_tables(config, forwarder).counters
        try:
            connection = connections.get(forwarder.database)
            connection.begin_read()
            rows = connection.query(dialect.sql("counters_read", counters=counters), (name,))
            connection.commit()
        except DatabaseError:
            connections.discard(forwarder.database)
            return None
        total += sum(int(value) for counter, value in rows if counter == CLAIMED)
    return total


def _tasks_done(context: Any) -> int:
    tracker = context.statusTracker()
    done = 0
    for job in tracker.getJobIdsForGroup("sfbridge-drain"):
        info = tracker.getJobInfo(job)
        for stage in info.stageIds if info else ():
            stage_info = tracker.getStageInfo(stage)
            if stage_info:
                done += stage_info.numCompletedTasks
    return done


def partitions_for(requested: int | None, spark_default: int) -> int:
    """Tasks per queue: as asked, else Spark's default parallelism; at most MAX_PARTITIONS
    (each task holds a connection to the forwarding and destination databases)."""
    return max(1, min(requested or spark_default, MAX_PARTITIONS))
