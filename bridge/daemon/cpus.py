"""How many CPUs the daemon may use, for `daemon.processes: auto` (`bridge.daemon.budget`).

Two things limit it: the affinity mask (`taskset`, systemd's `CPUAffinity=`, a container's
`--cpuset-cpus`) and the CPU quota of its cgroup and of every cgroup above it (systemd's
`CPUQuota=`, a container's `--cpus`, a Kubernetes CPU limit). A quota does not show in the
affinity mask: a container limited to one CPU on a 16-CPU host still sees 16.

cgroup v2 keeps the quota in `cpu.max` ("max 100000", or "50000 100000": 50 ms of CPU time per
100 ms); v1 in `cpu.cfs_quota_us` (-1: none) and `cpu.cfs_period_us` of the hierarchy the `cpu`
controller is mounted on. Where each hierarchy is mounted, and at which of its cgroups, is in
/proc/self/mountinfo; which cgroup the process is in, in /proc/self/cgroup (see cgroups(7)).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc/self")


@dataclass(frozen=True)
class Cpus:
    usable: int  # what the daemon may use at once: the affinity mask, the quota rounded up
    affinity: int  # CPUs it may be scheduled on
    quota: float | None  # the tightest CPU quota above it, in CPUs; None: none


def usable_cpus(proc: Path = PROC) -> Cpus:
    """The CPUs this process may use: its affinity mask, and its cgroups' CPU quota rounded up
    (a quota of 1.5 CPUs runs two processes at once, throttled)."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        affinity = os.cpu_count() or 1
    quota = cpu_quota(proc)
    usable = affinity if quota is None else max(1, min(affinity, math.ceil(quota)))
    return Cpus(usable, affinity, quota)


def cpu_quota(proc: Path = PROC) -> float | None:
    """The tightest CPU quota on this process's cgroup and those above it, in CPUs; None when
    there is none or it cannot be read (not Linux, no cgroup file system)."""
    try:
        memberships = (proc / "cgroup").read_text().splitlines()
        mounts = _cgroup_mounts((proc / "mountinfo").read_text())
    except OSError:
        return None
    quotas: list[float] = []
    for line in memberships:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        v2 = hierarchy == "0" and controllers == ""
        if not v2 and "cpu" not in controllers.split(","):
            continue
        for mount in mounts:
            if mount.v2 != v2 or (not v2 and "cpu" not in mount.options):
                continue
            directory = _inside(mount, path)
            if directory is not None:
                quotas += _quotas(directory, mount.point, v2)
    return min(quotas, default=None)


@dataclass(frozen=True)
class _Mount:
    root: str  # the cgroup of the hierarchy mounted there
    point: Path
    options: frozenset[str]  # the super options: a v1 hierarchy's controllers among them
    v2: bool


def _cgroup_mounts(mountinfo: str) -> list[_Mount]:
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if len(fields) < dash + 4 or dash < 5:
            continue
        kind, options = fields[dash + 1], fields[dash + 3]
        if kind not in ("cgroup", "cgroup2"):
            continue
        found.append(
            _Mount(
                _unescape(fields[3]),
                Path(_unescape(fields[4])),
                frozenset(options.split(",")),
                kind == "cgroup2",
            )
        )
    return found


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline and backslash in a path as octal escapes."""
    for escape, character in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escape, character)
    return field


def _inside(mount: _Mount, path: str) -> Path | None:
    """Where the cgroup `path` of the hierarchy is, when the part of it mounted holds it."""
    root = mount.root.rstrip("/")
    if path != root and not path.startswith(root + "/"):
        return None
    return mount.point / path[len(root) :].lstrip("/")


def _quotas(directory: Path, top: Path, v2: bool) -> list[float]:
    """The CPU quotas of `directory` and of the cgroups above it, up to `top`."""
    quotas = []
    while True:
        quota = _v2_quota(directory) if v2 else _v1_quota(directory)
        if quota is not None:
            quotas.append(quota)
        if directory == top or top not in directory.parents:
            return quotas
        directory = directory.parent


def _v2_quota(directory: Path) -> float | None:
    try:
        limit, period = (directory / "cpu.max").read_text().split()[:2]
        return None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _v1_quota(directory: Path) -> float | None:
    try:
        limit = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
        return None if limit < 0 else limit / period
    except (OSError, ValueError, ZeroDivisionError):
        return None
