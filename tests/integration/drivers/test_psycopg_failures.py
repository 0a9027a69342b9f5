"""psycopg on failure paths, against a real server.

- The server ends the source connection after the destination committed and before the
  source commit (pg_terminate_backend, not a simulated exception): the batch is lost to the
  bridge as ConnectionLost, every row comes back, and the next batch finds each message in the
  ledger.
- A destination queue table dropped and created again while the bridge holds a connection
  with server-side prepared statements for it (an endpoint's installer re-run): delivery goes
  on, nothing is lost or duplicated.
- Binary COPY: a destination that refuses it (a view) is written with INSERT, and only the
  first batch finds out; a column of another type is never written by COPY (no cast).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import (
    FORWARD,
    nsb_message_headers,
    pg_connect,
    pg_count,
    pg_create_queue,
    pg_nsb_send,
    pg_rows,
    pg_send,
    sfbridge,
    write_config,
)
from support import SAMPLES_RECEIVER as RECEIVER

from bridge.config import load_config
from bridge.connections import Connections
from bridge.exceptions import ConnectionLost, DatabaseError
from bridge.forwarding.spine import BatchForwarder
from bridge.forwarding.writes import QueueWriter

pytestmark = pytest.mark.integration


@pytest.fixture
def bridge(tmp_path: Path, new_pg_database: Any) -> Any:
    sender, receiver = new_pg_database(), new_pg_database()
    path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": sender},
                "receiver": {"dialect": "postgresql", "connection": receiver},
            },
            "forwarders": [{"name": "s", "database": "sender", "queue": "forward"}],
            "routes": [{"match": "*", "database": "receiver"}],
        },
    )
    assert sfbridge("-c", str(path), "install").returncode == 0
    pg_create_queue(receiver, RECEIVER)
    config, _ = load_config(path)
    assert config.databases["sender"].driver in (None, "psycopg")
    connections = Connections(config.databases)
    yield {
        "sender": sender,
        "receiver": receiver,
        "connections": connections,
        "forwarder": BatchForwarder(config, config.forwarders[0], connections),
    }
    connections.close()


def arrived(receiver: str) -> Counter[str]:
    return Counter(
        json.loads(headers)["NServiceBus.MessageId"]
        for (headers,) in pg_rows(receiver, f"SELECT headers FROM {RECEIVER}")
    )


class TerminatedBeforeCommit:
    """The real source connection; the server ends it just before the next batch's commit."""

    def __init__(self, inner: Any, admin_connection_string: str) -> None:
        self._inner = inner
        self.database = inner.database
        self.binds_arrays = inner.binds_arrays
        [(self._pid,)] = inner.query("SELECT pg_backend_pid()")
        inner.commit()
        self._admin = admin_connection_string
        self.armed = False
        self._writing = False

    def begin(self) -> None:
        self._writing = True
        self._inner.begin()

    def begin_read(self) -> None:
        self._writing = False
        self._inner.begin_read()

    def commit(self) -> None:
        if self.armed and self._writing:
            self.armed = False
            with pg_connect(self._admin) as admin:
                admin.execute("SELECT pg_terminate_backend(?)", self._pid)
                admin.commit()
        self._inner.commit()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_the_source_connection_ended_between_the_commits_delivers_each_message_once(
    bridge: Any,
) -> None:
    source = TerminatedBeforeCommit(bridge["connections"].get("sender"), bridge["sender"])
    bridge["connections"]._open[("sender", "")] = source
    ids = pg_send(bridge["sender"], FORWARD, 200)
    source.armed = True
    with pytest.raises(ConnectionLost):
        bridge["forwarder"].forward_batch()
    assert pg_count(bridge["sender"], FORWARD) == 200  # the claim was never committed
    assert sum(arrived(bridge["receiver"]).values()) == 200  # the destination was

    report = bridge["forwarder"].forward_batch()  # a new connection
    assert report.counts == Counter({"duplicates-skipped": 200})
    assert arrived(bridge["receiver"]) == Counter(ids)
    assert pg_count(bridge["sender"], FORWARD) == 0


def test_a_destination_queue_dropped_and_created_again_keeps_receiving(bridge: Any) -> None:
    forwarder = bridge["forwarder"]
    for _ in range(3):  # the array statements are prepared on the server from the 2nd run on
        pg_send(bridge["sender"], FORWARD, 10)
        assert forwarder.forward_batch().counts == Counter({"delivered": 10})

    # The receiving endpoint's installer runs again: the table goes and comes back (empty).
    with pg_connect(bridge["receiver"]) as connection:
        connection.execute(f"DROP TABLE {RECEIVER}")
        connection.commit()
    pg_create_queue(bridge["receiver"], RECEIVER)

    ids = pg_send(bridge["sender"], FORWARD, 20)
    reports = []
    for _ in range(3):
        try:
            reports.append(forwarder.forward_batch())
        except DatabaseError as error:  # pragma: no cover - what this test looks for
            pytest.fail(f"a batch failed after the table was recreated: {error}")
    assert sum(r.counts["delivered"] for r in reports) == 20, reports
    assert arrived(bridge["receiver"]) == Counter(ids)
    assert pg_count(bridge["sender"], '"public"."sfbridge_retry"') == 0


