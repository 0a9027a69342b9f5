"""OutageMemory: one failed connection stands for a while; then the database is tried again."""

from __future__ import annotations

import time

from bridge.outages import OutageMemory


def test_a_database_recorded_down_is_known_down_with_its_error() -> None:
    memory = OutageMemory(hold_seconds=60)
    memory.record_down("receiver", "database 'receiver': cannot connect")
    assert memory.known_down("receiver") == "database 'receiver': cannot connect"
    assert memory.known_down("other") is None


def test_the_memory_expires_after_the_hold_so_the_database_is_tried_again() -> None:
    memory = OutageMemory(hold_seconds=0.05)
    memory.record_down("receiver", "down")
    time.sleep(0.06)
    assert memory.known_down("receiver") is None


def test_recording_a_database_up_forgets_the_outage() -> None:
    memory = OutageMemory(hold_seconds=60)
    memory.record_down("receiver", "down")
    memory.record_up("receiver")
    assert memory.known_down("receiver") is None
