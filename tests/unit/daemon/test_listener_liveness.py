"""The daemon's liveness covers the watcher's listener too (`WorkWatcher.listener_hung`): it
runs in a thread of its own, and a wait for notifications that never returned would stop push
while every other thread looked well."""

from __future__ import annotations

import threading
import time

from support import wait_until

from bridge.config.model import BridgeConfig, DatabaseConfig, ForwarderConfig, RouteConfig
from bridge.daemon.board import WorkBoard
from bridge.daemon.forwarder_health import ForwarderHealth
from bridge.daemon.watcher import WorkWatcher

# Nothing listens on port 9 of the loopback: the listener's connection is refused at once, and
# it tries again, looping, as it does while a database is down.
NOBODY = "host=127.0.0.1 port=9 dbname=sender user=sfbridge connect_timeout=1"


def test_a_listener_that_stops_looping_counts_as_hung_and_one_that_loops_does_not() -> None:
    config = BridgeConfig(
        databases={"sender": DatabaseConfig("sender", "postgresql", NOBODY)},
        forwarders=(ForwarderConfig("f", "sender", "q"),),
        routes=(RouteConfig("*", "sender"),),
    )
    stop = threading.Event()
    watcher = WorkWatcher(config, "sender", WorkBoard({"f": 1}), stop, ForwarderHealth())
    assert watcher.push_off is None  # it listens
    assert not watcher.listener_hung(time.monotonic() + 100, 60)  # not started: not hung
    watcher.start()
    try:
        wait_until(lambda: watcher.listener_hung(time.monotonic() + 100, 60), 10, "a listener")
        # Looping (it tries to connect again every few seconds): well within a minute.
        assert not watcher.listener_hung(time.monotonic(), 60)
    finally:
        stop.set()
        watcher.wake()
        watcher.join(10)
    assert not watcher.is_alive()
    wait_until(lambda: not watcher.listener_hung(time.monotonic() + 100, 60), 5, "it ended")
