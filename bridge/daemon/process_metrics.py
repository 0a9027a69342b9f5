"""The worker processes' memory, CPU time and open files, for the daemon's metrics endpoint:
`sfbridge_process_*` is the daemon's own process only (prometheus-client's process collector
reads /proc/self), so each worker process shows as `sfbridge_worker_process_*{process="2"}`,
with how often it was started again. Read at scrape time from /proc, as that collector does."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import partial

from prometheus_client import ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bridge.daemon.processes import WorkerProcessState

PREFIX = "sfbridge_worker_process_"


class WorkerProcessCollector(Collector):
    """`sfbridge_worker_process_*`, one series per worker process (`process`: its number)."""

    def __init__(self) -> None:
        self._states: Callable[[], Iterable[WorkerProcessState]] = list

    def follow(self, states: Callable[[], Iterable[WorkerProcessState]] | None) -> None:
        """Show these worker processes from now on (none: the daemon runs in one process)."""
        self._states = states or list

    def collect(self) -> Iterator[Metric]:
        states = list(self._states())
        if not states:
            return
        families: dict[str, Metric] = {}
        restarts = CounterMetricFamily(
            PREFIX + "restarts",
            "Times the worker process was started again after it ended by itself.",
            labels=["process"],
        )
        up = GaugeMetricFamily(
            PREFIX + "up", "1 while the worker process runs.", labels=["process"]
        )
        for state in states:
            label = str(state.number)
            restarts.add_metric([label], state.restarts)
            up.add_metric([label], 0 if state.pid is None else 1)
            if state.pid is None:
                continue
            pid = partial(int, state.pid)
            reader = ProcessCollector(namespace="sfbridge_worker", pid=pid, registry=None)
            for family in reader.collect():
                into = families.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type)
                )
                for sample in family.samples:
                    into.add_sample(sample.name, {"process": label}, sample.value)
        yield up
        yield restarts
        yield from families.values()
