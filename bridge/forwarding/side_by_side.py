"""Running a batch's deliveries to different databases at the same time.

A batch with messages for several databases used to write them one database after the other,
so each destination waited for every one before it: ten destinations cost ten round trips of
server work in a row. `SideBySide` runs such calls on threads of its own and waits for all of
them, so the batch costs about as long as its slowest destination. The caller decides what may
run beside what (`bridge.forwarding.deliver`: a delivery that touches nothing but its own
database and its own connection); the source transaction is committed only after every call
has returned, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")


class SideBySide:
    """Runs calls at the same time: the first on the calling thread, the others on a pool of
    at most `threads` threads, started when first needed and kept for the next batches (idle
    threads cost no CPU; they end with this object or at interpreter exit)."""

    def __init__(self, threads: int, name: str) -> None:
        self._threads = max(1, threads)
        self._name = name
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def run(self, calls: Sequence[Callable[[], T]]) -> list[T]:
        """Every call's result, in order, once all have returned. When some raised, the first
        one's exception (in order) is raised, after the others have finished: nothing of this
        batch still runs when the caller rolls back."""
        if len(calls) < 2:
            return [call() for call in calls]
        executor = self._pool()
        futures: list[Future[T]] = [executor.submit(call) for call in calls[1:]]
        try:
            head = [calls[0]()]
        finally:
            wait(futures)
        return head + [future.result() for future in futures]

    def close(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix=self._name)
            return self._executor
