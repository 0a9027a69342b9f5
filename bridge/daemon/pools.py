"""One process's part of the daemon's pools: per forwarding database a board and pool workers
(`bridge.daemon.board`, `bridge.daemon.workers`), and in the daemon's own process the watchers
(`bridge.daemon.watcher`).

The daemon's own process runs one (`bridge.daemon.runtime`), and so does each further worker
process (`bridge.daemon.processes`), each for its `Share` of the pools (`bridge.daemon.budget`).
A worker process has no watcher: the daemon's watchers mark its boards too, so that work is
looked for once per database however many processes forward, on no more connections.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import partial

from bridge.config.model import BridgeConfig
from bridge.daemon.board import Key, WorkBoard
from bridge.daemon.budget import Share
from bridge.daemon.catch_up import SharedCatchUp
from bridge.daemon.forwarder_health import ForwarderHealth
from bridge.daemon.watcher import WorkWatcher
from bridge.daemon.workers import PoolWorker
from bridge.forwarding.hops import HopTracer
from bridge.forwarding.notices import Notices
from bridge.forwarding.observers import ForwardingObserver
from bridge.forwarding.writes import QueueWriter
from bridge.outages import OutageTracker
from bridge.storage.tables import forwarder_tables

log = logging.getLogger(__name__)

# How long SIGTERM waits for the batches in flight before a process leaves without them.
STOP_GRACE_SECONDS = 10.0


@dataclass
class Pools:
    """The threads of one process's share, started."""

    boards: dict[str, WorkBoard] = field(default_factory=dict)  # by database
    watchers: list[WorkWatcher] = field(default_factory=list)
    workers: list[PoolWorker] = field(default_factory=list)

    def threads(self) -> list[threading.Thread]:
        return [*self.workers, *self.watchers]

    def start_watchers(self) -> None:
        for watcher in self.watchers:
            watcher.start()

    def mark(self, database: str, keys: list[Key]) -> None:
        """Mark sources on this process's board of `database`, if it has one."""
        board = self.boards.get(database)
        if board is not None:
            board.mark(keys)

    def look_again(self) -> None:
        """Every watcher looks at every source soon (a worker process's boards are new)."""
        for watcher in self.watchers:
            watcher.look_again()

    def close(self) -> None:
        """Let every worker finish its batch and the watchers stop (the `stop` event given to
        `start_pools` must be set too)."""
        for board in self.boards.values():
            board.close()
        for watcher in self.watchers:
            watcher.wake()

    def alive(self, limit: float) -> bool:
        """Whether every thread runs and has looped within `limit` seconds: one that has not
        is hung (a statement that never returns)."""
        now = time.monotonic()
        threads: list[PoolWorker | WorkWatcher] = [*self.workers, *self.watchers]
        return all(t.is_alive() and now - t.last_progress < limit for t in threads) and not any(
            watcher.listener_hung(now, limit) for watcher in self.watchers
        )

    def totals(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for worker in self.workers:
            total.update(worker.snapshot())
        return total


def progress_limit(config: BridgeConfig) -> float:
    """How long a worker or watcher may go without looping before it counts as hung."""
    peek = max((f.peek_interval for f in config.forwarders), default=1)
    return max(60.0, peek * 5)


def start_pools(
    config: BridgeConfig,
    share: Share,
    stop: threading.Event,
    outages: OutageTracker,
    health: ForwarderHealth,
    observer: ForwardingObserver | None,
    *,
    watched: Collection[str] = (),
    relay: Callable[[str, list[Key]], None] | None = None,
    backlog: Callable[[str, Key], None] | None = None,
    notices: Notices | None = None,
    tracer: HopTracer | None = None,
) -> Pools:
    """Start the workers of `share`, and a watcher for each database of `watched` (every
    forwarder of it, on this process's board or not), which tells `relay` what it marks that
    no worker here can start on now; `backlog` is told of each source that turns into a
    backlog here (the daemon's other processes join in: `bridge.daemon.board`);
    `notices` says what the workers learn of tables (one for all of a daemon's processes);
    `tracer` is told the hops of every committed batch (None: tracing is off);
    returns at once. The watchers start with `Pools.start_watchers`, once every board they
    mark is there."""
    pools = Pools()
    # Queue table shapes (SQL Server's optional Recoverable column) are learnt once.
    writer = QueueWriter(notices=notices)
    catch_up = (
        None
        if share.catch_up_folder is None
        else SharedCatchUp(config, share.catch_up_folder, stop)
    )
    where = f" in process {share.index + 1} of {share.count}" if share.count > 1 else ""
    for database, size in share.pools.items():
        forwarders = [f for f in config.forwarders if f.name in share.caps]
        forwarders = [f for f in forwarders if f.database == database]
        caps = {f.name: share.caps[f.name] for f in forwarders}
        board = WorkBoard(caps)
        board.on_backlog = partial(backlog, database) if backlog is not None else None
        pools.boards[database] = board
        for forwarder in forwarders:
            log.info(
                "forwarder '%s': up to %d worker(s) on %s in database '%s'%s",
                forwarder.name,
                caps[forwarder.name],
                forwarder_tables(config, forwarder).queue_canonical,
                database,
                where,
            )
        log.info(
            "database '%s': %d pool worker(s) shared by %d forwarder(s) (max_connections %d)%s",
            database,
            size,
            len(forwarders),
            config.databases[database].max_connections,
            where,
        )
        first = share.first_worker.get(database, 0)
        pools.workers += [
            PoolWorker(
                config,
                database,
                first + index,
                board,
                stop,
                outages,
                writer,
                health,
                observer,
                catch_up=catch_up,
                repeats=notices.repeats if notices is not None else None,
                tracer=tracer,
            )
            for index in range(size)
        ]
    for database in watched:
        board = pools.boards.setdefault(database, WorkBoard({}))
        also = partial(relay, database) if relay is not None else None
        pools.watchers.append(
            WorkWatcher(config, database, board, stop, health, observer, also, logins=outages)
        )
    for worker in pools.workers:
        worker.start()
    return pools
