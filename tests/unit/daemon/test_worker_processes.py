"""`daemon.processes`: the workers dealt out over several processes under one `sfbridge run`.
Real daemons on real databases: both processes forward, the daemon reports for both, a worker
process killed is started again with nothing lost or doubled, and nothing outlives the daemon,
SIGKILLed or stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import (
    write_config,
)
from support.metrics import value
from support.pairs import pg_pair_config

from bridge.config.load import load_config
from bridge.exceptions import ConfigError


def delivered(samples: dict[Any, float]) -> float | None:
    """`sfbridge_messages_total{outcome="delivered"}` of the forwarder `sender`."""
    return value(samples, "sfbridge_messages_total", forwarder="sender", outcome="delivered")


def test_a_daemon_config_asks_for_processes_as_a_number_or_auto(tmp_path: Path) -> None:
    path = tmp_path / "sfbridge.yaml"
    for written, read in ((2, "2"), ("3", "3"), ("auto", "auto")):
        write_config(path, pg_pair_config("Driver=x;", "Driver=y;", daemon={"processes": written}))
        assert load_config(str(path))[0].daemon.processes == read
    for wrong in (0, "many", True, 17):
        write_config(path, pg_pair_config("Driver=x;", "Driver=y;", daemon={"processes": wrong}))
        with pytest.raises(ConfigError, match=r"daemon\.processes"):
            load_config(str(path))
