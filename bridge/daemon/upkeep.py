"""The daemon's scheduled jobs, on one APScheduler `BackgroundScheduler` per process.

Jobs run in lanes (APScheduler executors, each a pool of threads):

- `upkeep`: one thread, so its jobs run one at a time and upkeep holds at most one connection
  per database at any moment (`bridge.daemon.budget` counts it as one): each job opens what it
  needs and closes it before the next runs. A job that runs long delays the others.
- `heartbeats`: a thread per forwarding database, so a database that does not answer delays
  only its own heartbeat (`bridge.daemon.heartbeat`).
- `servicecontrol`: two threads, the ServiceControl heartbeat and checks
  (`bridge.daemon.servicecontrol`), so a ServiceControl that does not answer delays neither
  upkeep nor the bridge's own heartbeats.

Every job has `max_instances=1` and `coalesce=True`: a run never overlaps the one before, and
runs missed meanwhile become one, never a burst to catch up. A run that cannot start within
one interval of its time (its lane was busy) is dropped for the next, which is at most one
interval away. A job that raises is logged by APScheduler through the root logger's handler,
which masks secrets (`bridge.daemon.observability`), and keeps its schedule.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

UPKEEP_LANE = "upkeep"
HEARTBEAT_LANE = "heartbeats"
SERVICECONTROL_LANE = "servicecontrol"


class _ExpectedSkips(logging.Filter):
    """APScheduler warns when a run is skipped because the job's previous run has not ended,
    and when a run starts too late because its lane was busy. Here that is what
    `max_instances=1` and the grace time are for (a long ledger cleanup holds up the probes),
    so it is said at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(
            ("Execution of job", "Run time of job")
        ):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


_EXPECTED_SKIPS = _ExpectedSkips()
for _logger in (
    "apscheduler.scheduler",
    *(
        f"apscheduler.executors.{lane}"
        for lane in (UPKEEP_LANE, HEARTBEAT_LANE, SERVICECONTROL_LANE)
    ),
):
    logging.getLogger(_logger).addFilter(_EXPECTED_SKIPS)


class Upkeep:
    """A process's scheduled jobs: `add` them, `start`, then `stop` and `join` once."""

    def __init__(self, *, heartbeats: int = 0) -> None:
        """`heartbeats`: how many heartbeat jobs the process runs (one thread each)."""
        # The servicecontrol lane's threads start only with its first job (none without
        # the `servicecontrol` section).
        executors = {UPKEEP_LANE: ThreadPoolExecutor(1), SERVICECONTROL_LANE: ThreadPoolExecutor(2)}
        if heartbeats:
            executors[HEARTBEAT_LANE] = ThreadPoolExecutor(heartbeats)
        # UTC: the scheduler then never asks tzlocal for the machine's zone, and a change of
        # summer time moves nothing.
        self._scheduler = BackgroundScheduler(executors=executors, timezone=UTC)
        self._running: Counter[str] = Counter()  # job names, while a run is in progress
        self._changed = threading.Condition()

    def add(
        self,
        run: Callable[[], object],
        interval: float,
        *,
        name: str,
        at_once: bool = False,
        lane: str = UPKEEP_LANE,
    ) -> None:
        """Run `run` every `interval` s in `lane`: the first time at start (`at_once`) or one
        interval after it. `name` says which job a log line is about."""
        # Left out for a first run one interval after the start: APScheduler takes
        # `next_run_time=None` for a job added paused.
        first_run = {"next_run_time": datetime.now(UTC)} if at_once else {}
        self._scheduler.add_job(
            self._tracked(run, name),
            "interval",
            seconds=interval,
            name=name,
            executor=lane,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=max(1, round(interval)),
            **first_run,
        )

    def start(self) -> None:
        self._scheduler.start()

    def stop(self) -> None:
        """Start no more runs; those in progress go on (see `join`). Returns at once."""
        if self._scheduler.running:
            # Not wait=True: it would join the lanes' threads without a limit.
            self._scheduler.shutdown(wait=False)

    def join(self, deadline: float) -> list[str]:
        """Wait until the runs in progress end, or until `deadline` (a `time.monotonic()`
        value). Returns the names of the jobs still running then: they are left behind, as a
        job inside a call to a database that does not answer must not hold up SIGTERM."""
        with self._changed:
            self._changed.wait_for(
                lambda: not self._running, timeout=max(0.0, deadline - time.monotonic())
            )
            return sorted(self._running)

    def _tracked(self, run: Callable[[], object], name: str) -> Callable[[], object]:
        def tracked() -> object:
            with self._changed:
                self._running[name] += 1
            try:
                return run()
            finally:
                with self._changed:
                    self._running[name] -= 1
                    if not self._running[name]:
                        del self._running[name]
                    self._changed.notify_all()

        return tracked
