"""ServiceControl heartbeats and custom checks (bridge/daemon/servicecontrol), read from the
queue table as ServiceControl reads it: the PostgreSQL transport's destructive receive, the
type from `NServiceBus.EnclosedMessageTypes`, the JSON body by the plugins' property names,
their dates and GUIDs in System.Text.Json's forms."""

from __future__ import annotations

import itertools
import json
import re
import socket
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from support import pg_connect, pg_create_queue, pg_nsb_receive_all, wait_until
from support.pairs import PgPair

pytestmark = pytest.mark.integration

SC_QUEUE = '"public"."Particular.ServiceControl"'
HEARTBEAT = "ServiceControl.Plugin.Heartbeat.Messages.EndpointHeartbeat"
STARTUP = "ServiceControl.Plugin.Heartbeat.Messages.RegisterEndpointStartup"
CHECK = "ServiceControl.Plugin.CustomChecks.Messages.ReportCustomCheckResult"
JSON_DATE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,7})?Z")
GUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
BODY_FIELDS = {
    HEARTBEAT: ["ExecutedAt", "EndpointName", "HostId", "Host"],
    STARTUP: ["HostId", "Endpoint", "StartedAt", "HostProperties", "HostDisplayName", "Host"],
    CHECK: [
        "HostId",
        "CustomCheckId",
        "Category",
        "HasFailed",
        "FailureReason",
        "ReportedAt",
        "EndpointName",
        "Host",
    ],
}


def parse_json_date(text: str) -> datetime:
    assert JSON_DATE.fullmatch(text), text
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class ServiceControlQueue:
    """Reads ServiceControl's input queue as ServiceControl does, checking every message's
    headers and body as its deserializer and handlers would need them."""

    def __init__(self, connection_string: str) -> None:
        self.connection_string = connection_string
        self.messages: list[dict[str, Any]] = []  # type, body, expires of each, in order

    def receive(self) -> list[dict[str, Any]]:
        """Receive what is there; each message checked, then kept in `messages`."""
        new = []
        for row in pg_nsb_receive_all(self.connection_string, SC_QUEUE):
            headers = row["headers"]
            message_type = headers["NServiceBus.EnclosedMessageTypes"]
            assert headers == {
                "NServiceBus.EnclosedMessageTypes": message_type,
                "NServiceBus.ContentType": "application/json",
                "NServiceBus.MessageIntent": "Send",
            }
            body = json.loads(row["body"].decode("utf-8"))
            assert list(body) == BODY_FIELDS[message_type], body
            assert GUID.fullmatch(body["HostId"]) and uuid.UUID(body["HostId"]).int != 0
            assert body["Host"] == socket.gethostname().split(".", 1)[0]
            assert row["expired"] == 0 and row["expires"] is not None
            new.append({"type": message_type, "body": body, "expires": row["expires"]})
        self.messages += new
        return new

    def of_type(self, message_type: str) -> list[dict[str, Any]]:
        return [m["body"] for m in self.messages if m["type"] == message_type]

    def check_results(self, check_id: str) -> list[dict[str, Any]]:
        return [body for body in self.of_type(CHECK) if body["CustomCheckId"] == check_id]

    def wait_for(self, found: Callable[[], bool], timeout: float, what: str) -> None:
        def received() -> bool:
            self.receive()
            return found()

        wait_until(received, timeout, what)


def database_name(connection_string: str) -> str:
    found = re.search(r"Database=([^;]+);", connection_string)
    assert found is not None
    return found.group(1)


def admin_execute(pair: PgPair, statement: str) -> None:
    import pyodbc

    prefix = re.sub(r"Database=[^;]+;", "Database=postgres;", pair.sender)
    with pyodbc.connect(prefix, autocommit=True, timeout=5) as admin:
        admin.execute(statement)


def servicecontrol_pair(
    pg_pair_factory: Callable[..., PgPair], *, check_interval: str = "1s"
) -> PgPair:
    """A pair whose bridge reports to a ServiceControl queue in the forwarding database, so
    that the destination can go away alone."""
    return pg_pair_factory(
        servicecontrol={
            "database": "sender",
            "endpoint": "sfbridge-test",
            "heartbeat_interval": "1s",
            "check_interval": check_interval,
        }
    )


