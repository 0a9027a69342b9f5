"""Running a batch's deliveries to different databases at the same time.

A batch with messages for several databases used to write them one database after the other,
so each destination waited for every one before it: ten destinations cost ten round trips of
server work in a row. `SideBySide` runs such calls on threads of its own and waits for all of
them, so the batch costs about as long as its slowest destination. The caller decides what may
run beside what (`bridge.forwarding.deliver`: a delivery that touches nothing but its own
database and its own connection); the source transaction is committed only after every call
has returned, as before.

The threads are daemon threads, like the daemon's workers: a call stuck on a database that
does not answer must not keep the process from exiting (`concurrent.futures`' pool joins its
threads at exit). Its batch is then rolled back by the server, as a worker's is.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from typing import Any, TypeVar

T = TypeVar("T")

# A call and the future for its result, or None: the thread that takes it ends.
_Task = tuple[Callable[[], Any], "Future[Any]"] | None


class SideBySide:
    """Runs calls at the same time: the first on the calling thread, the others on at most
    `threads` threads of its own, started when first needed and kept for the next batches
    (idle, they wait on a queue at no cost; they end with `close` or when this object is
    collected)."""

    def __init__(self, threads: int, name: str) -> None:
        self._most = max(1, threads)
        self._name = name
        self._tasks: queue.SimpleQueue[_Task] = queue.SimpleQueue()
        self._started = [0]  # shared with the finalizer, which must not hold `self`
        self._lock = threading.Lock()
        weakref.finalize(self, _end_threads, self._tasks, self._started)

    def run(self, calls: Sequence[Callable[[], T]]) -> list[T]:
        """Every call's result, in order, once all have returned. When some raised, the first
        one's exception (in order) is raised, after the others have finished: nothing of this
        batch still runs when the caller rolls back."""
        if len(calls) < 2:
            return [call() for call in calls]
        futures: list[Future[T]] = [Future() for _ in calls[1:]]
        self._start_threads(len(futures))
        for call, future in zip(calls[1:], futures, strict=True):
            self._tasks.put((call, future))
        try:
            head = [calls[0]()]
        finally:
            wait(futures)
        return head + [future.result() for future in futures]

    def close(self) -> None:
        """End the threads once they are idle."""
        with self._lock:
            _end_threads(self._tasks, self._started)

    def _start_threads(self, wanted: int) -> None:
        with self._lock:
            while self._started[0] < min(wanted, self._most):
                name = f"{self._name}-{self._started[0] + 1}"
                threading.Thread(target=_serve, args=(self._tasks,), name=name, daemon=True).start()
                self._started[0] += 1


def _serve(tasks: queue.SimpleQueue[_Task]) -> None:
    while (task := tasks.get()) is not None:
        call, future = task
        if not future.set_running_or_notify_cancel():
            continue
        try:
            future.set_result(call())
        except BaseException as error:  # handed to the caller, which raises it
            future.set_exception(error)


def _end_threads(tasks: queue.SimpleQueue[_Task], started: list[int]) -> None:
    for _ in range(started[0]):
        tasks.put(None)
    started[0] = 0
