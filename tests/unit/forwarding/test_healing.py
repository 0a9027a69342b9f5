"""Databases that come back heal themselves: the bridge recreates the tables it owns.

These replay the store-and-forward sample's verification steps the way they happen: the
receiver's database is deleted while the bridge runs, messages are sent, and the receiver is
restarted by its own installer, which recreates the database and only its own queue table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import (
    sfbridge,
    write_config,
)

from bridge.config import load_config


def status(config: Path) -> dict[str, Any]:
    result = sfbridge("-c", str(config), "status", "--json")
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_ledger_cleanup_does_not_nag_about_a_database_that_is_down(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from bridge.outages import OutageTracker
    from bridge.storage.ledger import cleanup_ledgers

    closed_port = "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=1;Uid=postgres;Database=x;"
    path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "sqlite", "path": str(tmp_path / "s.db")},
                "receiver": {"dialect": "postgresql", "connection": closed_port},
            },
            "forwarders": [{"name": "f", "database": "sender", "queue": "forward"}],
            "routes": [{"match": "*", "database": "receiver"}],
        },
    )
    config, _ = load_config(path)
    tracker = OutageTracker(60, external_probe=True)
    tracker.record_trouble("receiver", "unreachable", "refused")
    caplog.set_level("DEBUG", logger="bridge.storage.ledger")
    caplog.clear()

    def ledger_records() -> list[str]:
        return [r.levelname for r in caplog.records if r.name == "bridge.storage.ledger"]

    assert cleanup_ledgers(config, tracker) == 0
    assert ledger_records() == []  # known down: not even tried
    assert cleanup_ledgers(config) == 0
    assert ledger_records() == ["DEBUG"]  # tried, failed, said quietly
