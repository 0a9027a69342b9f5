"""Changes of state the data path tells people of once per daemon, not once per process: a
queue table that stops taking COPY, and takes it again.

Each process of a daemon learns such a state by itself (every worker process tries the table),
but it is one fact about the table; a daemon with worker processes says it in its own process,
once (`bridge.daemon.processes`). So does a failure that repeats (`repeats`, the daemon's one
`RepeatedLines`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from bridge.forwarding.repeats import Relay as RepeatRelay
from bridge.forwarding.repeats import RepeatedLines

# (logger name, what changed state, its new state, log level, the line to log)
Relay = Callable[[str, tuple[str, ...], str, int, str], None]


class Notices:
    """Logs a thing's change of state the first time it is seen in that state since it was last
    seen in another (from any process that passes it on here), or passes it on with `relay`.
    Thread-safe."""

    def __init__(self, relay: Relay | None = None, repeats: RepeatRelay | None = None) -> None:
        """`relay`, `repeats`: where a worker process passes its notices and its repeated
        failures on to the daemon's process."""
        self._relay = relay
        self.repeats = RepeatedLines(relay=repeats)
        self._said: dict[tuple[str, ...], str] = {}
        self._lock = threading.Lock()

    def say(self, logger: str, key: tuple[str, ...], state: str, level: int, line: str) -> None:
        if self._relay is not None:
            self._relay(logger, key, state, level, line)
            return
        with self._lock:
            if self._said.get(key) == state:
                return
            if len(self._said) > 10_000:
                self._said.clear()  # bounded: tables are few, but never grow forever
            self._said[key] = state
        logging.getLogger(logger).log(level, "%s", line)
