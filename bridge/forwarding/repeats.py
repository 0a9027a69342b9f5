"""Failures that repeat, told once a window: the first batch's line in full, then one line with
how many more there were.

2,000 unroutable messages are two batches or twenty, each a line of its own with a count and a
few `NServiceBus.MessageId`s (`bridge.forwarding.settle`); a sender that keeps sending them
would still fill the journal a line per batch. So a line is keyed by what it says (forwarder,
level, reason) and, once said, held for `logging.repeats`: what comes for the same key
meanwhile is only summed, and told in one line when the window ends ("... and 1,998 more ...
in the last minute"). A window ends when anything is told or flushed after it (each worker
flushes before each turn, the daemon on each worker process's beat), so the sum is never lost,
only late by up to a turn. A daemon keeps one for all its processes: a worker process relays
what it would tell to the daemon's (`bridge.daemon.processes`), as `Notices` does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bridge.config.durations import format_duration
from bridge.messages import MESSAGE_IDS

# How many ids a line names; the rest are counted.
SAMPLES = 3
# Keys held at most: reasons are few, but a sender can make them many (every unknown queue
# name is a reason of its own); past this, every window is told and forgotten at once.
MAX_KEYS = 1_000


# (logger name, level, key, prefix, subject, count, samples, window, about): `tell`'s
# arguments.
Relay = Callable[..., None]


@dataclass
class _Window:
    opened: float
    length: float
    logger: str
    level: int
    prefix: str
    subject: str
    about: Mapping[str, Any] = field(default_factory=dict)
    held: int = 0
    samples: list[str] = field(default_factory=list)


class RepeatedLines:
    """Logs "{prefix}{count} message(s) {subject} (MessageIds: ...)" once per key and window,
    and the sum of what came for that key meanwhile when the window ends; or passes each tell
    on with `relay`. Thread-safe; `clock` is injectable for tests."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, relay: Relay | None = None
    ) -> None:
        self._clock = clock
        self._relay = relay
        self._windows: dict[tuple[str, ...], _Window] = {}
        self._lock = threading.Lock()

    def tell(
        self,
        logger: str,
        level: int,
        key: Sequence[str],
        prefix: str,
        subject: str,
        count: int,
        samples: Sequence[str],
        window: float,
        about: Mapping[str, Any] | None = None,
    ) -> None:
        """Log `count` messages' `subject` (after `prefix`, which names whose they are), or
        hold them if `key` was told within `window` seconds. `samples`: ids of some of them
        (already inert); the first few are named. `about`: the line's fields
        (`bridge.messages.about`), to which the named ids are added."""
        about = dict(about or {})
        if self._relay is not None:
            self._relay(logger, level, tuple(key), prefix, subject, count,
                        list(samples[:SAMPLES]), window, about)  # fmt: skip
            return
        key = tuple(key)
        now = self._clock()
        with self._lock:
            ended = self._take_ended(now, force=len(self._windows) >= MAX_KEYS)
            current = self._windows.get(key)
            if current is not None:
                current.held += count
                current.samples = list(samples[:SAMPLES])
            else:
                self._windows[key] = _Window(now, window, logger, level, prefix, subject, about)
        _tell_ended(ended)
        if current is None:
            logging.getLogger(logger).log(
                level,
                "%s%s message(s) %s (%s)",
                prefix,
                f"{count:,}",
                subject,
                _named(samples, count),
                extra={**about, MESSAGE_IDS: list(samples[:SAMPLES])},
            )

    def flush(self) -> None:
        """Tell the sums of the windows that have ended."""
        with self._lock:
            ended = self._take_ended(self._clock(), force=False)
        _tell_ended(ended)

    def _take_ended(self, now: float, *, force: bool) -> list[_Window]:
        ended = [
            key for key, held in self._windows.items() if force or now - held.opened >= held.length
        ]
        return [self._windows.pop(key) for key in ended]


def _tell_ended(windows: list[_Window]) -> None:
    for window in windows:
        if window.held:
            length = "minute" if window.length == 60 else format_duration(window.length)
            logging.getLogger(window.logger).log(
                window.level,
                "%s... and %s more in the last %s %s (%s)",
                window.prefix,
                f"{window.held:,}",
                length,
                window.subject,
                _named(window.samples, window.held),
                extra={**window.about, MESSAGE_IDS: list(window.samples[:SAMPLES])},
            )


def _named(samples: Sequence[str], count: int) -> str:
    named = ", ".join(samples[:SAMPLES])
    more = ", ..." if count > min(len(samples), SAMPLES) else ""
    return f"MessageIds: {named}{more}"
