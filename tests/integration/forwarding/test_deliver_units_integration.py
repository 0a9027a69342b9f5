"""Specification of bridge.forwarding.deliver's pure parts: grouping units per database, and
isolating a failing message from the rest of its batch. The writes themselves are tested on real
databases (tests/integration/forwarding/test_batches.py)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from typing import Any

from bridge.addressing import TableAddress
from bridge.config.model import TransactionMode
from bridge.messages import (
    Forward,
)
from bridge.routing import Destination


def deliver(table: str, database: str = "receiver", mode: TransactionMode = "ledger") -> Forward:
    destination = Destination(database, TableAddress(table), table, mode)
    return Forward({}, destination, "{}", str(uuid.uuid4()))


# The fake deliveries never record on the source side.
NO_SOURCE: Any = None


def test_a_delivery_that_never_returns_does_not_keep_the_process_from_exiting() -> None:
    # The daemon leaves a worker stuck on a silent database behind when it stops (its batch is
    # rolled back by the server); a delivery thread stuck beside it must not hold the exit.
    script = """
import threading, time
from bridge.forwarding.side_by_side import SideBySide
side_by_side = SideBySide(2, "stuck")
stuck = threading.Event()
calls = [lambda: None, lambda: (stuck.set(), threading.Event().wait())]
threading.Thread(target=side_by_side.run, args=(calls,), daemon=True).start()
assert stuck.wait(10)
print("leaving", flush=True)
"""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.stdout == "leaving\n", result.stderr
    assert time.monotonic() - started < 30
