"""The work board's turns (round-robin, capped per forwarder, level-triggered) and the pool
sizes the connection budget gives."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import replace
from typing import Any

from support import wait_until

from bridge.config.model import (
    BridgeConfig,
    DaemonConfig,
    DatabaseConfig,
    FixedDestination,
    ForwarderConfig,
    MetricsConfig,
    RouteConfig,
)
from bridge.daemon.board import WorkBoard
from bridge.daemon.budget import (
    MAX_AUTO_PROCESSES,
    most_connections,
    pool_sizes,
    process_count,
    reserved,
    shares,
    worker_count,
)


def test_a_busy_queue_takes_turns_with_the_others() -> None:
    board = WorkBoard({"busy": 2, "quiet": 2, "other": 2})
    board.mark([("busy", "queue")])
    taken = board.take(0)
    assert taken is not None and taken.key == ("busy", "queue")
    board.finish(taken, full=True)  # a backlog: it stays wanted
    board.mark([("quiet", "queue"), ("other", "retry")])
    order = []
    for _ in range(6):
        entry = board.take(0)
        assert entry is not None
        order.append(entry.key)
        board.finish(entry, full=entry.forwarder == "busy")
    # The busy queue comes round once per turn, not every time.
    assert order[:3] == [("quiet", "queue"), ("other", "retry"), ("busy", "queue")]
    assert order[3:] == [("busy", "queue")] * 3  # the others had nothing more


def _waiting_workers(board: WorkBoard, count: int) -> list[threading.Thread]:
    """`count` workers waiting in `take` (each takes one entry and keeps it)."""
    threads = [threading.Thread(target=board.take, args=(30,), daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    # How many wait is the point here.
    wait_until(lambda: board._idle >= count, 10, "the workers to wait")
    return threads


def test_a_mark_says_what_no_worker_here_can_start_on_now() -> None:
    """What `mark` returns goes on to the daemon's other processes (`bridge.daemon.board`)."""
    board = WorkBoard({"a": 1, "b": 1, "c": 1})
    # Nobody waits: nothing can start now, though the marks stay (taken after a batch).
    assert board.mark([("a", "queue")]) == [("a", "queue")]
    assert board.mark([("a", "queue")]) == [("a", "queue")]  # still nobody to take it
    assert board.take(0) is not None
    assert board.mark([("x", "queue")]) == [("x", "queue")]  # not on this board
    # One worker waits: one source starts now; `a` is at its cap (its batch runs).
    threads = _waiting_workers(board, 1)
    marked = [("a", "retry"), ("b", "queue"), ("c", "queue")]
    assert board.mark(marked) == [("a", "retry"), ("c", "queue")]
    threads[0].join(5)
    # A source marked twice in one go is spoken for once: the second is not sent on.
    board = WorkBoard({"a": 2})
    threads = _waiting_workers(board, 1)
    assert board.mark([("a", "queue"), ("a", "queue")]) == []
    threads[0].join(5)


def test_a_source_that_turns_into_a_backlog_is_told_once_per_turn() -> None:
    board = WorkBoard({"f": 2})
    told: list[Any] = []
    board.on_backlog = told.append
    board.mark([("f", "queue")])
    entry = board.take(0)
    assert entry is not None
    board.more_waiting(entry)  # a full claim while the batch runs
    board.more_waiting(entry)
    board.finish(entry, full=True)
    assert told == [("f", "queue")]
    again = board.take(0)
    assert again is not None
    board.finish(again, full=False)  # the backlog is gone
    board.mark([("f", "queue")])
    last = board.take(0)
    assert last is not None
    board.finish(last, full=True)  # a backlog again
    assert told == [("f", "queue")] * 2


def test_a_forwarder_never_runs_more_batches_than_its_concurrency() -> None:
    board = WorkBoard({"one": 1, "two": 2})
    board.mark([("one", "queue"), ("one", "retry"), ("two", "queue")])
    first = board.take(0)
    assert first is not None and first.key == ("one", "queue")
    first.backlog = True
    second = board.take(0)
    # `one` is at its cap: its retries wait, `two` goes.
    assert second is not None and second.key == ("two", "queue")
    assert board.take(0) is None
    board.finish(first)
    third = board.take(0)
    assert third is not None and third.key == ("one", "retry")


