"""`daemon.processes: auto` counts the CPUs the daemon may use: its affinity mask and the CPU
quota of its cgroups (systemd's `CPUQuota=`, a container's `--cpus`), which the affinity mask
does not show. Read from file trees laid out as the kernel lays them out, v1 and v2, and for
real: a daemon started in a cgroup with a quota of half a CPU runs one process."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support import SAMPLES_RECEIVER, DaemonProcess, wait_until
from support.pairs import message_ids, pg_send


def _cpu_hierarchy() -> tuple[str, Path] | None:
    """(cgroup or cgroup2, where) of the whole cgroup hierarchy the cpu controller is on."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        dash = fields.index("-")
        kind, options, point = fields[dash + 1], fields[dash + 3].split(","), Path(fields[4])
        if fields[3] == "/" and (
            (kind == "cgroup" and "cpu" in options)
            or (kind == "cgroup2" and "cpu" in (point / "cgroup.controllers").read_text().split())
        ):
            return kind, point
    return None


@contextmanager
def _cgroup_with_quota(quota: float) -> Iterator[Path]:
    """A real cgroup limited to `quota` CPUs; yields the file a pid is written to, to move
    that process into it. Skips where this process may not make one."""
    found = _cpu_hierarchy()
    if found is None:
        pytest.skip("no cgroup file system with the cpu controller mounted here")
    kind, point = found
    directory = point / f"sfbtest_{uuid.uuid4().hex[:8]}"
    period = 100000
    try:
        if kind == "cgroup2":
            (point / "cgroup.subtree_control").write_text("+cpu")
            directory.mkdir()
            (directory / "cpu.max").write_text(f"{int(quota * period)} {period}")
        else:
            directory.mkdir()
            (directory / "cpu.cfs_period_us").write_text(str(period))
            (directory / "cpu.cfs_quota_us").write_text(str(int(quota * period)))
    except OSError as error:
        if directory.exists():
            directory.rmdir()
        pytest.skip(f"cannot make a cgroup with a CPU quota here: {error}")
    procs = directory / "cgroup.procs"
    # Whether a process may be moved there (a cgroup v2 namespace may refuse it).
    moved = subprocess.run(["sh", "-c", 'echo $$ > "$0"', str(procs)], capture_output=True)
    if moved.returncode != 0:
        wait_until(lambda: not procs.read_text().strip(), 10, "the cgroup to be empty")
        directory.rmdir()
        pytest.skip(f"cannot move a process into a cgroup here: {moved.stderr.decode()}")
    try:
        yield procs
    finally:
        wait_until(lambda: not procs.read_text().strip(), 10, "the cgroup to be empty")
        directory.rmdir()


@pytest.mark.integration
def test_a_daemon_with_half_a_cpu_runs_one_process(pg_pair_factory: Any) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: auto runs one process whatever the quota")
    pair = pg_pair_factory(forwarder={"concurrency": 4, "peek_interval": "50ms"})
    with _cgroup_with_quota(0.5) as procs:
        enter = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs)]
        log = pair.config.parent / "daemon.log"
        with DaemonProcess(pair.config, log, prefix=enter) as daemon:
            daemon.wait_for_output("the workers (daemon.processes: auto: ")
            sent = pg_send(pair.sender, pair.forward, 200)
            wait_until(lambda: pair.delivered() == 200, 30, "the deliveries")
            assert daemon.stop() == 0
    output = daemon.output()
    assert "1 process runs the workers (daemon.processes: auto: " in output, output
    assert ", a CPU quota of 0.5)" in output, output
    assert "worker process 2" not in output
    received = message_ids(pair.receiver, SAMPLES_RECEIVER)
    assert set(received) == sent and set(received.values()) == {1}
