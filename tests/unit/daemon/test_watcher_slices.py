"""The watcher looks at many forwarders in statements of a bounded size
(`PARTS_PER_STATEMENT` sources each), so that no single statement grows with the config, and
finds a message in any of their queues."""

from __future__ import annotations

import math
import threading
from pathlib import Path

from support import SqliteEndpoint, nsb_message_headers, wait_until, write_config

from bridge.commands.install import run_install
from bridge.config import load_config
from bridge.daemon.board import WorkBoard
from bridge.daemon.forwarder_health import ForwarderHealth
from bridge.daemon.watcher import PARTS_PER_STATEMENT, WorkWatcher

FORWARDERS = 100


def test_a_hundred_forwarders_are_looked_at_in_statements_of_bounded_size(
    tmp_path: Path,
) -> None:
    sender = SqliteEndpoint(tmp_path / "sender.db")
    receiver = SqliteEndpoint(tmp_path / "receiver.db")
    path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {"sender": sender.database_entry(), "receiver": receiver.database_entry()},
            "forwarders": [
                # A minute between looks: the first look is the only one in this test.
                {"name": f"f{i}", "database": "sender", "queue": f"q{i}", "peek_interval": "60s"}
                for i in range(FORWARDERS)
            ],
            "routes": [{"match": "*", "database": "receiver"}],
        },
    )
    config, _ = load_config(path)
    run_install(config)
    last = f"q{FORWARDERS - 1}"
    sender.send(last, [(nsb_message_headers("Samples.Receiver"), b"hello", None)])
    board = WorkBoard({f"f{i}": 1 for i in range(FORWARDERS)})
    stop = threading.Event()
    watcher = WorkWatcher(config, "sender", board, stop, ForwarderHealth())
    watcher.start()
    try:
        taken = []

        def marked() -> bool:
            entry = board.take(0)
            if entry is not None:
                taken.append(entry.key)
            return bool(taken)

        wait_until(marked, 15, "the message in the last queue to be marked")
        assert taken == [(f"f{FORWARDERS - 1}", "queue")]
        # A queue and a retry storage per forwarder: 200 sources, 32 to a statement.
        assert watcher.queries == math.ceil(2 * FORWARDERS / PARTS_PER_STATEMENT) == 7
    finally:
        stop.set()
        board.close()
        watcher.wake()
        watcher.join(10)
