"""`status -c FILE` judges the forwarders of FILE: a daemon of another configuration on the same
forwarding database does not serve them, and a forwarding database that cannot be read is
unknown (exit 3), never "start it"."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import DaemonProcess, PgPair, sfbridge, wait_until, write_config

pytestmark = pytest.mark.integration


def status(config: Path) -> tuple[int, dict[str, Any]]:
    result = sfbridge("-c", str(config), "status", "--json")
    return result.returncode, json.loads(result.stdout)


def test_the_status_of_a_configuration_whose_daemon_is_stopped_fails_naming_its_forwarders(
    pg_pair: PgPair, start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    # A second configuration on the same forwarding database, with a forwarder of its own.
    other = yaml.safe_load(pg_pair.config.read_text())
    other["forwarders"][0].update(name="other", queue="Samples.Other.Forward")
    other_config = write_config(tmp_path / "other.yaml", other)
    installed = sfbridge("-c", str(other_config), "install")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    daemon = start_daemon(other_config)
    wait_until(lambda: status(other_config)[0] == 0, 30, "the other daemon to serve 'other'")
    _, served = status(other_config)
    [other_forwarder] = served["forwarders"]
    assert other_forwarder["served"] is True
    assert other_forwarder["served_by"] == [f"{socket.gethostname()}:{daemon.process.pid}"]

    # pg_pair's own daemon is not running: its status must not read the other one as its own.
    code, mine = status(pg_pair.config)
    assert code == 1, mine
    [forwarder] = mine["forwarders"]
    assert (forwarder["forwarder"], forwarder["served"], forwarder["served_by"]) == (
        "sender",
        False,
        [],
    )
    [entry] = mine["daemons"]
    assert entry["state"] == "running" and entry["forwarders"] == ["other"]
    assert entry["same_config"] is False
    text = pg_pair.cli("status")
    assert text.returncode == 1
    lines = text.stdout.splitlines()
    assert lines[0] == "daemons: 1 running; NONE serves forwarder(s) sender", text.stdout
    assert "serves other (another configuration," in lines[1], text.stdout
    assert "  NOT SERVED         no running daemon serves this forwarder" in text.stdout
    daemon.kill()


def test_a_forwarding_database_that_cannot_be_read_is_unknown_not_start_it(
    pg_pair: PgPair, tmp_path: Path
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    down = yaml.safe_load(pg_pair.config.read_text())
    sender = down["databases"]["sender"]
    sender["connection"] = re.sub(r"Port=\d+", f"Port={port}", sender["connection"])
    config = write_config(tmp_path / "down.yaml", down)

    result = sfbridge("-c", str(config), "status")
    assert result.returncode == 3, result.stdout + result.stderr
    assert "start it" not in result.stdout, result.stdout
    lines = result.stdout.splitlines()
    assert lines[0] == "daemons: UNKNOWN - the forwarding database(s) cannot be read (below)"
    assert lines[1].startswith("  CANNOT READ forwarding database 'sender': "), result.stdout
    assert "served by          UNKNOWN: its forwarding database cannot be read" in result.stdout
    code, as_json = status(config)
    assert code == 3 and as_json["forwarders"][0]["served"] is None
    assert [entry["database"] for entry in as_json["daemons_unreadable"]] == ["sender"]