def test_servicecontrol_sees_a_startup_then_heartbeats_every_interval_and_passing_checks(
    pg_pair_factory: Callable[..., PgPair], start_daemon: Callable[..., Any]
) -> None:
    pair = servicecontrol_pair(pg_pair_factory)
    pg_create_queue(pair.sender, SC_QUEUE)
    queue = ServiceControlQueue(pair.sender)
    started = datetime.now(UTC)
    daemon = start_daemon(pair.config)

    queue.wait_for(lambda: len(queue.of_type(HEARTBEAT)) >= 5, 30, "five heartbeats")
    [startup] = queue.of_type(STARTUP)
    assert startup["Endpoint"] == "sfbridge-test"
    assert startup["HostDisplayName"] == startup["Host"]
    assert abs(parse_json_date(startup["StartedAt"]) - started) < timedelta(seconds=10)
    beats = queue.of_type(HEARTBEAT)
    assert {b["EndpointName"] for b in beats} == {"sfbridge-test"}
    assert {b["HostId"] for b in beats} == {startup["HostId"]}
    times = [parse_json_date(b["ExecutedAt"]) for b in beats]
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(times)]
    assert all(0.5 <= gap <= 2.0 for gap in gaps), gaps
    # Time to be received: four heartbeat intervals, as the plugin sets it.
    heartbeat_rows = [m for m in queue.messages if m["type"] == HEARTBEAT]
    for row, executed in zip(heartbeat_rows, times, strict=True):
        ttl = row["expires"] - executed.replace(tzinfo=None)
        assert timedelta(seconds=3) <= ttl <= timedelta(seconds=5), ttl

    checks = {
        "sfbridge destination receiver",
        "sfbridge forwarder sender",
        "sfbridge error queue sender",
    }
    queue.wait_for(lambda: all(queue.check_results(c) for c in checks), 30, "every check")
    for check_id in checks:
        for result in queue.check_results(check_id):
            assert (result["Category"], result["HasFailed"], result["FailureReason"]) == (
                "sfbridge",
                False,
                None,
            )
            assert result["EndpointName"] == "sfbridge-test"
            assert result["HostId"] == startup["HostId"]
            parse_json_date(result["ReportedAt"])
    assert daemon.stop() == 0, daemon.output()


def test_a_destination_check_fails_within_an_interval_of_the_database_going_and_passes_again(
    pg_pair_factory: Callable[..., PgPair], start_daemon: Callable[..., Any]
) -> None:
    interval = 2.0
    pair = servicecontrol_pair(pg_pair_factory, check_interval="2s")
    pg_create_queue(pair.sender, SC_QUEUE)
    queue = ServiceControlQueue(pair.sender)
    daemon = start_daemon(pair.config)
    check = "sfbridge destination receiver"
    queue.wait_for(lambda: bool(queue.check_results(check)), 30, "the destination check")
    assert not queue.check_results(check)[-1]["HasFailed"]

    receiver = database_name(pair.receiver)
    admin_execute(pair, f'DROP DATABASE "{receiver}" WITH (FORCE)')
    dropped = datetime.now(UTC)
    queue.wait_for(lambda: queue.check_results(check)[-1]["HasFailed"], 30, "a failed check")
    failed = queue.check_results(check)[-1]
    assert parse_json_date(failed["ReportedAt"]) - dropped <= timedelta(seconds=interval + 1.5)
    assert failed["FailureReason"].startswith("database 'receiver' cannot be reached: ")
    assert "Pwd" not in failed["FailureReason"]

    admin_execute(pair, f'CREATE DATABASE "{receiver}"')
    back = datetime.now(UTC)
    queue.wait_for(lambda: not queue.check_results(check)[-1]["HasFailed"], 30, "a passed check")
    passed = queue.check_results(check)[-1]
    assert parse_json_date(passed["ReportedAt"]) - back <= timedelta(seconds=interval + 1.5)
    assert passed["FailureReason"] is None
    assert daemon.stop() == 0, daemon.output()


def test_a_missing_servicecontrol_queue_leaves_forwarding_untouched_and_is_told_once(
    pg_pair_factory: Callable[..., PgPair], start_daemon: Callable[..., Any]
) -> None:
    pair = servicecontrol_pair(pg_pair_factory)
    daemon = start_daemon(pair.config)
    daemon.wait_for_output("ServiceControl: cannot send heartbeats")
    ids = pair.send(50)
    wait_until(lambda: pair.delivered() == 50, 30, "every message delivered")
    assert set(pair.received()) == ids

    # Once the queue is there, heartbeats arrive again, and the recovery is said.
    pg_create_queue(pair.sender, SC_QUEUE)
    queue = ServiceControlQueue(pair.sender)
    queue.wait_for(lambda: len(queue.of_type(HEARTBEAT)) >= 2, 30, "heartbeats")
    daemon.wait_for_output("ServiceControl: sending heartbeats to queue")
    assert daemon.output().count("ServiceControl: cannot send heartbeats") == 1
    assert daemon.stop() == 0, daemon.output()


def test_a_locked_servicecontrol_queue_leaves_forwarding_untouched_and_stopping_prompt(
    pg_pair_factory: Callable[..., PgPair], start_daemon: Callable[..., Any]
) -> None:
    pair = servicecontrol_pair(pg_pair_factory)
    pg_create_queue(pair.sender, SC_QUEUE)
    queue = ServiceControlQueue(pair.sender)
    daemon = start_daemon(pair.config)
    queue.wait_for(lambda: bool(queue.of_type(HEARTBEAT)), 30, "a first heartbeat")

    with pg_connect(pair.sender) as locker:
        locker.execute(f"LOCK TABLE {SC_QUEUE} IN ACCESS EXCLUSIVE MODE")
        daemon.wait_for_output("ServiceControl: cannot send heartbeats")
        ids = pair.send(50)
        wait_until(lambda: pair.delivered() == 50, 30, "every message delivered")
        assert set(pair.received()) == ids
        # A heartbeat is waiting on the lock right now, or will be within an interval.
        stopping = time.monotonic()
        assert daemon.stop() == 0, daemon.output()
        assert time.monotonic() - stopping < 6.0
        locker.rollback()
