"""The same end-to-end scenarios for a forwarding queue in dialect X delivering to a destination
in dialect Y, for every pairing that matters.

Messages are written with each transport's own send and read with its own receive
(tests/support/, independent of bridge/dialects), so what is checked is wire compatibility.
PostgreSQL and SQLite always run; SQL Server runs when SFBRIDGE_TEST_SQLSERVER holds an ODBC
connection string for a login that may create databases (the tests create and drop their own).
The bridge runs in-process (BatchForwarder), batch by batch, so every scenario is fast and
deterministic; the daemon around it is tested elsewhere.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support import (
    NO_SQLSERVER,
    CommitFailsOnce,
    NsbEndpoint,
    PostgresEndpoint,
    SqliteEndpoint,
    SqlServerEndpoint,
    SqlServerTestServer,
    nsb_message_headers,
    wait_until,
    write_config,
)

from bridge.commands.install import run_install
from bridge.config import load_config
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.exceptions import ConnectionLost
from bridge.forwarding.spine import BatchForwarder
from bridge.processing_host import host_id_for, machine_name

pytestmark = pytest.mark.integration

FORWARD = "Samples.Sender.Forward"
RECEIVER = "Samples.Receiver"
BATCH_SIZE = 50

PAIRS = [
    ("postgresql", "postgresql"),
    ("sqlite", "sqlite"),
    ("sqlserver", "sqlserver"),
    ("sqlite", "postgresql"),
    ("postgresql", "sqlite"),
    ("sqlserver", "postgresql"),
    ("postgresql", "sqlserver"),
    ("sqlite", "sqlserver"),
    ("sqlserver", "sqlite"),
    # PostgreSQL through psqlODBC (`driver: odbc`) instead of the default psycopg.
    ("postgresql-odbc", "postgresql-odbc"),
    ("postgresql", "postgresql-odbc"),
    ("postgresql-odbc", "sqlite"),
    ("sqlite", "postgresql-odbc"),
]


EndpointFactory = Callable[[str, str], NsbEndpoint]


@pytest.fixture
def new_endpoint(
    tmp_path: Path, new_pg_database: Any, sqlserver_server: SqlServerTestServer | None
) -> EndpointFactory:
    """A fresh, empty database of `dialect` as an NServiceBus endpoint sees it."""

    def create(dialect: str, name: str) -> NsbEndpoint:
        if dialect in ("postgresql", "postgresql-odbc"):
            driver = "odbc" if dialect == "postgresql-odbc" else None
            return PostgresEndpoint(new_pg_database(), driver=driver)
        if dialect == "sqlite":
            return SqliteEndpoint(tmp_path / f"{name}.db")
        if sqlserver_server is None:
            pytest.skip(NO_SQLSERVER)
        catalog = sqlserver_server.create_database()
        return SqlServerEndpoint(sqlserver_server.connection_string(catalog), catalog)

    return create


@dataclass
class Bridge:
    config: BridgeConfig
    source: NsbEndpoint
    destination: NsbEndpoint
    destination_address: str

    def forward_all(self, source: str = "queue", crash_once: bool = False) -> Counter[str]:
        """Forward batches until one comes back empty (so that every source also claims from
        an empty table: psqlODBC then names no columns); the counts."""
        connections = Connections(self.config.databases)
        forwarder = BatchForwarder(self.config, self.config.forwarders[0], connections)
        if crash_once:
            connections._open[("source", "")] = CommitFailsOnce(connections.get("source"))
        totals: Counter[str] = Counter()
        try:
            while True:
                report = forwarder.forward_batch("retry" if source == "retry" else "queue")
                totals.update(report.counts)
                if report.claimed == 0:
                    return totals
        finally:
            connections.close()


def header_address(source: NsbEndpoint, destination: NsbEndpoint, table: str) -> str:
    """The destination as the sending endpoint writes it: in the forwarding database's grammar
    (between SQL Server databases, the canonical form with the destination's catalog)."""
    if isinstance(source, SqlServerEndpoint):
        if isinstance(destination, SqlServerEndpoint):
            return destination.address(table)
        return f"{table}@[dbo]"
    return source.address(table)


def make_bridge(
    tmp_path: Path,
    source: NsbEndpoint,
    destination: NsbEndpoint | None,
    *,
    create_destination_queue: bool = True,
    destination_address: str | None = None,
) -> Bridge:
    """Config, `sfbridge install`, and the receiving endpoint's queue. Without `destination`,
    messages are routed to the forwarding database itself."""
    databases = {"source": source.database_entry()}
    if destination is not None:
        databases["destination"] = destination.database_entry()
    raw = {
        "databases": databases,
        "forwarders": [
            {
                "name": "sender",
                "database": "source",
                "queue": source.address(FORWARD),
                "batch_size": BATCH_SIZE,
                "concurrency": 1,
            }
        ],
        "routes": [{"match": "Samples.*", "database": "destination" if destination else "source"}],
        "retries": {"delay": "100ms", "immediate_attempts": 1},
    }
    config, problems = load_config(write_config(tmp_path / "sfbridge.yaml", raw))
    assert config is not None, [str(p) for p in problems]
    run_install(config)
    target = destination or source
    if create_destination_queue:
        target.create_queue(RECEIVER)
    address = destination_address or header_address(source, target, RECEIVER)
    return Bridge(config, source, target, address)


def new_messages(
    bridge: Bridge, count: int, *, ttbr: Callable[[int], int | None] = lambda n: None
) -> dict[str, tuple[dict[str, str | None], bytes | None, int | None]]:
    """`count` messages by NServiceBus.MessageId: headers, body, time to be received (ms)."""
    generator = random.Random(count)
    messages = {}
    for number in range(count):
        extra: dict[str, str | None] = {
            "Zürich.Größe": 'äöü 日本語 🚀 "quoted" \\ / \n\t',
            "NServiceBus.NullValue": None,
        }
        if number % 50 == 7:
            extra["Big"] = "ü" * 5000  # beyond nvarchar(4000): nvarchar(max) must take it
        headers = nsb_message_headers(bridge.destination_address, **extra)
        body: bytes | None = bytes(generator.randrange(256) for _ in range(number * 37 % 3000))
        if number == 3:
            body = None
        elif number == 5:
            body = generator.randbytes(100_000)
        messages[str(headers["NServiceBus.MessageId"])] = (headers, body, ttbr(number))
    return messages


def send(bridge: Bridge, messages: dict[str, Any]) -> list[Any]:
    return bridge.source.send(FORWARD, list(messages.values()))


def tolerance(bridge: Bridge) -> timedelta:
    # SQL Server's datetime has 1/300 s ticks; the others keep what they are given.
    dialects = {bridge.source.dialect, bridge.destination.dialect}
    return timedelta(milliseconds=4) if "sqlserver" in dialects else timedelta(0)


def _pair_id(pair: tuple[str, str]) -> str:
    return f"{pair[0]}->{pair[1]}"


@pytest.fixture(params=PAIRS, ids=[_pair_id(pair) for pair in PAIRS])
def pair(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def bridge(tmp_path: Path, pair: tuple[str, str], new_endpoint: EndpointFactory) -> Bridge:
    return make_bridge(tmp_path, new_endpoint(pair[0], "sender"), new_endpoint(pair[1], "receiver"))


# --------------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------------


def test_messages_arrive_exactly_once_with_headers_bodies_and_expires_intact(
    bridge: Bridge,
) -> None:
    messages = new_messages(bridge, 200, ttbr=lambda n: 3_600_000 if n % 3 == 0 else None)
    send(bridge, messages)
    expires_at_source = bridge.source.expires_by_message_id(FORWARD)

    counts = bridge.forward_all()

    assert counts == Counter({"delivered": 200})
    received = bridge.destination.receive_all(RECEIVER)
    ids = Counter(m["headers"]["NServiceBus.MessageId"] for m in received)
    assert set(ids) == set(messages) and max(ids.values()) == 1
    for message in received:
        message_id = message["headers"]["NServiceBus.MessageId"]
        headers, body, ttbr = messages[message_id]
        expected = {k: v for k, v in headers.items() if k != "$.store-and-forward.destination"}
        assert message["headers"] == expected
        assert message["body"] == body
        assert not message["expired"]
        sent_expires = expires_at_source[message_id]
        if ttbr is None:
            assert sent_expires is None and message["expires"] is None
        else:
            assert sent_expires is not None and message["expires"] is not None
            assert abs(message["expires"] - sent_expires) <= tolerance(bridge)
    assert bridge.source.receive_all(FORWARD) == []
    assert bridge.source.receive_all("error") == []


def test_poison_messages_go_to_the_error_queue_as_they_are(bridge: Bridge) -> None:
    good = new_messages(bridge, 3)
    send(bridge, good)
    poison = [
        ("this is not JSON {", b"\x00\x01body", None),
        ('{"NServiceBus.MessageId": 42}', None, 1),  # expired too: poison is checked first
        ("[1, 2]", b"", None),
    ]
    poison_ids = bridge.source.send(FORWARD, poison)  # type: ignore[arg-type]
    wait_until(lambda: bridge.source.expired_count(FORWARD) == 1, 10, "the 1 ms message to expire")

    counts = bridge.forward_all()

    assert counts == Counter({"delivered": 3, "sent-to-error-queue": 3, "poison-to-error-queue": 3})
    in_error = {m["id"]: m for m in bridge.source.receive_all("error")}
    assert set(in_error) == set(poison_ids)
    for row_id, (headers_text, body, _) in zip(poison_ids, poison, strict=True):
        assert in_error[row_id]["headers_text"] == headers_text
        assert in_error[row_id]["body"] == body
        assert in_error[row_id]["expires"] is None
    assert len(bridge.destination.receive_all(RECEIVER)) == 3


def test_expired_messages_are_dropped(bridge: Bridge) -> None:
    messages = new_messages(bridge, 20, ttbr=lambda n: 1 if n % 2 else 3_600_000)
    send(bridge, messages)
    wait_until(lambda: bridge.source.expired_count(FORWARD) == 10, 10, "1 ms messages to expire")

    counts = bridge.forward_all()

    assert counts == Counter({"delivered": 10, "expired-dropped": 10})
    received = bridge.destination.receive_all(RECEIVER)
    expected = {m for m, (_, _, ttbr) in messages.items() if ttbr != 1}
    assert {m["headers"]["NServiceBus.MessageId"] for m in received} == expected
    assert bridge.source.receive_all("error") == []


def test_a_missing_destination_queue_is_retried_and_then_delivered_once(
    tmp_path: Path, pair: tuple[str, str], new_endpoint: EndpointFactory
) -> None:
    source, destination = new_endpoint(pair[0], "sender"), new_endpoint(pair[1], "receiver")
    bridge = make_bridge(tmp_path, source, destination, create_destination_queue=False)
    messages = new_messages(bridge, 20)
    send(bridge, messages)

    assert bridge.forward_all() == Counter({"retries-scheduled": 20})
    destination.create_queue(RECEIVER)  # the receiving endpoint is installed at last
    retried: Counter[str] = Counter()

    def all_retried() -> bool:  # each message is due 100 ms after its failed attempt
        retried.update(bridge.forward_all("retry"))
        return sum(retried.values()) >= 20

    wait_until(all_retried, 10, "the retries to be due and forwarded")
    assert retried == Counter({"delivered": 20})
    assert bridge.forward_all("retry") == Counter()

    received = bridge.destination.receive_all(RECEIVER)
    ids = Counter(m["headers"]["NServiceBus.MessageId"] for m in received)
    assert set(ids) == set(messages) and max(ids.values()) == 1
    assert bridge.source.receive_all("error") == []


def test_a_crash_between_the_destination_and_source_commits_delivers_once(
    bridge: Bridge,
) -> None:
    messages = new_messages(bridge, BATCH_SIZE)
    send(bridge, messages)

    with pytest.raises(ConnectionLost):
        bridge.forward_all(crash_once=True)
    # The destination committed, the source did not: every message is in both places now.
    assert len(bridge.destination.expires_by_message_id(RECEIVER)) == BATCH_SIZE
    assert len(bridge.source.expires_by_message_id(FORWARD)) == BATCH_SIZE

    assert bridge.forward_all() == Counter({"duplicates-skipped": BATCH_SIZE})
    received = bridge.destination.receive_all(RECEIVER)
    ids = Counter(m["headers"]["NServiceBus.MessageId"] for m in received)
    assert set(ids) == set(messages) and max(ids.values()) == 1
    assert bridge.source.receive_all(FORWARD) == []


# --------------------------------------------------------------------------------------------
# The error queue, as ServicePulse reads it
# --------------------------------------------------------------------------------------------

SOURCE_DIALECTS = ["postgresql", "postgresql-odbc", "sqlite", "sqlserver"]


@pytest.mark.parametrize("dialect", SOURCE_DIALECTS)
def test_a_message_that_cannot_be_routed_carries_the_nservicebus_failure_headers(
    tmp_path: Path, dialect: str, new_endpoint: EndpointFactory
) -> None:
    source = new_endpoint(dialect, "sender")
    bridge = make_bridge(tmp_path, source, None)
    # For SQL Server, with the sender's own catalog: what NServiceBus writes by default.
    nowhere = nsb_message_headers(source.address("Nowhere.Queue"))
    anonymous = nsb_message_headers(source.address("Nowhere.Else"))
    del anonymous["NServiceBus.MessageId"]  # NServiceBus then goes by the row's Id
    ids = bridge.source.send(FORWARD, [(nowhere, b"1", None), (anonymous, b"2", None)])

    assert bridge.forward_all() == Counter({"sent-to-error-queue": 2})

    failed = {m["id"]: m["headers"] for m in bridge.source.receive_all("error")}
    assert set(failed) == set(ids)
    machine = machine_name()
    for row_id, sent in zip(ids, (nowhere, anonymous), strict=True):
        headers = failed[row_id]
        # SQL Server: table@[schema]@[catalog], as NServiceBus writes it, so that ServiceControl
        # sends a retry to this database whatever its own default catalog is.
        assert headers["NServiceBus.FailedQ"] == source.address(FORWARD)
        assert headers["NServiceBus.MessageId"] == sent.get("NServiceBus.MessageId", str(row_id))
        assert headers["NServiceBus.ProcessingEndpoint"] == "sender"  # the forwarder
        assert headers["NServiceBus.ProcessingMachine"] == machine
        assert headers["$.diagnostics.hostid"] == host_id_for(machine)
        assert headers["$.diagnostics.hostdisplayname"] == machine
        assert headers["NServiceBus.ExceptionInfo.ExceptionType"] == "SFBridge.UnroutableMessage"
        assert "no route matches destination table" in headers["NServiceBus.ExceptionInfo.Message"]
        assert len(headers["NServiceBus.TimeOfFailure"]) == 28
        assert headers["$.sfbridge.failure-reason"] == "unroutable"
        # Kept, so that a retry from ServicePulse is routed again.
        assert headers["$.store-and-forward.destination"] == sent["$.store-and-forward.destination"]


# --------------------------------------------------------------------------------------------
# SQL Server addresses in every form NServiceBus writes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("destination_dialect", ["sqlserver", "postgresql", "sqlite"])
def test_a_sqlserver_sender_reaches_the_receiver_with_every_address_form(
    tmp_path: Path, destination_dialect: str, new_endpoint: EndpointFactory
) -> None:
    source = new_endpoint("sqlserver", "sender")
    destination = new_endpoint(destination_dialect, "receiver")
    assert isinstance(source, SqlServerEndpoint)
    bridge = make_bridge(tmp_path, source, destination)
    forms = [
        f"{RECEIVER}@[dbo]@[{source.catalog}]",  # the sender's own catalog: the route decides
        f"{RECEIVER}@[dbo]",
        RECEIVER,
    ]
    if isinstance(destination, SqlServerEndpoint):
        forms.append(f"[{RECEIVER}]@[dbo]@[{destination.catalog}]")  # the receiver's catalog
    messages: dict[str, Any] = {}
    for form in forms:
        bridge.destination_address = form
        messages.update(new_messages(bridge, 5))
    send(bridge, messages)

    assert bridge.forward_all() == Counter({"delivered": len(messages)})
    received = bridge.destination.receive_all(RECEIVER)
    ids = Counter(m["headers"]["NServiceBus.MessageId"] for m in received)
    assert set(ids) == set(messages) and max(ids.values()) == 1


# --------------------------------------------------------------------------------------------
# Delivery into the forwarding database itself (for SQL Server: another catalog on its server)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite", "sqlserver"])
def test_delivery_within_the_forwarding_database_is_atomic_without_a_ledger(
    tmp_path: Path, dialect: str, new_endpoint: EndpointFactory
) -> None:
    source = new_endpoint(dialect, "sender")
    if isinstance(source, SqlServerEndpoint):
        # A destination catalog on the same server, named in the address, reached through the
        # forwarding database's connection with three-part names.
        other = new_endpoint("sqlserver", "receiver")
        assert isinstance(other, SqlServerEndpoint)
        bridge = make_bridge(
            tmp_path,
            source,
            None,
            create_destination_queue=False,
            destination_address=other.address(RECEIVER),
        )
        other.create_queue(RECEIVER)
        bridge.destination = other
    else:
        bridge = make_bridge(tmp_path, source, None)
    messages = new_messages(bridge, 30)
    send(bridge, messages)

    with pytest.raises(ConnectionLost):
        bridge.forward_all(crash_once=True)
    # One transaction: the crash undid the delivery along with the receive.
    assert bridge.destination.expires_by_message_id(RECEIVER) == {}
    assert len(bridge.source.expires_by_message_id(FORWARD)) == 30

    assert bridge.forward_all() == Counter({"delivered": 30})
    received = bridge.destination.receive_all(RECEIVER)
    ids = Counter(m["headers"]["NServiceBus.MessageId"] for m in received)
    assert set(ids) == set(messages) and max(ids.values()) == 1
    expected_expires: dict[str, datetime | None] = {}
    assert bridge.source.expires_by_message_id(FORWARD) == expected_expires
