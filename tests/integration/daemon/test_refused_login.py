"""A destination whose login the server refuses is AUTH FAILED, not an outage: the daemon logs in
there rarely (counted by a TCP relay in front of PostgreSQL: each connection is one login
attempt), its messages wait in retry storage, the other destination's keep flowing, and a
reload with the login fixed tries again at once.

The test server trusts every login on loopback, so the refused login is a role that does not
exist (SQLSTATE 28000, the class of a wrong password's 28P01).
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import (
    ERROR_QUEUE,
    RETRY_TABLE,
    SAMPLES_RECEIVER,
    SENDER_FORWARD,
    DaemonProcess,
    TcpRelay,
    hold_for,
    pg_count,
    pg_create_queue,
    pg_pair_config,
    pg_send,
    sfbridge,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration

LOCKED_QUEUE = '"public"."Samples.Locked"'
REFUSED_LOGIN = "sfbridge_no_such_login"
SECRET = "Tr0ub4dor-not-in-any-log"


@pytest.fixture
def relay(postgres: Any) -> Iterator[TcpRelay]:
    relay = TcpRelay.before(postgres.prefix)
    yield relay
    relay.close()


def _config(sender: str, receiver: str, locked: str) -> dict[str, Any]:
    config = pg_pair_config(sender, receiver, retries={"delay": "2s", "during_outage": "wait"})
    config["databases"]["locked"] = {
        "dialect": "postgresql",
        "connection": locked,
        "connect_timeout": "2s",
    }
    config["routes"] = [
        {"match": "Samples.Locked*", "database": "locked"},
        {"match": "*", "database": "receiver"},
    ]
    return config


def _login(connection_string: str, login: str) -> str:
    return re.sub(r"(?i)Uid=[^;]*;", f"Uid={login};Pwd={SECRET};", connection_string)


def _status(config: Path) -> tuple[int, dict[str, Any], str]:
    as_json = sfbridge("-c", str(config), "status", "--json")
    text = sfbridge("-c", str(config), "status")
    return as_json.returncode, json.loads(as_json.stdout), text.stdout


def test_a_refused_login_waits_in_retry_storage_and_is_tried_rarely_until_a_reload(
    tmp_path: Path, new_pg_database: Any, relay: TcpRelay
) -> None:
    sender, receiver, locked_db = new_pg_database(), new_pg_database(), new_pg_database()
    locked = relay.connection_string(locked_db)
    path = write_config(tmp_path / "sfbridge.yaml", _config(sender, receiver, locked))
    installed = sfbridge("-c", str(path), "install")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    pg_create_queue(receiver, SAMPLES_RECEIVER)
    pg_create_queue(locked_db, LOCKED_QUEUE)
    # The operator changed the password on one side only: the server refuses the login.
    refused = _config(sender, receiver, _login(locked, REFUSED_LOGIN))
    write_config(tmp_path / "sfbridge.yaml", refused)

    with DaemonProcess(path, tmp_path / "daemon.log") as daemon:
        pg_send(sender, SENDER_FORWARD, 20, destination=LOCKED_QUEUE)

        def auth_failed() -> bool:
            code, status, text = _status(path)
            return status["auth_failed"] == ["locked"] and "AUTH FAILED" in text and code == 1

        wait_until(auth_failed, 60, "status to say AUTH FAILED for 'locked'")
        _, status, text = _status(path)
        [entry] = [d for d in status["destinations"] if d["database"] == "locked"]
        assert entry["state"] == "auth-failed"
        wait_until(lambda: pg_count(sender, RETRY_TABLE) == 20, 30, "20 in retry storage")

        # For 20 s, traffic to the healthy destination flows while the refused login is
        # tried at most three times (doubling from the 2 s probe interval: an outage would
        # be probed ten times, and every worker would try without the state).
        attempts_before = relay.accepted
        delivered = 0

        def receiver_flows_and_locked_is_left_alone() -> None:
            nonlocal delivered
            assert relay.accepted - attempts_before <= 3, relay.accepted - attempts_before
            if pg_count(receiver, SAMPLES_RECEIVER) == delivered:
                pg_send(sender, SENDER_FORWARD, 5)
                delivered += 5
                wait_until(
                    lambda: pg_count(receiver, SAMPLES_RECEIVER) == delivered, 10, "delivery"
                )

        hold_for(20, receiver_flows_and_locked_is_left_alone)
        assert delivered >= 10
        assert pg_count(sender, RETRY_TABLE) == 20
        assert pg_count(sender, ERROR_QUEUE) == 0
        assert pg_count(locked_db, LOCKED_QUEUE) == 0

        # Right after an attempt the next is at least 16 s away: a reload with the login
        # fixed tries at once, long before it.
        attempts = relay.accepted
        wait_until(lambda: relay.accepted > attempts, 60, "the next login attempt")
        write_config(tmp_path / "sfbridge.yaml", _config(sender, receiver, locked))
        daemon.process.send_signal(signal.SIGHUP)
        wait_until(lambda: pg_count(locked_db, LOCKED_QUEUE) == 20, 12, "delivery after reload")
        assert daemon.stop() == 0, daemon.output()

    log = daemon.output()
    assert log.count(f"refused the login '{REFUSED_LOGIN}'") == 1, log
    assert SECRET not in log
    assert SECRET not in text
