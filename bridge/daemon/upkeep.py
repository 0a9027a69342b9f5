"""The daemon's scheduled jobs, run one at a time in one thread.

One at a time so that upkeep holds at most one connection per database at any moment
(`bridge.daemon.budget` counts it as one): each job opens what it needs and closes it
before the next runs. A job that runs long delays the others; none is skipped, none runs
twice to catch up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class _Job:
    run: Callable[[], object]
    interval: float
    next_at: float


class Upkeep(threading.Thread):
    """Runs each added job every `interval` seconds until `stop` is set."""

    def __init__(self, stop: threading.Event, name: str = "upkeep") -> None:
        super().__init__(name=name, daemon=True)
        self._stop_event = stop
        self._jobs: list[_Job] = []

    def add(self, run: Callable[[], object], interval: float, *, at_once: bool = False) -> None:
        """Run `run` every `interval` s: the first time now (`at_once`) or after `interval`."""
        first = time.monotonic() + (0.0 if at_once else interval)
        self._jobs.append(_Job(run, interval, first))

    def run(self) -> None:
        while not self._stop_event.is_set() and self._jobs:
            job = min(self._jobs, key=lambda j: j.next_at)
            wait = job.next_at - time.monotonic()
            if wait > 0:
                self._stop_event.wait(wait)
                continue
            try:
                job.run()
            except Exception:
                log.exception("scheduled job %s failed", getattr(job.run, "__name__", job.run))
            job.next_at = max(job.next_at + job.interval, time.monotonic())
