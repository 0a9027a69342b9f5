"""The daemon's scheduled jobs on APScheduler (`bridge.daemon.upkeep`): each runs again and
again, a job that raises is logged with its secrets masked and keeps its schedule, jobs of the
upkeep lane run one at a time, and stopping never waits past its deadline."""

from __future__ import annotations

import io
import itertools
import logging
import threading
import time
from collections.abc import Iterator

import pytest
from support import wait_until

from bridge.daemon.observability import SecretMaskingFilter
from bridge.daemon.upkeep import Upkeep


@pytest.fixture
def upkeep() -> Iterator[Upkeep]:
    upkeep = Upkeep(heartbeats=2)
    yield upkeep
    upkeep.stop()
    upkeep.join(time.monotonic() + 5)


@pytest.fixture
def journal() -> Iterator[io.StringIO]:
    """What the daemon's log handler writes (the secret filter included, as `setup_logging`
    sets it up), at WARNING and above."""
    text = io.StringIO()
    handler = logging.StreamHandler(text)
    handler.addFilter(SecretMaskingFilter())
    handler.setLevel(logging.WARNING)
    root = logging.getLogger()
    root.addHandler(handler)
    yield text
    root.removeHandler(handler)


def test_a_job_runs_again_and_again_and_one_that_raises_is_logged_masked_and_keeps_its_schedule(
    upkeep: Upkeep, journal: io.StringIO
) -> None:
    runs: list[float] = []

    def publish() -> None:
        runs.append(time.monotonic())
        if len(runs) == 1:
            raise RuntimeError("cannot connect: Server=db;Uid=bridge;Pwd=hunter2;")

    upkeep.add(publish, 0.2, name="state publishing", at_once=True)
    upkeep.start()
    wait_until(lambda: len(runs) >= 4, timeout=10, what="four runs of the job")
    logged = journal.getvalue()
    assert 'Job "state publishing' in logged and "raised an exception" in logged
    assert "RuntimeError: cannot connect" in logged
    assert "hunter2" not in logged
    # Every interval, not in a burst: three intervals span at least 0.2 s each, less a margin
    # for a wake-up a little early.
    assert all(later - earlier > 0.15 for earlier, later in itertools.pairwise(runs))


def test_a_job_added_at_once_runs_at_start_and_the_others_one_interval_after(
    upkeep: Upkeep,
) -> None:
    runs: list[tuple[str, float]] = []
    upkeep.add(lambda: runs.append(("later", time.monotonic())), 0.5, name="later")
    upkeep.add(lambda: runs.append(("at once", time.monotonic())), 60, name="at once", at_once=True)
    started = time.monotonic()
    upkeep.start()
    wait_until(lambda: len(runs) >= 3, timeout=10, what="the later job to run twice")
    assert [name for name, _ in runs[:3]] == ["at once", "later", "later"]
    assert runs[0][1] - started < 0.4
    assert runs[1][1] - started >= 0.45


def test_jobs_of_the_upkeep_lane_run_one_at_a_time_and_heartbeats_beside_them(
    upkeep: Upkeep,
) -> None:
    running: set[str] = set()
    overlaps: list[set[str]] = []
    lock = threading.Lock()

    def job(name: str) -> None:
        with lock:
            running.add(name)
            overlaps.append(set(running))
        time.sleep(0.1)
        with lock:
            running.discard(name)

    upkeep.add(lambda: job("cleanup"), 0.1, name="cleanup", at_once=True)
    upkeep.add(lambda: job("probes"), 0.1, name="probes", at_once=True)
    upkeep.add(lambda: job("heartbeat a"), 0.1, name="heartbeat a", at_once=True, lane="heartbeats")
    upkeep.start()
    wait_until(
        lambda: {"cleanup", "probes"} <= {n for seen in overlaps for n in seen},
        timeout=10,
        what="both upkeep jobs",
    )
    upkeep.stop()
    upkeep.join(time.monotonic() + 5)
    assert not any({"cleanup", "probes"} <= seen for seen in overlaps)
    assert any({"heartbeat a"} < seen for seen in overlaps), "a heartbeat waited for upkeep"


def test_stopping_names_a_job_still_running_at_the_deadline_instead_of_waiting(
    upkeep: Upkeep,
) -> None:
    started, release = threading.Event(), threading.Event()

    def stuck() -> None:
        started.set()
        release.wait(30)  # a database that does not answer

    upkeep.add(stuck, 60, name="ledger cleanup", at_once=True)
    upkeep.start()
    assert started.wait(10)
    upkeep.stop()
    began = time.monotonic()
    assert upkeep.join(began + 0.3) == ["ledger cleanup"]
    assert time.monotonic() - began < 2
    release.set()
    assert upkeep.join(time.monotonic() + 5) == []


def test_runs_skipped_while_the_lane_is_busy_are_not_warned_about(
    upkeep: Upkeep, journal: io.StringIO
) -> None:
    probes: list[float] = []
    cleanups: list[float] = []

    def cleanup() -> None:
        cleanups.append(time.monotonic())
        time.sleep(0.5)  # a long ledger cleanup holds up the probes

    upkeep.add(cleanup, 0.1, name="ledger cleanup", at_once=True)
    upkeep.add(lambda: probes.append(time.monotonic()), 0.1, name="probes", at_once=True)
    upkeep.start()
    wait_until(lambda: len(cleanups) >= 3 and probes, timeout=10, what="three cleanups")
    assert journal.getvalue() == ""
