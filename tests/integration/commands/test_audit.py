"""The audit log through the real CLI against PostgreSQL: pause, resume, errors replay and
purge, retries now and fail record who (OS user, host), when, what and how many, on the CLI's
stderr and in the forwarding database's audit table, which `status` shows; an audit table that
cannot be written never fails the command."""

from __future__ import annotations

import getpass
import json
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from support import RETRY_TABLE, pg_rows, wait_until, write_config
from support.pairs import PgPair, pg_pair_config

pytestmark = pytest.mark.integration

AUDIT_TABLE = '"public"."sfbridge_audit"'


def test_operator_commands_are_recorded_and_status_shows_them(pg_pair: PgPair) -> None:
    steps = [
        (("pause", "sender", "--destination", "receiver", "--reason", "upgrade"), "pause", 1),
        (("resume", "sender", "--destination", "receiver"), "resume", 1),
        (("resume", "sender"), "resume", 0),  # was not paused
        (("errors", "purge", "--yes", "--reason", "unroutable"), None, 0),  # nothing: no record
        (("retries", "now", "--forwarder", "sender"), None, 0),
    ]
    for args, command, affected in steps:
        result = pair_cli(pg_pair, *args)
        if command is not None:
            assert f"ran '{command}' on " in result.stderr, result.stderr
            assert f": {affected} affected" in result.stderr
    status = pg_pair.status()
    commands = [(e["command"], e["target"], e["affected"]) for e in status["audit"]]
    assert commands == [
        ("resume", "forwarder 'sender'", 0),
        ("resume", "forwarder 'sender' destination 'receiver'", 1),
        ("pause", "forwarder 'sender' destination 'receiver' (reason: upgrade)", 1),
    ]
    newest = status["audit"][0]
    assert newest["operator"] == getpass.getuser() and newest["host"] == socket.gethostname()
    assert newest["database"] == "sender" and newest["at"].endswith("+00:00")
    shown = pg_pair.cli("status")
    assert shown.returncode == 1, shown.stderr  # no daemon runs here: status says so
    text = shown.stdout
    assert "recent operator commands (audit log" in text
    assert f"{getpass.getuser()}@{socket.gethostname()}  pause forwarder 'sender'" in text
    only = pair_cli(pg_pair, "status", "--audit", "--json")
    assert [e["command"] for e in json.loads(only.stdout)["audit"]] == [c for c, _, _ in commands]
    rows = pg_rows(pg_pair.sender, f"SELECT command, affected FROM {AUDIT_TABLE} ORDER BY seq")
    assert [(c, int(a)) for c, a in rows] == [("pause", 1), ("resume", 1), ("resume", 0)]


def test_errors_and_retries_commands_record_how_many_they_moved(
    pg_pair_factory: Callable[..., PgPair], tmp_path: Path
) -> None:
    pair = pg_pair_factory(create_queue=False, retries={"delay": "1h", "max_delay": "1h"})
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        pair.send(3)
        wait_until(lambda: pg_count_rows(pair, RETRY_TABLE) == 3, 30, "3 in retry storage")
        assert "'retries now'" in pair_cli(pair, "retries", "now").stderr
        failed = pair_cli(pair, "retries", "fail", "--yes", "--forwarder", "sender")
        assert "ran 'retries fail' on --forwarder sender" in failed.stderr, failed.stderr
        replayed = pair_cli(pair, "errors", "replay", "--reason", "failed-by-operator")
        assert "ran 'errors replay'" in replayed.stderr and ": 3 affected" in replayed.stderr
        wait_until(lambda: pg_count_rows(pair, RETRY_TABLE) == 3, 30, "back in retry storage")
        pair_cli(pair, "retries", "fail", "--yes")
        purged = pair_cli(pair, "errors", "purge", "--yes")
        assert "ran 'errors purge'" in purged.stderr and ": 3 affected" in purged.stderr
        assert daemon.process.poll() is None
    audit = json.loads(pair_cli(pair, "status", "--audit", "--json").stdout)["audit"]
    assert [(e["command"], e["affected"]) for e in reversed(audit)] == [
        ("retries now", 3),
        ("retries fail", 3),
        ("errors replay", 3),
        ("retries fail", 3),
        ("errors purge", 3),
    ]


def test_a_command_does_its_work_when_its_audit_row_cannot_be_written(
    pg_pair: PgPair, tmp_path: Path
) -> None:
    # The table is gone and may not be created at run time: the pause still happens.
    config = pg_pair_config(pg_pair.sender, pg_pair.receiver, install={"at_runtime": False})
    write_config(pg_pair.config, config)
    pg_rows(pg_pair.sender, f"DROP TABLE {AUDIT_TABLE}")
    result = pair_cli(pg_pair, "pause", "sender")
    assert result.returncode == 0, result.stderr
    assert "paused forwarder 'sender'" in result.stdout
    assert "could not record 'pause' in the audit log of database 'sender'" in result.stderr
    assert [p["destination_database"] for p in pg_pair.status()["forwarders"][0]["paused"]] == [
        None
    ]
    # Allowed again: the table is created on the next command, and it is recorded there.
    write_config(pg_pair.config, pg_pair_config(pg_pair.sender, pg_pair.receiver))
    assert pair_cli(pg_pair, "resume", "sender").returncode == 0
    assert [row[0] for row in pg_rows(pg_pair.sender, f"SELECT command FROM {AUDIT_TABLE}")] == [
        "resume"
    ]


def pair_cli(pair: PgPair, *args: str) -> subprocess.CompletedProcess[str]:
    result: subprocess.CompletedProcess[str] = pair.cli(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def pg_count_rows(pair: PgPair, table: str) -> int:
    return int(pg_rows(pair.sender, f"SELECT count(*) FROM {table}")[0][0])
