"""Which destination databases are known to be down right now.

When a destination cannot be reached, every worker and every batch would otherwise open a
connection to it and wait for the failure, up to `connect_timeout` each time. That wastes
time, load on the network, and (for a SQLite forwarding database) time spent holding its write
lock. One failed connection is proof enough for a short while: until then, messages for that
database fail at once with the same error and go to retry storage.
"""

from __future__ import annotations

import threading
import time


class OutageMemory:
    """Shared by all workers of a daemon; thread-safe."""

    def __init__(self, hold_seconds: float) -> None:
        self._hold = hold_seconds
        self._down: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()

    @property
    def hold_seconds(self) -> float:
        return self._hold

    def known_down(self, database: str) -> str | None:
        """The error that showed `database` down, if that was less than `hold_seconds` ago."""
        with self._lock:
            entry = self._down.get(database)
            if entry is None:
                return None
            until, error = entry
            if time.monotonic() >= until:
                return None
            return error

    def record_down(self, database: str, error: str) -> None:
        with self._lock:
            self._down[database] = (time.monotonic() + self._hold, error)

    def record_up(self, database: str) -> None:
        with self._lock:
            self._down.pop(database, None)