def test_work_seen_during_a_batch_is_taken_again_after_it() -> None:
    board = WorkBoard({"f": 1})
    board.mark([("f", "queue")])
    entry = board.take(0)
    assert entry is not None
    board.mark([("f", "queue")])  # a notification while the batch runs
    board.finish(entry, full=False)
    again = board.take(0)
    assert again is not None and again.key == ("f", "queue")
    board.finish(again, full=False)
    assert board.take(0) is None


def test_a_failed_source_is_held_back_then_taken_again_unmarked() -> None:
    board = WorkBoard({"f": 1})
    board.mark([("f", "queue")])
    entry = board.take(0)
    assert entry is not None
    board.finish(entry, failing=True, hold=0.2)
    assert board.failing() == {("f", "queue")}
    started = time.monotonic()
    again = board.take(5)
    assert again is not None and again.key == ("f", "queue")
    assert 0.15 <= time.monotonic() - started < 2
    board.finish(again)
    assert board.failing() == set()


def test_a_waiting_worker_wakes_when_work_is_marked() -> None:
    board = WorkBoard({"f": 1})
    taken: list[Any] = []
    waiter = threading.Thread(target=lambda: taken.append(board.take(10)))
    waiter.start()
    started = time.monotonic()
    board.mark([("f", "retry")])
    waiter.join(5)
    assert taken and taken[0].key == ("f", "retry")
    assert time.monotonic() - started < 1


def test_close_ends_a_wait() -> None:
    board = WorkBoard({"f": 1})
    result: list[Any] = ["unset"]
    waiter = threading.Thread(target=lambda: result.__setitem__(0, board.take(30)))
    waiter.start()
    board.close()
    waiter.join(5)
    assert result == [None]


def _config(forwarders: int, **options: Any) -> BridgeConfig:
    """`forwarders` forwarders of concurrency 2 (`concurrency`) on database src, routing to dst;
    one process unless `processes` says otherwise."""
    databases = {
        "src": DatabaseConfig("src", "postgresql", "x", max_connections=options.get("src", 10)),
        "dst": DatabaseConfig("dst", "postgresql", "x", max_connections=options.get("dst", 10)),
    }
    return BridgeConfig(
        databases=databases,
        forwarders=tuple(
            ForwarderConfig(f"f{i}", "src", f"q{i}", concurrency=options.get("concurrency", 2))
            for i in range(forwarders)
        ),
        routes=(RouteConfig("*", "dst", transaction=options.get("mode")),),
        metrics=MetricsConfig(listen=options.get("metrics")),
        daemon=DaemonConfig(processes=options.get("processes", "1")),
    )


def test_fifty_forwarders_share_a_pool_that_fits_max_connections() -> None:
    config = _config(50)
    # 10 minus the watcher, its listener, the heartbeat and upkeep on the source; the
    # destination has room for them.
    assert pool_sizes(config) == {"src": 6}
    assert most_connections(config, "src") == 10
    assert most_connections(config, "dst") == 7  # 6 workers' deliveries and upkeep
    assert pool_sizes(_config(1)) == {"src": 2}  # never more than the forwarders want


def test_the_pool_fits_the_destination_too_and_records_count_twice() -> None:
    assert pool_sizes(_config(50, dst=5)) == {"src": 4}
    # At-least-once keeps its records on a second connection to the source.
    config = _config(50, mode="at-least-once")
    assert pool_sizes(config) == {"src": 3}
    assert most_connections(config, "src") == 10
    with_metrics = _config(50, metrics="127.0.0.1:9464")
    assert pool_sizes(with_metrics) == {"src": 5}


def test_the_connection_that_listens_for_pushes_is_counted_only_where_the_daemon_listens() -> None:
    pushed = _config(50)
    assert reserved(pushed, "src") == 4  # upkeep, the watcher, its listener, the heartbeat
    pooled = replace(
        pushed,
        databases={
            **pushed.databases,
            "src": replace(pushed.databases["src"], pooler="transaction"),
        },
    )
    assert reserved(pooled, "src") == 3  # no LISTEN through a transaction pooler
    assert pool_sizes(pooled) == {"src": 7}
    assert reserved(pushed, "dst") == 1  # not a forwarding database: upkeep alone


