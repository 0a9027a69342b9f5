"""What `status` makes of the daemons tables (bridge.commands.status_daemons): which daemon
serves which forwarder, the exit code a probe trusts, and the lines a person reads."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from bridge.commands.daemons.forget import Forget
from bridge.commands.status_daemons import (
    DaemonsRead,
    daemon_entries,
    exit_code,
    render_daemons,
    render_served,
    served_by,
)
from bridge.exceptions import ExitCode
from bridge.storage.daemons import DaemonRecord, ServedForwarder

NOW = datetime(2026, 11, 26, 10, 0, 0)
ORDERS = ServedForwarder("orders", '"public"."orders"')
BILLS = ServedForwarder("bills", '"public"."bills"')


def record(
    daemon: str,
    seconds_ago: float,
    forwarders: tuple[ServedForwarder, ...] | None,
    state: str = "running",
    fingerprint: str | None = "aaaa",
) -> DaemonRecord:
    return DaemonRecord(
        daemon=daemon,
        host=daemon.split(":")[0],
        pid=int(daemon.split(":")[1]),
        started_at=NOW - timedelta(hours=30),
        heartbeat_at=NOW - timedelta(seconds=seconds_ago),
        heartbeat_seconds=5.0,
        state=state,  # type: ignore[arg-type]
        stopped_at=NOW - timedelta(seconds=seconds_ago) if state == "stopped" else None,
        config_fingerprint=fingerprint,
        forwarders=forwarders,
    )


def test_only_a_running_daemon_that_serves_the_forwarder_counts() -> None:
    read = DaemonsRead(
        records={
            "sender": [
                record("a:1", 1, (BILLS,), fingerprint="bbbb"),  # another configuration
                record("a:2", 60, (ORDERS,)),  # missing
                record("a:3", 1, (ORDERS,), "stopped"),  # stopped
            ]
        }
    )
    assert served_by(read, "sender", ORDERS, NOW) == []
    assert served_by(read, "sender", BILLS, NOW) == ["a:1"]
    # The same name on another queue is another configuration's forwarder.
    assert served_by(read, "sender", ServedForwarder("bills", '"x"'), NOW) == []
    # An older daemon that recorded nothing serves all of its database.
    read.records["sender"].append(record("b:1", 1, None, fingerprint=None))
    assert served_by(read, "sender", ORDERS, NOW) == ["b:1"]
    # A database whose daemons cannot be read: unknown, neither served nor not.
    assert served_by(DaemonsRead(unreadable={"sender": "down"}), "sender", ORDERS, NOW) is None


def status(forwarders: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    return {"daemons": [], "forwarders": forwarders, "auth_failed": [], **top}


def test_the_exit_code_is_a_health_check() -> None:
    served = {"forwarder": "orders", "served": True, "served_by": ["a:1"]}
    unserved = {"forwarder": "bills", "served": False, "served_by": []}
    unknown = {"forwarder": "orders", "served": None, "served_by": None, "error": "down"}
    assert exit_code(status([served])) == ExitCode.OK
    assert exit_code(status([served, unserved])) == ExitCode.FAILED
    assert exit_code(status([served], auth_failed=["receiver"])) == ExitCode.FAILED
    assert exit_code(status([unknown])) == ExitCode.UNAVAILABLE
    unreadable = [{"database": "sender", "error": "down"}]
    assert exit_code(status([served], daemons_unreadable=unreadable)) == ExitCode.UNAVAILABLE


def test_a_database_that_cannot_be_read_says_so_and_not_start_it() -> None:
    unknown = {"forwarder": "orders", "served": None, "served_by": None}
    text = render_daemons(
        status(
            [unknown],
            daemons_unreadable=[{"database": "sender", "error": "connection refused"}],
        )
    )
    assert text[0] == "daemons: UNKNOWN - the forwarding database(s) cannot be read (below)"
    assert "CANNOT READ forwarding database 'sender': connection refused" in text[1]
    assert not any("start it" in line for line in text)
    assert "UNKNOWN" in render_served(unknown)[0]


def test_the_daemons_section_names_the_forwarders_nobody_serves() -> None:
    read = DaemonsRead(
        records={
            "sender": [
                record("a:1", 1, (BILLS,), fingerprint="bbbb"),
                record("old:9", 2 * 86400, (ORDERS,)),  # stale: left out, counted
            ]
        }
    )
    entries, stale = daemon_entries(read, NOW, "aaaa")
    assert [e["daemon"] for e in entries] == ["a:1"] and stale == 1
    unserved = {"forwarder": "orders", "served": False, "served_by": []}
    text = render_daemons(status([unserved], daemons=entries, stale_daemons=stale))
    assert text[0] == "daemons: 1 running; NONE serves forwarder(s) orders"
    assert "serves bills (another configuration, bbbb)" in text[1]
    assert "1 stale entr(y/ies)" in text[2] and "daemons forget --stale" in text[2]
    assert render_served(unserved)[0].startswith("  NOT SERVED")


def test_forget_never_selects_a_running_daemon() -> None:
    running, missing = record("a:1", 1, None), record("a:2", 60, None)
    stopped, stale = record("b:1", 60, None, "stopped"), record("b:2", 2 * 86400, None)
    assert not Forget(daemon="a:1").selects(running, NOW)
    assert Forget(daemon="a:2").selects(missing, NOW)
    assert [Forget(host="a").selects(r, NOW) for r in (running, missing)] == [False, True]
    assert [Forget(stale=True).selects(r, NOW) for r in (running, missing, stopped, stale)] == [
        False,
        False,
        False,
        True,
    ]
