"""A failing observer (metrics) never stops a worker (docs/operating.md: "A failing metrics call
never stops delivery")."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

import pytest
from support import SqliteEndpoint, nsb_message_headers, wait_until, write_config

from bridge.commands.install import run_install
from bridge.config import load_config
from bridge.daemon.board import WorkBoard
from bridge.daemon.forwarder_health import ForwarderHealth
from bridge.daemon.watcher import WorkWatcher
from bridge.daemon.workers import PoolWorker
from bridge.forwarding.writes import QueueWriter
from bridge.outages import OutageTracker


class ObserverThatAlwaysFails:
    def __init__(self) -> None:
        self.told_down = 0  # how often the worker told it that its database is down

    def batch_started(self, forwarder: str) -> None:
        raise RuntimeError("metrics broke")

    def batch_finished(
        self,
        forwarder: str,
        source: str,
        claimed: int,
        counts: Mapping[str, int] | None,
        seconds: float,
    ) -> None:
        raise RuntimeError("metrics broke")

    def delivered(self, database: str, count: int, seconds_since_claim: float) -> None:
        raise RuntimeError("metrics broke")

    def database_seen(self, database: str, up: bool) -> None:
        self.told_down += not up
        raise RuntimeError("metrics broke")


# Without the fix the worker thread dies of the observer's exception, which pytest also
# reports as an unhandled thread exception; the assertion below is what matters.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_worker_outlives_an_observer_failing_while_its_database_is_down(
    tmp_path: Path,
) -> None:
    # The forwarding database is not there yet: the worker tells the observer it is down.
    sender_path = tmp_path / "later" / "sender.db"
    receiver = SqliteEndpoint(tmp_path / "receiver.db")
    path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "sqlite", "path": str(sender_path)},
                "receiver": receiver.database_entry(),
            },
            "forwarders": [{"name": "s", "database": "sender", "queue": "forward"}],
            "routes": [{"match": "*", "database": "receiver"}],
        },
    )
    config, _ = load_config(path)
    stop = threading.Event()
    observer = ObserverThatAlwaysFails()
    health = ForwarderHealth()
    board = WorkBoard({"s": 1})
    watcher = WorkWatcher(config, "sender", board, stop, health, observer=observer)
    worker = PoolWorker(
        config,
        "sender",
        0,
        board,
        stop,
        OutageTracker(1.0),
        QueueWriter(),
        health,
        observer=observer,
    )
    watcher.start()
    worker.start()
    try:
        # The database is down: the worker tells the observer, which raises.
        wait_until(lambda: observer.told_down >= 1, 15, "the observer to be told and fail")
        sender_path.parent.mkdir()
        run_install(config)
        receiver.create_queue("Samples.Receiver")
        SqliteEndpoint(sender_path).send(
            "forward", [(nsb_message_headers("Samples.Receiver"), b"hello", None)]
        )
        assert worker.is_alive(), "the worker died of an observer's exception"
        assert watcher.is_alive(), "the watcher died of an observer's exception"
        wait_until(
            lambda: len(receiver.receive_all("Samples.Receiver")) == 1,
            15,
            "the message to be delivered",
        )
    finally:
        stop.set()
        board.close()
        watcher.wake()
        worker.join(10)
        watcher.join(10)
