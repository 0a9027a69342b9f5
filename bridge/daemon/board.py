"""Which of one database's forwarders have work, and which pool worker forwards what next.

The watcher (`bridge.daemon.watcher`) marks a forwarder's queue or retry storage as having
work; the database's pool workers (`bridge.daemon.workers`) take marked sources round-robin,
one batch at a time, so a queue with a large backlog gets its turn like every other and
cannot starve them: a forwarder never has more batches running than its `concurrency`, and
after each batch the next worker looks at the next source in the ring.

Work is level-triggered: a mark set while a batch of that source runs stays set, so the
source is taken again after the batch; a full claim marks the source as a backlog at once
(another worker may join while the batch runs), and it stays one until a batch comes back
short. A source whose batch failed, or whose forwarder is paused, is held
back for a while and then taken again whether marked or not, as a worker used to try again.

A daemon with worker processes (`bridge.daemon.processes`) has a board per process. A mark goes
to the daemon's own board first, and on to the others only where no worker of its own can start
on it now (`mark` returns those), so a message that trickles in is claimed once, not once per
process; a source that turns into a backlog here (`on_backlog`) is marked on the others too,
so that a burst still gets every process's workers.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from bridge.messages import Source

Key = tuple[str, Source]  # (forwarder, "queue" | "retry")


@dataclass
class Entry:
    """One source of one forwarder, as the board sees it."""

    forwarder: str
    source: Source
    marked: bool = False  # work seen (or a notification) since the last batch was taken
    backlog: bool = False  # the last batch was full
    failing: bool = False  # the last batch failed: take it again after `held_until`
    failures: int = 0  # batches failed in a row
    held_until: float = 0.0  # monotonic time before which it is not taken
    index: int = 0  # its place in the board's ring

    @property
    def key(self) -> Key:
        return (self.forwarder, self.source)

    @property
    def wants(self) -> bool:
        """Whether it wants a batch, now or once its hold ends."""
        return self.marked or self.backlog or self.failing


class WorkBoard:
    """Marks and turns for one database's forwarders. Thread-safe.

    A mark and a turn cost what wants a batch, not what is configured: the sources that want
    one are kept apart (`_wanting`), and only they are looked at. With 500 forwarders (1,000
    sources) a scan of every source took about 0.15 ms per mark, in the listener's thread,
    on the way of every pushed message."""

    def __init__(self, caps: Mapping[str, int]) -> None:
        """`caps`: each forwarder's most batches at once (its `concurrency`)."""
        self._caps = dict(caps)
        self._entries = [
            Entry(name, source) for name in self._caps for source in ("queue", "retry")
        ]
        for index, entry in enumerate(self._entries):
            entry.index = index
        self._by_key = {entry.key: entry for entry in self._entries}
        self._wanting: dict[int, Entry] = {}  # by index: the entries whose `wants` holds
        self._running: Counter[str] = Counter()
        self._cursor = 0
        self._changed = threading.Condition()
        self._closed = False
        self._idle = 0  # workers waiting in `take`
        # Told of each source that turns into a backlog (a full claim), outside the lock.
        self.on_backlog: Callable[[Key], None] | None = None

    def mark(self, keys: Iterable[Key]) -> list[Key]:
        """The watcher saw work in these sources. Returns those no worker here can start on
        now: not on this board, held back, at their forwarder's cap, or beyond the idle
        workers that other marked sources have not already spoken for."""
        now = time.monotonic()
        not_now: list[Key] = []
        with self._changed:
            # Idle workers not already on their way to a source that wants a batch.
            free = self._idle - sum(
                1 for entry in self._wanting.values() if self._wanted(entry, now)
            )
            woke = False
            for key in keys:
                entry = self._by_key.get(key)
                if entry is None:
                    not_now.append(key)
                    continue
                if self._wanted(entry, now):
                    if free < 0:  # counted in `free` already: may be one without a worker
                        not_now.append(key)
                    continue
                entry.marked = woke = True
                self._wanting[entry.index] = entry
                if free > 0 and self._startable(entry, now):
                    free -= 1
                else:
                    not_now.append(key)
            if woke:
                self._changed.notify_all()
        return not_now

    def take(self, timeout: float) -> Entry | None:
        """The next source to forward a batch of, round-robin; None after `timeout` seconds
        without one, or once closed. The caller must `finish` what it took."""
        deadline = time.monotonic() + timeout
        with self._changed:
            self._idle += 1
            try:
                while not self._closed:
                    now = time.monotonic()
                    entry, wake_at = self._next(now)
                    if entry is not None:
                        entry.marked = False
                        self._update(entry)
                        self._running[entry.forwarder] += 1
                        return entry
                    if now >= deadline:
                        return None
                    self._changed.wait(min(deadline, wake_at) - now)
            finally:
                self._idle -= 1
        return None

    def finish(
        self,
        entry: Entry,
        *,
        full: bool = False,
        hold: float = 0.0,
        failing: bool = False,
        again: bool = False,
    ) -> None:
        """A batch of `entry` ended: `full` (more is there), or `failing` (take it again after
        `hold`); `hold` alone keeps it back that long (a paused forwarder, retries looked at
        once per slow poll); `again` marks it, to be looked at after the hold whatever the
        watcher sees."""
        with self._changed:
            self._running[entry.forwarder] -= 1
            turned = full and not entry.backlog
            entry.backlog = full
            entry.failing = failing
            entry.failures = entry.failures + 1 if failing else 0
            entry.marked = entry.marked or again
            entry.held_until = time.monotonic() + hold if hold > 0 else 0.0
            self._update(entry)
            self._changed.notify_all()
        if turned:
            self._told_backlog(entry)

    def more_waiting(self, entry: Entry) -> None:
        """A batch of `entry` that is still running claimed a full batch: the source may be
        taken by another worker now (up to its forwarder's cap), not only once this batch
        ends. A burst into an idle queue thus gets a second worker after one claim, not
        after one whole batch."""
        with self._changed:
            if entry.backlog:
                return
            entry.backlog = True
            self._update(entry)
            self._changed.notify_all()
        self._told_backlog(entry)

    def _told_backlog(self, entry: Entry) -> None:
        if self.on_backlog is not None:
            self.on_backlog(entry.key)

    def failing(self) -> set[Key]:
        """Sources whose last batch failed."""
        with self._changed:
            return {entry.key for entry in self._wanting.values() if entry.failing}

    def busy(self) -> bool:
        """Whether any source has a batch running or is waiting for one."""
        with self._changed:
            return any(self._running.values()) or any(
                entry.marked or entry.backlog for entry in self._wanting.values()
            )

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _update(self, entry: Entry) -> None:
        """Keep `_wanting` as `entry.wants` says, after a change of its flags."""
        if entry.wants:
            self._wanting[entry.index] = entry
        else:
            self._wanting.pop(entry.index, None)

    def _wanted(self, entry: Entry, now: float) -> bool:
        """Whether `entry` wants a batch and a worker may start one now."""
        return entry.wants and self._startable(entry, now)

    def _startable(self, entry: Entry, now: float) -> bool:
        return (
            entry.held_until <= now and self._running[entry.forwarder] < self._caps[entry.forwarder]
        )

    def _next(self, now: float) -> tuple[Entry | None, float]:
        """The first source from the cursor on that wants a batch and may have one now, and
        when the earliest held-back one may (inf: none)."""
        wake_at = float("inf")
        count = len(self._entries)
        cursor = self._cursor
        # The ring's order from the cursor on, over the wanting entries only.
        for index in sorted(self._wanting, key=lambda index: (index - cursor) % count):
            entry = self._entries[index]
            if self._running[entry.forwarder] >= self._caps[entry.forwarder]:
                continue
            if entry.held_until > now:
                wake_at = min(wake_at, entry.held_until)
                continue
            self._cursor = index + 1
            return entry, wake_at
        return None, wake_at