def test_a_proxy_counts_towards_its_destination() -> None:
    config = _config(0, dst=6)
    config = BridgeConfig(
        databases=config.databases,
        forwarders=(
            ForwarderConfig("p", "src", "q", concurrency=8, destination=FixedDestination("dst")),
        ),
    )
    assert pool_sizes(config) == {"src": 5}


def test_a_full_claim_lets_a_second_worker_join_while_the_batch_runs() -> None:
    board = WorkBoard({"f": 2})
    board.mark([("f", "queue")])
    first = board.take(0)
    assert first is not None
    assert board.take(0) is None  # one batch runs; nothing says more is waiting yet
    board.more_waiting(first)  # its claim came back full
    second = board.take(0)
    assert second is not None and second.key == ("f", "queue")
    assert board.take(0) is None  # at its concurrency of 2
    board.finish(first, full=False)
    board.finish(second, full=False)
    assert board.take(0) is None  # a short batch ended the backlog


def test_auto_takes_a_process_per_cpu_but_no_more_than_the_workers() -> None:
    one = _config(1, processes="auto")  # two workers in all
    assert process_count(one, cpus=1) == 1
    assert process_count(one, cpus=2) == 2
    assert process_count(one, cpus=16) == 2  # a third would have nothing to do
    assert process_count(_config(50, processes="auto"), cpus=16) == MAX_AUTO_PROCESSES
    # The pool, not the demand, is the limit: 6 connections leave room for 2 workers.
    assert process_count(_config(50, processes="auto", src=6), cpus=16) == 2
    # A number is taken as given, but never above the workers there are.
    assert process_count(_config(1, processes="3"), cpus=1) == 2
    assert process_count(_config(50, processes="3"), cpus=1) == 3


def test_processes_split_the_pools_without_adding_connections() -> None:
    config = _config(50, processes="auto")
    count = process_count(config, cpus=2)
    assert count == 2
    # The same six workers as in one process, and the same connections.
    assert pool_sizes(config) == {"src": 6}
    assert most_connections(config, "src") == 10
    parts = shares(config, count)
    assert [part.pools for part in parts] == [{"src": 3}, {"src": 3}]
    assert [part.first_worker for part in parts] == [{"src": 0}, {"src": 3}]


def test_every_forwarder_keeps_its_concurrency_across_the_processes() -> None:
    for forwarders, concurrency, count in ((1, 2, 2), (3, 1, 2), (5, 3, 3), (2, 1, 4), (7, 4, 3)):
        config = _config(forwarders, concurrency=concurrency, processes=str(count), src=100)
        parts = shares(config, process_count(config))
        for forwarder in config.forwarders:
            dealt = [part.caps.get(forwarder.name, 0) for part in parts]
            assert sum(dealt) == worker_count(config, forwarder), (forwarder.name, dealt)
            assert max(dealt) - min(dealt) <= 1  # as even as it goes
        for part in parts:
            # A process has workers for its forwarders, and none without any.
            assert bool(part.pools) == bool(part.caps)
            assert sum(part.pools.values()) <= sum(part.caps.values())
        firsts = sorted(
            (part.first_worker["src"], part.pools["src"]) for part in parts if part.pools
        )
        # Worker numbers (counter slots) run on from one process to the next, never twice.
        assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(firsts))
    # Uneven concurrencies: no worker is lost and no process is left without any.
    for concurrencies, count in (((2, 1), 3), ((2, 2), 4), ((3, 1, 2), 4), ((1, 3, 1, 1), 3)):
        config = BridgeConfig(
            databases=_config(0, src=100).databases,
            forwarders=tuple(
                ForwarderConfig(f"f{i}", "src", f"q{i}", concurrency=c)
                for i, c in enumerate(concurrencies)
            ),
            daemon=DaemonConfig(processes=str(count)),
        )
        parts = shares(config, process_count(config))
        assert sum(part.pools.get("src", 0) for part in parts) == sum(concurrencies), parts
        assert all(part.pools for part in parts), parts
    # Forwarders of concurrency 1 spread over the processes instead of piling onto the first.
    parts = shares(_config(4, concurrency=1, processes="2"), 2)
    assert [sorted(part.caps) for part in parts] == [["f0", "f2"], ["f1", "f3"]]
