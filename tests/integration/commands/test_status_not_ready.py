"""`status` on a forwarding database without the bridge's tables: not ready, not unreachable."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from support import SENDER_FORWARD as FORWARD
from support import sfbridge, write_config

pytestmark = pytest.mark.integration


def test_a_forwarding_database_without_the_bridges_tables_is_not_ready(
    tmp_path: Path, new_pg_database: Callable[[], str]
) -> None:
    config = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": new_pg_database()},
                "receiver": {"dialect": "postgresql", "connection": new_pg_database()},
            },
            "forwarders": [{"name": "sender", "database": "sender", "queue": FORWARD}],
            "routes": [{"match": "*", "database": "receiver"}],
        },
    )  # never installed
    result = sfbridge("-c", str(config), "status")
    assert result.returncode == 3, result.stdout + result.stderr
    assert "NOT READY" in result.stdout and "'sfbridge check'" in result.stdout, result.stdout
    assert "UNAVAILABLE" not in result.stdout, result.stdout
    as_json = json.loads(sfbridge("-c", str(config), "status", "--json").stdout)
    (forwarder,) = as_json["forwarders"]
    assert forwarder["error_state"] == "not-ready", forwarder
