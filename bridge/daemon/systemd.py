"""systemd notification protocol (sd_notify), in a few lines of stdlib.

A silent no-op when the daemon is not started by systemd (no NOTIFY_SOCKET).
"""

from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    """Send `state` (e.g. "READY=1", "WATCHDOG=1", "STATUS=...") to systemd. True if sent."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        # Abstract namespace socket: the leading '@' stands for a NUL byte.
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
        return True
    except OSError:
        return False


def watchdog_interval() -> float | None:
    """Seconds between watchdog pings systemd expects (half of WatchdogSec), or None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(0.5, int(usec) / 1_000_000 / 2)
    except ValueError:
        return None
