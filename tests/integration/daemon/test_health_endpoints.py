"""`/healthz` and `/readyz` on the metrics listener of a real daemon: ready while everything it
covers forwards, not ready within a heartbeat of a destination going away (dropped, or silent
behind a relay) with a body that names it, ready again once it is back."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support import DaemonProcess, TcpRelay, pg_create_queue, wait_until
from support.faults import database_name
from support.metrics import free_port, scrape, value
from support.pairs import PgPair, make_pg_pair

pytestmark = pytest.mark.integration

HEARTBEAT = 1.0


def get(port: int, path: str) -> tuple[int, dict[str, Any] | str]:
    """(status, the body: parsed JSON for the checks, else text); (0, "") while nothing
    listens yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read().decode()
    except urllib.error.URLError:
        return 0, ""
    if path in ("/healthz", "/readyz"):
        return status, json.loads(text)
    return status, text


def health_pair(factory: Callable[..., PgPair], port: int, **options: Any) -> PgPair:
    return factory(
        metrics={"listen": f"127.0.0.1:{port}"},
        daemon={"heartbeat": f"{HEARTBEAT:g}s"},
        **options,
    )


def wait_ready(port: int, timeout: float = 30) -> dict[str, Any]:
    wait_until(lambda: get(port, "/readyz")[0] == 200, timeout, "/readyz to answer 200")
    status, body = get(port, "/readyz")
    assert status == 200 and isinstance(body, dict)
    return body


def seconds_until_unready(port: int, timeout: float = 30) -> tuple[float, dict[str, Any]]:
    """How long until /readyz answers 503, and its body then."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        status, body = get(port, "/readyz")
        if status == 503:
            assert isinstance(body, dict)
            return time.monotonic() - began, body
        time.sleep(0.1)
    raise AssertionError(f"/readyz still 200 after {timeout:.0f} s")


def test_ready_then_a_dropped_destination_is_named_within_a_heartbeat_then_ready_again(
    pg_pair_factory: Callable[..., PgPair],
    start_daemon: Callable[..., DaemonProcess],
    postgres: Any,
) -> None:
    port = free_port()
    pair = health_pair(pg_pair_factory, port)
    daemon = start_daemon(pair.config)
    body = wait_ready(port)
    assert body["ready"] is True and body["not_ready"] == []
    assert body["forwarders"]["sender"] == {
        "database": "sender",
        "served": True,
        "state": "forwarding",
    }
    assert body["databases"]["receiver"] == {"state": "up"}
    status, live = get(port, "/healthz")
    assert status == 200 and isinstance(live, dict) and live["live"] is True
    assert get(port, "/nothing-here")[0] == 404
    assert value(scrape(port), "sfbridge_ready") == 1
    pair.send(3)
    wait_until(lambda: pair.delivered() == 3, 30, "the deliveries")

    # No message is on its way: only the daemon's own check can see the receiver go.
    receiver = database_name(pair.receiver)
    with postgres.admin() as admin:
        admin.execute(f'DROP DATABASE "{receiver}" WITH (FORCE)')
    took, body = seconds_until_unready(port)
    assert took < HEARTBEAT + 1.5, f"/readyz took {took:.1f} s to see the receiver gone"
    assert body["ready"] is False
    assert body["databases"]["receiver"]["state"] == "unreachable"
    assert any("database 'receiver'" in problem for problem in body["not_ready"]), body
    assert body["forwarders"]["sender"]["served"] is True  # the forwarder itself still runs
    samples = scrape(port)
    assert value(samples, "sfbridge_ready") == 0
    assert value(samples, "sfbridge_database_up", database="receiver") == 0
    assert get(port, "/healthz")[0] == 200  # alive: only not ready

    with postgres.admin() as admin:
        admin.execute(f'CREATE DATABASE "{receiver}"')
    pg_create_queue(pair.receiver, pair.queue)
    body = wait_ready(port)
    assert body["databases"]["receiver"] == {"state": "up"}
    assert daemon.stop() == 0, daemon.output()


@pytest.fixture
def relay(postgres: Any) -> Iterator[TcpRelay]:
    relay = TcpRelay.before(postgres.connection_string("postgres"))
    yield relay
    relay.close()


def test_a_silent_destination_is_not_ready_without_waiting_for_the_query_timeout(
    tmp_path: Any,
    new_pg_database: Callable[[], str],
    relay: TcpRelay,
    start_daemon: Callable[..., DaemonProcess],
) -> None:
    port = free_port()
    pair = make_pg_pair(
        tmp_path,
        new_pg_database(),
        relay.connection_string(new_pg_database()),
        metrics={"listen": f"127.0.0.1:{port}"},
        daemon={"heartbeat": f"{HEARTBEAT:g}s"},
        receiver_database={"query_timeout": "30s"},
    )
    daemon = start_daemon(pair.config)
    wait_ready(port)
    relay.silence()
    took, body = seconds_until_unready(port)
    # A check counts as unanswered after half a heartbeat (at least 1 s), one heartbeat after
    # the last: well before the 30 s query timeout.
    assert took < 2 * HEARTBEAT + 1.5, f"/readyz took {took:.1f} s to see the receiver silent"
    receiver = body["databases"]["receiver"]
    assert receiver["state"] == "no answer" and "no answer" in receiver["error"], body
    relay.restore()
    wait_ready(port, timeout=60)
    # A stop while a check waits on a silent destination leaves that check behind, in time.
    relay.silence()
    seconds_until_unready(port)
    stopping = time.monotonic()
    assert daemon.stop() == 0, daemon.output()
    assert time.monotonic() - stopping < 20
