"""`sfbridge run` in a subprocess, timed from outside, with its CPU time and peak RSS.

The daemon is `python -m bridge -c FILE run`, started on a prefilled queue with NOTIFY_SOCKET
set as systemd would. Its throughput is timed from its READY=1 (sent once its workers are
started, so interpreter start-up and imports are not in it) until the last message is visible
in the destination queue. CPU time (user + sys) comes from /proc/PID/stat over the same span;
peak RSS is VmHWM from /proc/PID/status, read just before SIGTERM. Both cover the daemon's worker
processes (`daemon.processes`) too: CPU time added up, peak RSS the sum of each process's.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bridge.exceptions import ExitCode

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROGRESS_EVERY = 2.0  # seconds between progress lines on stderr


class ConfigRejected(Exception):
    """This sfbridge does not accept the row's configuration (e.g. a key it does not know)."""


@dataclass(frozen=True)
class DaemonRun:
    seconds: float  # READY -> last arrival
    messages: int
    cpu_seconds: float  # daemon user + sys over the same span
    peak_rss_mb: float
    exit_code: int  # after SIGTERM; 0 is a clean stop
    log_tail: str
    # READY -> the first message in the destination, and how many had arrived then (the first
    # batch); None where not looked for.
    first_seconds: float | None = None
    first_count: int = 0


def sfbridge_command(config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "bridge", "-c", str(config), *args]


def write_config(path: Path, config: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    return path


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_tree(pid: int) -> list[int]:
    """`pid` and its running descendants (a daemon and its worker processes)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(_stat(int(entry.name))[1])
            except (OSError, IndexError, ValueError):
                continue  # ended meanwhile
    tree, grown = [pid], True
    while grown:
        more = [child for child, parent in parents.items() if parent in tree and child not in tree]
        tree += more
        grown = bool(more)
    return tree


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a running process and its worker processes, from
    /proc/PID/stat (a worker process that ended is not counted)."""
    total = 0.0
    for member in process_tree(pid):
        try:
            fields = _stat(member)
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
    return total


def peak_rss_mb(pid: int) -> float:
    """VmHWM (the resident set's high-water mark) of a running process, in MB, added up
    over it and its worker processes (more than their peak together, if they peaked apart)."""
    total = 0.0
    for member in process_tree(pid):
        try:
            lines = Path(f"/proc/{member}/status").read_text().splitlines()
        except OSError:
            continue
        total += sum(int(line.split()[1]) / 1024 for line in lines if line.startswith("VmHWM:"))
    return total or float("nan")


def sfbridge_accepts(config: Path, key: str, env: Mapping[str, str]) -> bool:
    """Whether `sfbridge check` on `config` gets past validation without calling `key`
    unknown; connectivity or table problems it reports later do not matter here."""
    result = subprocess.run(
        sfbridge_command(config, "check"),
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )
    output = result.stdout + result.stderr
    return not (result.returncode == ExitCode.USAGE and key in output)


class Daemon:
    """One `sfbridge run` process; use as a context manager so it is always stopped."""

    def __init__(
        self, config: Path, env: Mapping[str, str], log_path: Path, cwd: str | None = None
    ) -> None:
        self.log_path = log_path
        self.notify_path = log_path.with_suffix(".notify")
        self.notify_path.unlink(missing_ok=True)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        environment = {**os.environ, **env, "NOTIFY_SOCKET": str(self.notify_path)}
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                sfbridge_command(config, "run"),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,
                cwd=cwd,  # `python -m` puts the working folder first on the path
            )

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.notify.close()
        self.notify_path.unlink(missing_ok=True)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, chars: int = 2000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def check_alive(self, arrived: int) -> None:
        """Raises ConfigRejected when it stopped on its configuration before moving anything,
        RuntimeError when it stopped otherwise."""
        code = self.process.poll()
        if code is None:
            return
        if code == ExitCode.USAGE and arrived == 0:
            raise ConfigRejected(_first_problem(self.log_tail()))
        raise RuntimeError(f"the daemon exited with {code} at {arrived} rows:\n{self.log_tail()}")

    def wait_ready(self, timeout: float = 60) -> None:
        """Until the daemon says READY=1 on its notify socket (it does when NOTIFY_SOCKET is
        set, as under systemd)."""
        deadline = time.monotonic() + timeout
        self.notify.settimeout(0.2)
        while time.monotonic() < deadline:
            self.check_alive(0)
            try:
                if b"READY=1" in self.notify.recv(4096):
                    return
            except TimeoutError:
                continue
        raise RuntimeError(f"the daemon was not ready within {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> int:
        """SIGTERM, then its exit code (0 is a clean stop)."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=120)


def time_daemon(
    config: Path,
    env: Mapping[str, str],
    log_path: Path,
    messages: int,
    arrived: Callable[[], int],
    progress: Callable[[str], None],
    poll_seconds: float = 0.02,
    cwd: str | None = None,
    first_arrived: Callable[[], int] | None = None,
) -> DaemonRun:
    """Start the daemon on a prefilled queue and time it from READY (its workers start
    claiming) until `arrived()` reaches `messages`; with `first_arrived` (messages in the
    destination now, by a cheap look), also until the first arrival, looked for every 5 ms.

    Raises ConfigRejected when this sfbridge refuses the configuration, RuntimeError when the
    daemon dies or takes longer than a minute plus 20 ms a message.
    """
    with Daemon(config, env, log_path, cwd) as daemon:
        daemon.wait_ready()
        start, cpu_start = time.perf_counter(), cpu_seconds(daemon.pid)
        deadline = time.monotonic() + 60 + messages / 50
        last_progress = time.monotonic()
        first_seconds, first_count = None, 0
        while first_arrived is not None and not (first_count := first_arrived()):
            daemon.check_alive(0)
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing arrived:\n{daemon.log_tail()}")
            time.sleep(0.005)
        if first_arrived is not None:
            first_seconds = time.perf_counter() - start
        while (count := arrived()) < messages:
            daemon.check_alive(count)
            if time.monotonic() > deadline:
                raise RuntimeError(f"the daemon is too slow: {count} rows:\n{daemon.log_tail()}")
            if time.monotonic() - last_progress > PROGRESS_EVERY:
                progress(f"{count}/{messages} arrived")
                last_progress = time.monotonic()
            time.sleep(poll_seconds)
        seconds = time.perf_counter() - start
        cpu, rss = cpu_seconds(daemon.pid) - cpu_start, peak_rss_mb(daemon.pid)
        return DaemonRun(
            seconds,
            messages,
            cpu,
            rss,
            daemon.stop(),
            daemon.log_tail(),
            first_seconds,
            first_count,
        )


def _first_problem(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    interesting = [line for line in lines if "driver" in line or "unknown" in line.lower()]
    return (interesting or lines or ["no output"])[0][:160]
