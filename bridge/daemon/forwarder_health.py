"""Whether each forwarder's batches succeed: a state the daemon shows, not a line per failure.

A forwarder whose batches keep failing (its queue cannot be read: the forwarding database is
down or silent, a table is locked or missing; or a batch fails the same way every time) forwards
nothing, and a log line twice a second says so without saying it louder. So its workers report
every batch here; the forwarder is *failing* from the first failed batch until one succeeds.
That state is logged when it starts, when it fails with an error not yet said in this run of
failures, every `REMINDER_SECONDS` while it lasts and when it ends (a silent database alternates
between "no answer" on open connections and "cannot connect" on new ones: said once each, not
at every flip); the daemon puts it in the systemd status line, the metric
`sfbridge_forwarder_failing` and the forwarder states table (`bridge.storage.destination_states`)
that `sfbridge status` reads.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from bridge.messages import about, utcnow

log = logging.getLogger(__name__)

# While a forwarder keeps failing with the same error, say so again this often.
REMINDER_SECONDS = 60.0
# Errors remembered per run of failures; past this many distinct texts only reminders speak.
SAID_ERRORS = 16


@dataclass(frozen=True)
class ForwarderState:
    """One forwarder's batches as this daemon sees them. `since` is naive UTC: the first
    failure of the current run of failures, or when they last succeeded again."""

    forwarder: str
    failing: bool
    since: datetime
    failures: int = 0
    last_error: str | None = None


class ForwarderHealth:
    """Shared by a daemon's workers; thread-safe."""

    def __init__(self) -> None:
        self._states: dict[str, ForwarderState] = {}
        self._started: dict[str, float] = {}  # monotonic, of a run of failures
        self._next_reminder: dict[str, float] = {}
        self._said: dict[str, set[str]] = {}  # errors already logged in the current run
        self._lock = threading.Lock()
        self.version = 0  # grows with every change of state, for whoever publishes them

    def succeeded(self, forwarder: str, *, quiet: bool = False) -> None:
        """A batch (or an empty poll) of `forwarder` went through. `quiet`: not logged (a
        worker process, whose daemon logs what it passes on: `bridge.daemon.processes`)."""
        with self._lock:
            before = self._states.get(forwarder)
            if before is not None and not before.failing:
                return
            if before is not None and not quiet:
                log.warning(
                    "forwarder '%s' is forwarding again after %d failed batch(es) over %s",
                    forwarder,
                    before.failures,
                    _duration(time.monotonic() - self._started.get(forwarder, time.monotonic())),
                    extra=about(forwarder=forwarder),
                )
            self._states[forwarder] = ForwarderState(forwarder, False, utcnow())
            self.version += 1

    def failed(self, forwarder: str, error: str, *, quiet: bool = False) -> bool:
        """A batch of `forwarder` failed with `error` (for people: what and what to do).
        Returns whether that was logged now (the first failure, a new error, a reminder);
        `quiet`: never logged, but the answer is the same (a worker process, which logs the
        traceback of an unexpected error when the daemon logs the failure)."""
        with self._lock:
            now = time.monotonic()
            before = self._states.get(forwarder)
            if before is None or not before.failing:
                self._started[forwarder] = now
                if not quiet:
                    log.error(
                        "forwarder '%s' cannot forward: %s; retrying (its messages stay queued)",
                        forwarder,
                        error,
                        extra=about(forwarder=forwarder),
                    )
                self._next_reminder[forwarder] = now + REMINDER_SECONDS
                self._said[forwarder] = {error}
                self._states[forwarder] = ForwarderState(forwarder, True, utcnow(), 1, error)
                self.version += 1
                return True
            said = self._said[forwarder]
            new = error not in said and len(said) < SAID_ERRORS
            logged = new or now >= self._next_reminder[forwarder]
            if logged and not quiet:
                log.error(
                    "forwarder '%s' still cannot forward after %d failed batch(es) over %s: %s",
                    forwarder,
                    before.failures + 1,
                    _duration(now - self._started[forwarder]),
                    error,
                    extra=about(forwarder=forwarder),
                )
            if logged:
                self._next_reminder[forwarder] = now + REMINDER_SECONDS
                said.add(error)
            if error != before.last_error:
                self.version += 1
            self._states[forwarder] = ForwarderState(
                forwarder, True, before.since, before.failures + 1, error
            )
            return logged

    def states(self) -> list[ForwarderState]:
        with self._lock:
            return [self._states[name] for name in sorted(self._states)]

    def failing(self) -> list[ForwarderState]:
        return [state for state in self.states() if state.failing]


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
