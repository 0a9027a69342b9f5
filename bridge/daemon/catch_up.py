"""The daemon's catch-up limits (`bridge.forwarding.catch_up`), held across its worker processes.

Shared state: files in a folder the daemon makes for each start of its workers
(`catch_up_folder`), locked with `flock`, which the kernel releases when a process dies. A
killed worker process therefore never keeps a place in flight or the rate's lock (a
`multiprocessing` lock or semaphore would stay taken with it, and the destination would wait
for ever). Chosen over a per-process share of each limit, which would deliver below the limit
whenever the work is not spread evenly over the processes (a forwarder of `concurrency: 1`
lives in one of them).

- **Rate** (`max_messages_per_second`): a virtual schedule (the generic cell rate algorithm).
  `<database>.rate` holds the time (`time.monotonic`, one clock for every process of a host)
  at which the database's schedule is free again; a batch of n messages takes the slot from
  then (or now, when it is past) and moves it n / rate further, then waits for its start. No
  burst beyond one batch, so the rate holds over any stretch longer than a few batches.
- **In flight** (`max_batches_in_flight`): `<database>.<i>` for i below the cap; a batch holds
  an exclusive lock on one of them for its delivery, trying them in turn every
  `IN_FLIGHT_POLL` seconds while all are taken.

The same file also keeps what was held back (seconds, messages), for nobody but a reader that
wants it; the batch reports its own share (`Held`) to the counters and metrics.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path

from bridge.config.model import BridgeConfig
from bridge.forwarding.catch_up import Held, limited_databases

# How often a batch waiting for a place in flight tries again (seconds).
IN_FLIGHT_POLL = 0.005
# `<database>.rate`: the time the schedule is free from, seconds and messages held back.
_RATE = struct.Struct("=ddd")


class SharedCatchUp:
    """Catch-up limits shared through the files of `folder` by every process given it.

    `stop`: once set, nothing waits any more (a stopping daemon finishes its batches)."""

    def __init__(self, config: BridgeConfig, folder: str, stop: threading.Event) -> None:
        self._folder = Path(folder)
        self._stop = stop
        self._rates = {
            name: float(database.max_messages_per_second)
            for name, database in config.databases.items()
            if database.max_messages_per_second is not None
        }
        self._caps = {
            name: database.max_batches_in_flight
            for name, database in config.databases.items()
            if database.max_batches_in_flight is not None
        }
        self._local = threading.local()  # each thread its own open files: flock is per file

    @contextmanager
    def hold(self, messages: Mapping[str, int]) -> Iterator[Held]:
        held_messages: dict[str, int] = {}
        held_seconds: dict[str, float] = {}
        with ExitStack() as places:
            for database in sorted(messages):  # one order for all: no batch waits in a circle
                started = time.monotonic()
                if database in self._rates:
                    self._take_rate(database, messages[database])
                if database in self._caps:
                    places.enter_context(self._place(database, self._caps[database]))
                waited = time.monotonic() - started
                if waited >= IN_FLIGHT_POLL:
                    held_messages[database] = messages[database]
                    held_seconds[database] = waited
            yield Held(held_messages, held_seconds)

    def _take_rate(self, database: str, messages: int) -> None:
        descriptor = self._file(f"{database}.rate")
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        try:
            data = os.pread(descriptor, _RATE.size, 0)
            free_from, seconds, count = _RATE.unpack(data) if len(data) == _RATE.size else (0, 0, 0)
            now = time.monotonic()
            start = max(now, free_from)
            if start > now:
                seconds, count = seconds + start - now, count + messages
            free_from = start + messages / self._rates[database]
            os.pwrite(descriptor, _RATE.pack(free_from, seconds, count), 0)
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
        self._stop.wait(max(0.0, start - now))

    @contextmanager
    def _place(self, database: str, cap: int) -> Iterator[None]:
        first = threading.get_ident() % cap  # threads start at different places
        while True:
            for offset in range(cap):
                descriptor = self._file(f"{database}.{(first + offset) % cap}")
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                try:
                    yield
                finally:
                    fcntl.flock(descriptor, fcntl.LOCK_UN)
                return
            if self._stop.wait(IN_FLIGHT_POLL):
                yield  # stopping: the batch finishes without a place
                return

    def _file(self, name: str) -> int:
        files: dict[str, int] | None = getattr(self._local, "files", None)
        if files is None:
            files = self._local.files = {}
        descriptor = files.get(name)
        if descriptor is None:
            descriptor = os.open(self._folder / name, os.O_RDWR | os.O_CREAT, 0o600)
            files[name] = descriptor
        return descriptor


def needs_catch_up(config: BridgeConfig) -> bool:
    """Whether some database of `config` has a catch-up limit."""
    return bool(limited_databases(config))
