"""What `/readyz` and `/healthz` answer, from what the daemon knows: never ready while
something it covers does not forward, and the body names what."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from bridge.config.model import (
    BridgeConfig,
    DatabaseConfig,
    ForwarderConfig,
    MetricsConfig,
    RouteConfig,
)
from bridge.daemon.budget import reserved
from bridge.daemon.readiness import (
    LIVENESS_LIMIT,
    CheckState,
    Liveness,
    Seen,
    destination_databases,
    readiness,
)
from bridge.outages import DatabaseState

HEARTBEAT = 5.0
SINCE = datetime(2026, 11, 28, 9, 30)


def config() -> BridgeConfig:
    return BridgeConfig(
        databases={
            name: DatabaseConfig(name, "postgresql", "x") for name in ("sender", "receiver")
        },
        forwarders=(ForwarderConfig("orders", "sender", "q"),),
        routes=(RouteConfig("*", "receiver"),),
        metrics=MetricsConfig(listen="127.0.0.1:9464"),
    )


def seen(**changes: Any) -> Seen:
    """All well: started, workers alive, the heartbeat written, the receiver checked."""
    given: dict[str, Any] = {
        "started": True,
        "workers_alive": True,
        "failing": {},
        "heartbeats": {"sender": CheckState(passed=True)},
        "destination_checks": {"receiver": CheckState(passed=True)},
        "databases": {},
        "now": 100.0,
    }
    return Seen(**{**given, **changes})


def test_ready_when_every_forwarder_is_served_and_every_database_usable() -> None:
    ready, body = readiness(config(), seen(), HEARTBEAT)
    assert ready
    assert body == {
        "ready": True,
        "not_ready": [],
        "forwarders": {"orders": {"database": "sender", "served": True, "state": "forwarding"}},
        "databases": {
            "sender": {"state": "up", "heartbeat": "written"},
            "receiver": {"state": "up"},
        },
    }


def test_a_destination_the_tracker_has_down_is_named_with_its_error_inert() -> None:
    down = DatabaseState("receiver", "unreachable", SINCE, "connection refused\x1b[31m")
    ready, body = readiness(config(), seen(databases={"receiver": down}), HEARTBEAT)
    assert not ready
    assert body["databases"]["receiver"] == {
        "state": "unreachable",
        "since": "2026-11-28T09:30:00Z",
        "error": "connection refused\\x1b[31m",
    }
    assert body["not_ready"] == [
        "database 'receiver' cannot be reached: connection refused\\x1b[31m"
    ]


def test_read_only_and_refused_logins_are_not_ready_either() -> None:
    for state, words in (("read-only", "read-only"), ("auth-failed", "refuses the login")):
        tracked = {"receiver": DatabaseState("receiver", state, SINCE)}  # type: ignore[arg-type]
        ready, body = readiness(config(), seen(databases=tracked), HEARTBEAT)
        assert not ready and words in body["not_ready"][0]


def test_a_check_without_an_answer_for_half_a_heartbeat_is_not_ready() -> None:
    checks = {"receiver": CheckState(passed=True, running_since=100.0 - 2.4)}
    assert readiness(config(), seen(destination_checks=checks), HEARTBEAT)[0]
    checks = {"receiver": CheckState(passed=True, running_since=100.0 - 2.6)}
    ready, body = readiness(config(), seen(destination_checks=checks), HEARTBEAT)
    assert not ready
    assert body["databases"]["receiver"]["state"] == "no answer"
    assert "a check has had no answer for 3 s" in body["not_ready"][0]


def test_a_forwarder_whose_heartbeat_is_not_written_is_not_served() -> None:
    beats = {"sender": CheckState(passed=False, error="server closed the connection")}
    ready, body = readiness(config(), seen(heartbeats=beats), HEARTBEAT)
    assert not ready
    assert body["forwarders"]["orders"]["served"] is False
    assert body["databases"]["sender"]["state"] == "unreachable"
    assert any("forwarder 'orders' is not served" in p for p in body["not_ready"])
    # Before the first heartbeat, too.
    assert not readiness(config(), seen(heartbeats={}), HEARTBEAT)[0]
    # And while one has been waiting for an answer for too long.
    stuck = {"sender": CheckState(passed=True, running_since=90.0)}
    ready, body = readiness(config(), seen(heartbeats=stuck), HEARTBEAT)
    assert not ready and body["forwarders"]["orders"]["served"] is False


def test_a_failing_forwarder_is_not_ready_and_a_paused_one_is() -> None:
    ready, body = readiness(config(), seen(failing={"orders": "table is locked"}), HEARTBEAT)
    assert not ready
    assert body["forwarders"]["orders"]["state"] == "failing"
    assert body["not_ready"] == ["forwarder 'orders' cannot forward: table is locked"]
    ready, body = readiness(config(), seen(paused=["orders"]), HEARTBEAT)
    assert ready and body["forwarders"]["orders"]["state"] == "paused"


def test_starting_reloading_or_hung_workers_are_not_ready() -> None:
    assert not readiness(config(), seen(started=False), HEARTBEAT)[0]
    ready, body = readiness(config(), seen(workers_alive=False), HEARTBEAT)
    assert not ready and "hung" in body["not_ready"][0]


def test_liveness_is_the_main_loop_finding_the_workers_alive_lately() -> None:
    now = [0.0]
    liveness = Liveness(clock=lambda: now[0])
    assert liveness.check()[0] is False  # nothing yet: starting
    liveness.fed()
    now[0] = LIVENESS_LIMIT
    assert liveness.check() == (
        True,
        {"live": True, "workers_seen_alive_seconds_ago": LIVENESS_LIMIT},
    )
    now[0] = LIVENESS_LIMIT + 0.5
    live, body = liveness.check()
    assert not live and "hung" in body["reason"]


def test_destinations_are_checked_on_a_connection_of_their_own() -> None:
    assert destination_databases(config()) == ["receiver"]
    assert reserved(config(), "receiver") == 2  # upkeep and the readiness check
    # upkeep, the sampler, the watcher, its push listener and the heartbeat
    assert reserved(config(), "sender") == 5


def test_a_destination_not_checked_yet_is_not_ready() -> None:
    ready, body = readiness(config(), seen(destination_checks={}), HEARTBEAT)
    assert not ready and body["databases"]["receiver"] == {"state": "not checked yet"}
    assert body["not_ready"] == ["database 'receiver' is not checked yet"]