def test_a_destination_queue_recreated_with_other_column_types_keeps_receiving(
    bridge: Any,
) -> None:
    # An older or hand-made queue: Headers varchar instead of text, Expires timestamptz.
    forwarder = bridge["forwarder"]
    pg_send(bridge["sender"], FORWARD, 10)
    forwarder.forward_batch()
    pg_send(bridge["sender"], FORWARD, 10)
    forwarder.forward_batch()
    with pg_connect(bridge["receiver"]) as connection:
        connection.execute(f"DROP TABLE {RECEIVER}")
        connection.execute(
            f"CREATE TABLE {RECEIVER} (Id uuid NOT NULL PRIMARY KEY, Expires timestamptz, "
            "Headers varchar(20000) NOT NULL, Body bytea, Seq serial NOT NULL UNIQUE)"
        )
        connection.commit()
    ids = pg_send(bridge["sender"], FORWARD, 10)
    report = forwarder.forward_batch()
    assert report.counts == Counter({"delivered": 10}), report
    assert arrived(bridge["receiver"]) == Counter(ids)


def create_view(receiver: str) -> str:
    """An updatable view in front of the queue table (a DBA's indirection): INSERT works,
    COPY does not ("cannot copy to view"). Returns its name."""
    view = '"public"."Samples.View"'
    with pg_connect(receiver) as connection:
        connection.execute(f"CREATE VIEW {view} AS SELECT * FROM {RECEIVER}")
        connection.commit()
    return view


def send_to(sender: str, destination: str, count: int) -> list[str]:
    """`count` messages for `destination` in the forwarding queue; their message ids."""
    ids = []
    with pg_connect(sender) as connection:
        for index in range(count):
            headers = nsb_message_headers(destination)
            ids.append(str(headers["NServiceBus.MessageId"]))
            pg_nsb_send(connection, FORWARD, headers, b"body %d" % index)
        connection.commit()
    return ids


def test_a_destination_that_refuses_copy_is_written_with_insert_from_then_on(
    bridge: Any, caplog: pytest.LogCaptureFixture
) -> None:
    view = create_view(bridge["receiver"])
    forwarder = bridge["forwarder"]
    ids: list[str] = []
    for _ in range(3):
        ids += send_to(bridge["sender"], view, 20)
        with caplog.at_level("WARNING", logger="bridge.forwarding.writes"):
            assert forwarder.forward_batch().counts == Counter({"delivered": 20})
    assert arrived(bridge["receiver"]) == Counter(ids)
    refusals = [r for r in caplog.records if "does not take COPY" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in refusals]
    assert '"public"."Samples.View"' in refusals[0].getMessage()


def test_a_destination_that_refused_copy_is_tried_again_and_takes_it_once_it_can(
    bridge: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The view is replaced by a table of the same name (a DBA undoing the indirection): after
    # `copy_retry_after` the writer tries COPY again and keeps it. Said once each way.
    view = create_view(bridge["receiver"])
    config, _ = load_config(tmp_path / "sfbridge.yaml")
    forwarder = BatchForwarder(
        config,
        config.forwarders[0],
        bridge["connections"],
        writer=QueueWriter(copy_retry_after=0),
    )
    ids: list[str] = []

    def send_and_forward() -> None:
        ids.extend(send_to(bridge["sender"], view, 10))
        assert forwarder.forward_batch().counts == Counter({"delivered": 10})

    with caplog.at_level("INFO", logger="bridge.forwarding.writes"):
        send_and_forward()
        send_and_forward()  # refused again (tried, as the interval is 0): not said again
        with pg_connect(bridge["receiver"]) as connection:
            connection.execute(f"DROP VIEW {view}")
            connection.execute(f"CREATE TABLE {view} (LIKE {RECEIVER} INCLUDING ALL)")
            connection.commit()
        send_and_forward()
        send_and_forward()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("does not take COPY" in m for m in messages) == 1, messages
    assert sum("takes COPY again" in m for m in messages) == 1, messages
    received = Counter(
        json.loads(headers)["NServiceBus.MessageId"]
        for table in (RECEIVER, view)
        for (headers,) in pg_rows(bridge["receiver"], f"SELECT headers FROM {table}")
    )
    assert received == Counter(ids)


def test_a_destination_column_of_another_type_is_never_written_by_copy(bridge: Any) -> None:
    # Binary COPY sends values without a cast: a uuid's 16 bytes would land in a bytea Id as
    # they are. The column types are read first, and this table gets the statements, whose
    # values the server casts or refuses (here it refuses: the messages wait for retry).
    with pg_connect(bridge["receiver"]) as connection:
        connection.execute(f"DROP TABLE {RECEIVER}")
        connection.execute(
            f"CREATE TABLE {RECEIVER} (Id bytea NOT NULL PRIMARY KEY, Expires timestamp, "
            "Headers text NOT NULL, Body bytea, Seq serial NOT NULL UNIQUE)"
        )
        connection.commit()
    pg_send(bridge["sender"], FORWARD, 5)
    report = bridge["forwarder"].forward_batch()
    assert report.counts == Counter({"retries-scheduled": 5}), report
    assert pg_count(bridge["receiver"], RECEIVER) == 0
    [(last_error,)] = pg_rows(
        bridge["sender"], 'SELECT DISTINCT last_error FROM "public"."sfbridge_retry"'
    )
    assert "bytea" in last_error and "uuid" in last_error, last_error
