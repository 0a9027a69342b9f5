"""`daemon.processes: auto` counts the CPUs the daemon may use: its affinity mask and the CPU
quota of its cgroups (systemd's `CPUQuota=`, a container's `--cpus`), which the affinity mask
does not show. Read from file trees laid out as the kernel lays them out, v1 and v2, and for
real: a daemon started in a cgroup with a quota of half a CPU runs one process."""

from __future__ import annotations

import os
from pathlib import Path

from bridge.daemon.cpus import cpu_quota, usable_cpus

V2_MOUNT = "30 23 0:26 / {point} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
V1_MOUNTS = (
    "32 31 0:29 {root} {point}/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
    "35 31 0:32 / {point}/memory rw - cgroup cgroup rw,memory\n"
)


def _proc(tmp_path: Path, cgroup: str, mountinfo: str) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo)
    return proc


def _write(directory: Path, **files: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name.replace("_", ".", 1)).write_text(text + "\n")


def test_v2_the_tightest_quota_on_the_way_up_counts(tmp_path: Path) -> None:
    fs = tmp_path / "cgroup"
    proc = _proc(tmp_path, "0::/system.slice/sfbridge.service\n", V2_MOUNT.format(point=fs))
    _write(fs / "system.slice", cpu_max="150000 100000")  # systemd's CPUQuota=150%
    _write(fs / "system.slice" / "sfbridge.service", cpu_max="max 100000")
    assert cpu_quota(proc) == 1.5
    _write(fs / "system.slice" / "sfbridge.service", cpu_max="50000 100000")
    assert cpu_quota(proc) == 0.5


def test_v2_without_a_quota_and_without_cgroups_there_is_none(tmp_path: Path) -> None:
    fs = tmp_path / "cgroup"
    proc = _proc(tmp_path, "0::/user.slice\n", V2_MOUNT.format(point=fs))
    _write(fs / "user.slice", cpu_max="max 100000")
    assert cpu_quota(proc) is None
    assert cpu_quota(tmp_path / "no-such-proc") is None


def test_v1_reads_the_hierarchy_the_cpu_controller_is_mounted_on(tmp_path: Path) -> None:
    fs = tmp_path / "cgroup"
    proc = _proc(
        tmp_path,
        "5:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n",
        V1_MOUNTS.format(root="/", point=fs),
    )
    _write(fs / "cpu,cpuacct" / "docker", cpu_cfs_quota_us="-1", cpu_cfs_period_us="100000")
    _write(
        fs / "cpu,cpuacct" / "docker" / "abc",
        cpu_cfs_quota_us="200000",  # docker run --cpus 2
        cpu_cfs_period_us="100000",
    )
    assert cpu_quota(proc) == 2.0


def test_v1_inside_a_container_that_mounts_its_own_cgroup_only(tmp_path: Path) -> None:
    """The container sees its cgroup as the mount's top (mount root /docker/abc)."""
    fs = tmp_path / "cgroup"
    proc = _proc(
        tmp_path, "3:cpu,cpuacct:/docker/abc\n", V1_MOUNTS.format(root="/docker/abc", point=fs)
    )
    _write(fs / "cpu,cpuacct", cpu_cfs_quota_us="100000", cpu_cfs_period_us="100000")
    assert cpu_quota(proc) == 1.0


def test_a_quota_is_rounded_up_and_never_above_the_affinity_mask(tmp_path: Path) -> None:
    fs = tmp_path / "cgroup"
    proc = _proc(tmp_path, "0::/a\n", V2_MOUNT.format(point=fs))
    affinity = len(os.sched_getaffinity(0))
    for quota, usable in [("50000", 1), ("150000", min(2, affinity)), ("6400000", affinity)]:
        _write(fs / "a", cpu_max=f"{quota} 100000")
        cpus = usable_cpus(proc)
        assert (cpus.usable, cpus.affinity) == (usable, affinity), quota
