"""Whether a daemon runs, as `sfbridge status` tells it: a real daemon in a subprocess on a
PostgreSQL pair, stopped cleanly (SIGTERM) and killed (SIGKILL), then forgotten."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
from support import DaemonProcess, wait_until
from support.pairs import PgPair

from bridge.commands.status import collect_status
from bridge.config.load import load_config

pytestmark = pytest.mark.integration


def status(pair: PgPair) -> tuple[int, dict[str, Any]]:
    result = pair.cli("status", "--json")
    assert result.returncode in (0, 1), result.stdout + result.stderr
    return result.returncode, json.loads(result.stdout)


def daemon_entry(pair: PgPair, daemon: DaemonProcess) -> dict[str, Any] | None:
    _, current = status(pair)
    for entry in current["daemons"]:
        if entry["pid"] == daemon.process.pid:
            return entry  # type: ignore[no-any-return]
    return None


def wait_running(pair: PgPair, daemon: DaemonProcess) -> dict[str, Any]:
    def running() -> bool:
        entry = daemon_entry(pair, daemon)
        return entry is not None and entry["state"] == "running"

    wait_until(running, 30, "the daemon to record itself running")
    entry = daemon_entry(pair, daemon)
    assert entry is not None
    return entry


def test_no_daemon_then_running_then_stopped_at_once_by_sigterm(
    pg_pair: PgPair, start_daemon: Callable[..., DaemonProcess]
) -> None:
    code, before = status(pg_pair)
    assert (code, before["daemons"], before["daemons_running"]) == (1, [], 0)
    assert pg_pair.cli("status").stdout.startswith("daemons: NONE RUNNING")

    daemon = start_daemon(pg_pair.config)
    pg_pair.send(3)
    wait_until(lambda: pg_pair.delivered() == 3, 30, "delivery")
    entry = wait_running(pg_pair, daemon)
    assert entry["heartbeat_seconds"] == 5.0 and entry["forwarding_databases"] == ["sender"]
    assert entry["stopped"] is None and entry["last_heartbeat"] >= entry["started"]
    code, running = status(pg_pair)
    assert code == 0 and running["daemons_running"] == 1
    text = pg_pair.cli("status")
    assert text.returncode == 0
    assert text.stdout.splitlines()[0] == "daemons: 1 running", text.stdout
    assert f":{daemon.process.pid}" in text.stdout.splitlines()[1]
    wait_until(
        lambda: any(d["database"] == "receiver" for d in status(pg_pair)[1]["destinations"]),
        30,
        "the receiver's state to be published",
    )

    stopping = time.monotonic()
    assert daemon.stop() == 0, daemon.output()
    # Recorded before the process exits: no waiting for a heartbeat to age.
    code, after = status(pg_pair)
    entry = daemon_entry(pg_pair, daemon)
    assert entry is not None and entry["state"] == "stopped" and entry["stopped"] is not None
    assert time.monotonic() - stopping < 15
    assert code == 1 and after["daemons_running"] == 0
    [receiver] = [d for d in after["destinations"] if d["database"] == "receiver"]
    assert receiver["state"] == "up" and receiver["stale"] is True
    assert receiver["reporter_state"] == "stopped"
    text = pg_pair.cli("status")
    assert text.returncode == 1
    lines = text.stdout.splitlines()
    assert lines[0].startswith("daemons: NONE RUNNING"), text.stdout
    assert "stopped at" in lines[1]
    [receiver_line] = [line for line in lines if line.strip().startswith("receiver")]
    assert "was up since" in receiver_line and "which is stopped: not current" in receiver_line

    # A restart on the same host replaces the stopped daemon's row; the states the stopped
    # one wrote stay the past, though the daemons table no longer knows their writer.
    again = start_daemon(pg_pair.config, "again.log")
    wait_running(pg_pair, again)
    _, current = status(pg_pair)
    assert [d["pid"] for d in current["daemons"]] == [again.process.pid]
    [receiver] = [d for d in current["destinations"] if d["database"] == "receiver"]
    assert receiver["reported_by"].endswith(f":{daemon.process.pid}"), receiver
    assert receiver["stale"] is True and receiver["reporter_state"] == "gone", receiver
    again.kill()
    [receiver_line] = [
        line for line in pg_pair.cli("status").stdout.splitlines() if "receiver" in line
    ]
    assert "was up since" in receiver_line and "no longer runs: not current" in receiver_line


def test_a_killed_daemon_reads_missing_within_three_heartbeats_and_can_be_forgotten(
    pg_pair_factory: Callable[..., PgPair], start_daemon: Callable[..., DaemonProcess]
) -> None:
    heartbeat = 2.0
    pair = pg_pair_factory(daemon={"heartbeat": f"{heartbeat:g}s"})
    daemon = start_daemon(pair.config)
    wait_running(pair, daemon)
    name = f"{socket.gethostname()}:{daemon.process.pid}"
    config, _ = load_config(pair.config)

    def entry() -> dict[str, Any]:
        # In-process: a status run in a subprocess takes too long to time the change by.
        [found] = [e for e in collect_status(config)["daemons"] if e["daemon"] == name]
        return found

    daemon.kill()
    first_missing: list[dict[str, Any]] = []

    def missing() -> bool:
        current = entry()
        assert current["state"] in ("running", "missing"), current
        if current["state"] == "missing":
            first_missing.append(current)
        return bool(first_missing)

    wait_until(missing, 30, "the killed daemon to show as missing")
    # Missing before three heartbeat intervals have passed without one, so within three of
    # the kill whenever it came.
    assert first_missing[0]["seconds_since_heartbeat"] < 3 * heartbeat, first_missing[0]
    code, current = status(pair)
    assert code == 1 and current["daemons_running"] == 0
    text = pair.cli("status").stdout.splitlines()
    assert text[0].startswith("daemons: NONE RUNNING")
    assert "MISSING: no heartbeat for" in text[1] and "(every 2 s expected)" in text[1]

    # Forgotten on request (and audited); nothing left that is stale.
    forgot = pair.cli("daemons", "forget", "--id", name)
    assert forgot.returncode == 0, forgot.stdout + forgot.stderr
    assert forgot.stdout == f"forgot 1 daemon entr(y/ies): {name}\n"
    code, current = status(pair)
    assert code == 1 and current["daemons"] == []
    assert current["audit"][0]["command"] == "daemons forget"
    assert current["audit"][0]["target"] == f"--id {name}"
    stale = pair.cli("daemons", "forget", "--stale")
    assert stale.returncode == 0 and "nothing to do" in stale.stdout, stale.stdout
