"""The error-queue tools' world: a forwarding database and a receiver database of one
dialect, a config whose only route does not match the receiver's queue, the bridge's tables
installed (shared by the tests of `sfbridge errors`, `retries` and `where`)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from bridge.config import load_config
from bridge.connections import Connections
from bridge.dialects import dialect_for
from bridge.forwarding.spine import BatchForwarder
from bridge.messages import utcnow
from bridge.storage.retries import store_retry
from bridge.storage.tables import forwarder_tables
from support import (
    NsbEndpoint,
    PostgresEndpoint,
    SqliteEndpoint,
    nsb_message_headers,
    pg_rows,
    sfbridge,
    write_config,
)

FORWARD = "Samples.Sender.Forward"
RECEIVER = "Samples.Receiver"
ERROR = "error"
FAILURE_HEADERS = {
    "NServiceBus.FailedQ",
    "NServiceBus.TimeOfFailure",
    "$.sfbridge.failure-reason",
    "$.sfbridge.attempts",
}


class World:
    """A forwarding database and a receiver database of one dialect, a config whose only route
    does not match the receiver's queue, and the bridge's tables installed."""

    def __init__(self, tmp_path: Path, dialect: str, new_pg_database: Any) -> None:
        self.sender: NsbEndpoint
        self.receiver: NsbEndpoint
        if dialect == "postgresql":
            self.sender = PostgresEndpoint(new_pg_database())
            self.receiver = PostgresEndpoint(new_pg_database())
        else:
            self.sender = SqliteEndpoint(tmp_path / "sender.db")
            self.receiver = SqliteEndpoint(tmp_path / "receiver.db")
        self.path = tmp_path / "sfbridge.yaml"
        self.config: dict[str, Any] = {
            "databases": {
                "sender": self.sender.database_entry(),
                "receiver": self.receiver.database_entry(),
            },
            "forwarders": [
                {"name": "orders", "database": "sender", "queue": self.sender.address(FORWARD)}
            ],
            "routes": [{"match": "Samples.Billing*", "database": "receiver"}],
        }
        write_config(self.path, self.config)
        installed = self.cli("install")
        assert installed.returncode == 0, installed.stderr
        self.receiver.create_queue(RECEIVER)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return sfbridge("-c", str(self.path), *args)

    def add_route(self) -> None:
        self.config["routes"].append({"match": "Samples.Receiver*", "database": "receiver"})
        write_config(self.path, self.config)

    def send(self, count: int) -> dict[str, str]:
        """Sends `count` messages to the receiver; returns row Id -> NServiceBus.MessageId."""
        headers = [nsb_message_headers(self.sender.address(RECEIVER)) for _ in range(count)]
        ids = self.sender.send(FORWARD, [(h, b'{"order": 1}', None) for h in headers])
        pairs = zip(ids, headers, strict=True)
        return {str(row_id): str(h["NServiceBus.MessageId"]) for row_id, h in pairs}

    def forward_all(self) -> Counter[str]:
        """Runs the forwarder until its queue is empty, as a running daemon would."""
        config, _ = load_config(self.path)
        connections = Connections(config.databases)
        counts: Counter[str] = Counter()
        try:
            forwarder = BatchForwarder(config, config.forwarders[0], connections)
            while (report := forwarder.forward_batch()).claimed:
                counts += report.counts
        finally:
            connections.close()
        return counts

    def rows(self, table: str) -> list[tuple[str, dict[str, Any]]]:
        """(row Id, headers) of every row of a queue in the forwarding database, not taken."""
        if isinstance(self.sender, PostgresEndpoint):
            raw = pg_rows(
                self.sender.connection_string,
                f"SELECT id, headers FROM {self.sender.qualified(table)} ORDER BY seq",
            )
        else:
            assert isinstance(self.sender, SqliteEndpoint)
            with sqlite3.connect(self.sender.path) as connection:
                raw = connection.execute(
                    f'SELECT Id, Headers FROM "{table}" ORDER BY RowVersion'
                ).fetchall()
        return [(str(row_id), _loads(headers)) for row_id, headers in raw]


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def unroutable_in_error_queue(world: World, count: int) -> dict[str, str]:
    sent = world.send(count)
    assert world.forward_all() == Counter({"sent-to-error-queue": count})
    assert {row_id for row_id, _ in world.rows(ERROR)} == set(sent)
    return sent


def park_in_retry(world: World, count: int) -> list[str]:
    """`count` messages waiting in retry storage for the receiver, not due for an hour;
    returns their MessageIds."""
    config, _ = load_config(world.path)
    connections = Connections(config.databases)
    message_ids = []
    try:
        connection = connections.get("sender")
        dialect = dialect_for(config.databases["sender"].dialect)
        retry = forwarder_tables(config, config.forwarders[0]).retry
        now = utcnow()
        connection.begin()
        for _ in range(count):
            headers = nsb_message_headers(world.sender.address(RECEIVER))
            message_ids.append(str(headers["NServiceBus.MessageId"]))
            store_retry(
                connection, dialect, retry, uuid.uuid4(), "orders",
                (world.sender.address(RECEIVER), "receiver"),
                (None, json.dumps(headers, separators=(",", ":")), b"{}"),
                3, now, now + timedelta(hours=1), "receiver is down",
            )  # fmt: skip
        connection.commit()
    finally:
        connections.close()
    return message_ids
