"""The daemon's catch-up limits (`bridge.daemon.catch_up`): the rate holds over many batches
from many threads, the cap on batches in flight is never exceeded and is reached, and a
stopping daemon waits for neither."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from bridge.config.model import BridgeConfig, DatabaseConfig
from bridge.daemon.catch_up import SharedCatchUp, needs_catch_up
from bridge.forwarding.catch_up import limited_counts


def config_with(**limits: Any) -> BridgeConfig:
    databases = {
        "source": DatabaseConfig(name="source", dialect="postgresql", connection="x"),
        "receiver": DatabaseConfig(name="receiver", dialect="postgresql", connection="x", **limits),
    }
    return BridgeConfig(databases=databases, forwarders=())


def test_the_rate_holds_for_batches_from_several_threads(tmp_path: Path) -> None:
    limits = SharedCatchUp(
        config_with(max_messages_per_second=2000), str(tmp_path), threading.Event()
    )
    sent = []

    def send(batches: int) -> None:
        for _ in range(batches):
            with limits.hold({"receiver": 50}):
                sent.append(time.monotonic())

    started = time.monotonic()
    threads = [threading.Thread(target=send, args=(10,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # 40 batches of 50 at 2,000 msg/s: the first goes at once, the other 39 one per 25 ms.
    rate = 50 * (len(sent) - 1) / (max(sent) - started)
    assert abs(rate / 2000 - 1) < 0.10, rate


def test_batches_in_flight_never_exceed_the_cap_and_reach_it(tmp_path: Path) -> None:
    limits = SharedCatchUp(config_with(max_batches_in_flight=2), str(tmp_path), threading.Event())
    lock = threading.Lock()
    inside, most = 0, 0
    held_seconds: list[float] = []

    def deliver() -> None:
        nonlocal inside, most
        for _ in range(5):
            with limits.hold({"receiver": 10}) as held:
                with lock:
                    inside += 1
                    most = max(most, inside)
                time.sleep(0.01)
                with lock:
                    inside -= 1
            held_seconds.extend(held.seconds.values())

    threads = [threading.Thread(target=deliver) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most == 2
    assert held_seconds and all(seconds > 0 for seconds in held_seconds)


def test_a_stopping_daemon_waits_for_no_limit(tmp_path: Path) -> None:
    stop = threading.Event()
    config = config_with(max_messages_per_second=1, max_batches_in_flight=1)
    limits = SharedCatchUp(config, str(tmp_path), stop)
    with limits.hold({"receiver": 100}):  # the schedule is now 100 s ahead
        stop.set()
        started = time.monotonic()
        with limits.hold({"receiver": 100}):  # and the one place is taken
            pass
    assert time.monotonic() - started < 1


def test_only_databases_with_a_limit_wait() -> None:
    assert needs_catch_up(config_with(max_batches_in_flight=1))
    assert not needs_catch_up(config_with())
    assert limited_counts([], {"receiver"}, set()) == {}
