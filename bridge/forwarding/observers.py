"""What the data path tells observers (metrics): batches finished, deliveries committed, databases
seen up or down.

The data path knows only this protocol, never a metrics library. An observer that raises is
logged (once a minute at most) and otherwise ignored: watching the bridge must never stop or
slow down delivery.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

log = logging.getLogger(__name__)

# How often a failing observer is logged, at most.
_FAILURE_LOG_INTERVAL = 60.0


class ForwardingObserver(Protocol):
    def batch_started(self, forwarder: str) -> None:
        """A worker of `forwarder` starts a batch (claims, delivers, settles, commits)."""

    def batch_finished(
        self,
        forwarder: str,
        source: str,
        claimed: int,
        counts: Mapping[str, int] | None,
        seconds: float,
    ) -> None:
        """The batch is over after `seconds`, having claimed `claimed` messages: `counts` by
        outcome (settle's counter names) when its source transaction committed, None when it
        did not (the claimed rows are back in place)."""

    def delivered(self, database: str, count: int, seconds_since_claim: float) -> None:
        """`count` messages are committed in `database`'s queues, `seconds_since_claim` after
        they were claimed (a remote database: its own commit; the forwarding database: the
        source commit)."""

    def database_seen(self, database: str, up: bool) -> None:
        """A worker found its forwarding database reachable (`up`) or not."""

    def held(self, database: str, messages: int, seconds: float) -> None:
        """A batch of `messages` for `database` waited `seconds` for its catch-up limits
        (`bridge.forwarding.catch_up`) before it was written."""


class NoObserver:
    """Observes nothing."""

    def batch_started(self, forwarder: str) -> None:
        pass

    def batch_finished(
        self,
        forwarder: str,
        source: str,
        claimed: int,
        counts: Mapping[str, int] | None,
        seconds: float,
    ) -> None:
        pass

    def delivered(self, database: str, count: int, seconds_since_claim: float) -> None:
        pass

    def database_seen(self, database: str, up: bool) -> None:
        pass

    def held(self, database: str, messages: int, seconds: float) -> None:
        pass


def safe_observer(observer: ForwardingObserver | None) -> ForwardingObserver:
    """`observer` behind a SafeObserver (once: a SafeObserver is given back as it is), or
    NoObserver for None."""
    if observer is None:
        return NoObserver()
    return observer if isinstance(observer, SafeObserver) else SafeObserver(observer)


class SafeObserver:
    """Passes every call on to `inner`, swallowing (and logging) what it raises."""

    def __init__(self, inner: ForwardingObserver) -> None:
        self._inner = inner
        self._next_log = 0.0

    def batch_started(self, forwarder: str) -> None:
        self._call(lambda: self._inner.batch_started(forwarder))

    def batch_finished(
        self,
        forwarder: str,
        source: str,
        claimed: int,
        counts: Mapping[str, int] | None,
        seconds: float,
    ) -> None:
        self._call(lambda: self._inner.batch_finished(forwarder, source, claimed, counts, seconds))

    def delivered(self, database: str, count: int, seconds_since_claim: float) -> None:
        self._call(lambda: self._inner.delivered(database, count, seconds_since_claim))

    def database_seen(self, database: str, up: bool) -> None:
        self._call(lambda: self._inner.database_seen(database, up))

    def held(self, database: str, messages: int, seconds: float) -> None:
        self._call(lambda: self._inner.held(database, messages, seconds))

    def _call(self, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception:
            now = time.monotonic()
            if now >= self._next_log:
                self._next_log = now + _FAILURE_LOG_INTERVAL
                log.exception("an observer (metrics) failed; delivery goes on")
