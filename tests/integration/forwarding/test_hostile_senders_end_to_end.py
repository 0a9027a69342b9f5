"""A hostile sender against the real daemon, on PostgreSQL and on SQLite: whatever it writes
into its forwarding queue reaches only the queue the routes allow; everything else is in the
error queue with a reason after one attempt (retry storage stays empty: the retry delay is an
hour), and the good messages beside it are delivered exactly once.

Rows are written with the transports' own send statements (tests/support/), headers as raw
JSON text where a sender would play with it (duplicate keys, escapes).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import (
    DaemonProcess,
    NsbEndpoint,
    PostgresEndpoint,
    SqliteEndpoint,
    nsb_message_headers,
    pg_create_queue,
    pg_rows,
    sfbridge,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration

DESTINATION = "$.store-and-forward.destination"
EVENT_TYPE = "$.store-and-forward.eventtype"
FORWARD = "Samples.Sender.Forward"
RECEIVER = "Samples.Receiver"
RECEIVER_FORWARD = "Samples.Receiver.Forward"  # the receiver database's own forwarder
EVENT = "Shared.OrderShipped"


def endpoint(dialect: str, name: str, tmp_path: Path, new_pg_database: Any) -> NsbEndpoint:
    if dialect == "postgresql":
        return PostgresEndpoint(new_pg_database())
    return SqliteEndpoint(tmp_path / f"{name}.db")


def raw(destination: str, *pairs: tuple[str, str]) -> str:
    """Headers as a sender may write them: JSON text, keys repeated as given."""
    headers = nsb_message_headers(None)
    fields = [json.dumps(key) + ":" + json.dumps(value) for key, value in headers.items()]
    fields.append(json.dumps(DESTINATION) + ":" + json.dumps(destination))
    fields += [json.dumps(key) + ":" + json.dumps(value) for key, value in pairs]
    return "{" + ",".join(fields) + "}"


def message_id(headers_text: str) -> str:
    return str(json.loads(headers_text)["NServiceBus.MessageId"])


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_a_hostile_sender_reaches_only_what_the_routes_allow(
    dialect: str, tmp_path: Path, new_pg_database: Any
) -> None:
    sender = endpoint(dialect, "sender", tmp_path, new_pg_database)
    receiver = endpoint(dialect, "receiver", tmp_path, new_pg_database)
    # A database of the other dialect, which a forged `$.sfbridge.address-database` names.
    other = endpoint(
        "sqlite" if dialect == "postgresql" else "postgresql", "other", tmp_path, new_pg_database
    )
    address = receiver.address
    config = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": sender.database_entry(),
                "receiver": receiver.database_entry(),
                "other": other.database_entry(),
            },
            "forwarders": [
                {"name": "sender", "database": "sender", "queue": sender.address(FORWARD)},
                {
                    "name": "receiver-out",
                    "database": "receiver",
                    "queue": receiver.address(RECEIVER_FORWARD),
                },
            ],
            "routes": [
                {"match": "Samples.Receiver*", "database": "receiver"},
                # Globs that match tables of the bridge's: refused all the same.
                {"match": "error", "database": "receiver"},
                {"match": "sfbridge_*", "database": "receiver"},
            ],
            "subscriptions": {EVENT: [address(RECEIVER), address(RECEIVER_FORWARD)]},
            # A retry would come after an hour: whatever the test sees was settled at once.
            "retries": {"delay": "1h"},
        },
    )
    installed = sfbridge("-c", str(config), "install")
    assert installed.returncode == 0, installed.stderr
    receiver.create_queue(RECEIVER)
    if dialect == "postgresql":
        assert isinstance(receiver, PostgresEndpoint)
        pg_rows(receiver.connection_string, "CREATE SCHEMA secret")
        pg_create_queue(receiver.connection_string, '"secret"."Samples.Receiver"')

    good = [
        raw(address(RECEIVER)),
        # Its bridge headers are dropped, not obeyed (nor delivered).
        raw(
            address(RECEIVER),
            ("$.sfbridge.address-database", "other"),
            ("$.sfbridge.failure-reason", "forged"),
        ),
        # Duplicate keys: the last one counts, as in every JSON reader the bridge uses.
        raw("error", (DESTINATION, address(RECEIVER))),
    ]
    hostile = [
        raw('"secret"."Samples.Receiver"', ("$.sfbridge.address-database", "other")),
        raw(address(RECEIVER_FORWARD)),
        raw("error"),
        raw("sfbridge_retry"),
        raw(address(RECEIVER), (DESTINATION, "sfbridge_ledger")),
        raw("Samples.R\u0435ceiver"),  # a Cyrillic е
        raw("Samples.Receiver\x00"),
        raw("x" * 10_000),
        raw("Nowhere", ("$.sfbridge.attempts", "99"), ("$.sfbridge.failure-reason", "forged")),
    ]
    if dialect == "postgresql":
        hostile.append(raw("Samples.Receiver" + "x" * 60))  # past PostgreSQL's name length
    event_headers = nsb_message_headers(None, **{EVENT_TYPE: f"{EVENT}, Shared"})
    sent = sender.send(
        FORWARD,
        [(text, b"{}", None) for text in (*good, *hostile)]
        + [(json.dumps(event_headers), b"{}", None)],
    )
    assert len(sent) == len(good) + len(hostile) + 1

    with DaemonProcess(config, tmp_path / "daemon.log") as daemon:
        # Every message settled: the good ones and the event's good copy delivered, every
        # hostile one and the event's copy for the bridge's own queue in the error queue.
        delivered: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []

        def settled() -> bool:
            delivered.extend(receiver.receive_all(RECEIVER))
            failed.extend(sender.receive_all("error"))
            return len(delivered) == len(good) + 1 and len(failed) == len(hostile) + 1

        wait_until(settled, 60, "every message delivered or in the error queue")
        assert daemon.stop() == 0, daemon.output()

    assert Counter(message_id(m["headers_text"]) for m in delivered) == Counter(
        [*(message_id(text) for text in good), event_headers["NServiceBus.MessageId"]]
    )
    for message in delivered:
        assert not [key for key in message["headers"] if key.startswith("$.sfbridge.")]
    assert {message_id(m["headers_text"]) for m in failed} == {
        *(message_id(text) for text in hostile),
        event_headers["NServiceBus.MessageId"],
    }
    for message in failed:
        headers = message["headers"]
        assert headers["$.sfbridge.failure-reason"] == "unroutable", headers
        assert headers.get("$.sfbridge.attempts") in (None, "1"), headers
        assert headers["NServiceBus.ExceptionInfo.Message"], headers
    # Nothing reached the tables of the bridge or another schema, nothing waits for a retry.
    assert receiver.receive_all(RECEIVER_FORWARD) == []
    assert receiver.receive_all("error") == []
    if dialect == "postgresql":
        assert isinstance(receiver, PostgresEndpoint) and isinstance(sender, PostgresEndpoint)
        secret = pg_rows(
            receiver.connection_string, 'SELECT count(*) FROM "secret"."Samples.Receiver"'
        )
        assert secret == [(0,)]
        waiting = pg_rows(sender.connection_string, "SELECT count(*) FROM sfbridge_retry")
    else:
        import sqlite3

        assert isinstance(sender, SqliteEndpoint)
        with sqlite3.connect(sender.path) as connection:
            waiting = connection.execute("SELECT count(*) FROM sfbridge_retry").fetchall()
    assert [tuple(row) for row in waiting] == [(0,)]
    reasons = " ".join(m["headers"]["NServiceBus.ExceptionInfo.Message"] for m in failed)
    assert "the bridge never delivers a message into its own tables" in reasons
    assert uuid.UUID(str(sent[0]))  # the rows were the transport's own
