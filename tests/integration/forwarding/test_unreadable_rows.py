"""Rows the driver or the decoder cannot turn into a message never stop their queue.

Each test writes rows with raw SQL, as anyone with access to the table could: timestamps
PostgreSQL holds but Python and .NET cannot (infinity, -infinity, BC, years past 9999), text
that is not valid in its encoding (a SQL_ASCII PostgreSQL database, a SQLite file), NULLs and
values of other types where the transport never writes them, and rows that can be read but are
large (headers of MiBs, bodies of tens of MiB). Every good row is delivered in queue order,
every bad one lands in the error queue once, with a reason naming the column, and nothing is
left behind - with both PostgreSQL drivers, and in retry storage as in the queue.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ERROR_QUEUE as ERROR
from support import (
    FORWARD,
    RECEIVER,
    nsb_message_headers,
    pg_connect,
    pg_create_queue,
    pg_rows,
    sfbridge,
    write_config,
)

from bridge.config import load_config
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.forwarding.spine import BatchForwarder

pytestmark = pytest.mark.integration

REASON = "$.sfbridge.failure-reason"
EXCEPTION = "NServiceBus.ExceptionInfo.Message"


def build(tmp_path: Path, sender: dict[str, Any], receiver: dict[str, Any]) -> BridgeConfig:
    path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {"sender": sender, "receiver": receiver},
            "forwarders": [{"name": "f", "database": "sender", "queue": "forward"}],
            "routes": [{"match": "*", "database": "receiver"}],
            "retries": {"delay": "1s"},
        },
    )
    result = sfbridge("-c", str(path), "install")
    assert result.returncode == 0, result.stdout + result.stderr
    config, _ = load_config(path)
    return config


def forward_everything(config: BridgeConfig, source: str = "queue") -> list[int]:
    """Forward batches until one comes back empty; how many rows each claimed."""
    connections = Connections(config.databases)
    try:
        forwarder = BatchForwarder(config, config.forwarders[0], connections)
        claimed: list[int] = []
        for _ in range(20):
            report = forwarder.forward_batch(source)  # type: ignore[arg-type]
            if report.claimed == 0:
                return claimed
            claimed.append(report.claimed)
        raise AssertionError(f"the queue never emptied: {claimed}")
    finally:
        connections.close()


def headers_for(label: str, destination: str = RECEIVER) -> dict[str, str | None]:
    """Headers of a message to the receiver (an address in the forwarding database's grammar:
    SQLite's is a bare table name)."""
    return nsb_message_headers(destination, **{"Test.Label": label})


# -- PostgreSQL ------------------------------------------------------------------------------

# (label, Expires as SQL text) in queue order; None is a good row.
PG_EXPIRES = [
    ("good-1", None),
    ("infinity", "infinity"),
    ("good-2", "2999-01-01 00:00:00"),
    ("minus-infinity", "-infinity"),
    ("good-3", "9999-12-31 23:59:59.999999"),  # the last instant .NET and Python share
    ("year-294276", "294276-12-31 23:59:59"),
    ("good-4", None),
    ("before-christ", "0044-03-15 00:00:00 BC"),
    ("good-5", None),
]


@pytest.mark.parametrize("driver", ["psycopg", "odbc"])
def test_postgresql_timestamps_outside_dotnet_years_go_to_the_error_queue_alone(
    tmp_path: Path, new_pg_database: Callable[[], str], driver: str
) -> None:
    sender, receiver = new_pg_database(), new_pg_database()
    config = build(
        tmp_path,
        {"dialect": "postgresql", "connection": sender, "driver": driver},
        {"dialect": "postgresql", "connection": receiver, "driver": driver},
    )
    pg_create_queue(receiver, RECEIVER)
    with pg_connect(sender) as connection:
        for label, expires in PG_EXPIRES:
            connection.execute(
                f"INSERT INTO {FORWARD} (id, expires, headers, body) "
                "VALUES (?, ?::timestamp, ?, ?)",
                uuid.uuid4(),
                expires,
                json.dumps(headers_for(label)),
                label.encode(),
            )
        connection.commit()

    assert forward_everything(config) == [len(PG_EXPIRES)]  # one pass, nothing held back

    delivered = pg_rows(receiver, f"SELECT headers, body FROM {RECEIVER} ORDER BY seq")
    assert [json.loads(h)["Test.Label"] for h, _ in delivered] == [
        label for label, expires in PG_EXPIRES if label.startswith("good")
    ]
    failed = {
        json.loads(h)["Test.Label"]: (json.loads(h), bytes(body), expires)
        for h, body, expires in pg_rows(sender, f"SELECT headers, body, expires FROM {ERROR}")
    }
    assert sorted(failed) == sorted(label for label, _ in PG_EXPIRES if not label.startswith("g"))
    for label, expires in PG_EXPIRES:
        if label in failed:
            headers, body, error_expires = failed[label]
            assert headers[REASON] == "unreadable-row"
            assert f"Expires holds {expires!r}" in headers[EXCEPTION] or (
                # PostgreSQL prints BC dates and big years its own way.
                "Expires holds" in headers[EXCEPTION]
                and "outside the years 1 to 9999" in headers[EXCEPTION]
            ), headers[EXCEPTION]
            assert headers["NServiceBus.FailedQ"] == FORWARD
            assert body == label.encode()
            assert error_expires is None
    assert pg_rows(sender, f"SELECT count(*) FROM {FORWARD}") == [(0,)]
    assert pg_rows(sender, 'SELECT count(*) FROM "public"."sfbridge_retry"') == [(0,)]


@pytest.mark.parametrize("driver", ["psycopg", "odbc"])
def test_postgresql_retry_storage_rows_with_unreadable_timestamps_fail_alone(
    tmp_path: Path, new_pg_database: Callable[[], str], driver: str
) -> None:
    sender, receiver = new_pg_database(), new_pg_database()
    config = build(
        tmp_path,
        {"dialect": "postgresql", "connection": sender, "driver": driver},
        {"dialect": "postgresql", "connection": receiver, "driver": driver},
    )
    pg_create_queue(receiver, RECEIVER)
    rows = [
        ("good-1", None, "2026-01-01"),
        ("expires-infinity", "infinity", "2026-01-01"),
        ("first-failure-infinity", None, "infinity"),
        ("good-2", None, "2026-01-01"),
    ]
    with pg_connect(sender) as connection:
        for label, expires, first_failure in rows:
            connection.execute(
                'INSERT INTO "public"."sfbridge_retry" (id, forwarder, destination, expires, '
                "headers, body, attempts, first_failure_at, next_attempt_at, last_error) "
                "VALUES (?, 'f', ?, ?::timestamp, ?, ?, 1, ?::timestamp, '2000-01-01', 'down')",
                uuid.uuid4(),
                RECEIVER,
                expires,
                json.dumps(headers_for(label)),
                label.encode(),
                first_failure,
            )
        connection.commit()

    assert forward_everything(config, "retry") == [4]

    delivered = pg_rows(receiver, f"SELECT headers FROM {RECEIVER} ORDER BY seq")
    assert [json.loads(h)["Test.Label"] for (h,) in delivered] == ["good-1", "good-2"]
    failed = {
        json.loads(h)["Test.Label"]: json.loads(h)[EXCEPTION]
        for (h,) in pg_rows(sender, f"SELECT headers FROM {ERROR}")
    }
    assert sorted(failed) == ["expires-infinity", "first-failure-infinity"]
    assert "Expires holds 'infinity'" in failed["expires-infinity"]
    assert "first_failure_at holds 'infinity'" in failed["first-failure-infinity"]
    assert pg_rows(sender, 'SELECT count(*) FROM "public"."sfbridge_retry"') == [(0,)]


@pytest.fixture
def sql_ascii_database(postgres: Any) -> Iterator[str]:
    """A database in SQL_ASCII, where the server stores any bytes as text unchecked (legacy
    installations have them): the only PostgreSQL encoding in which text can be invalid."""
    name = f"sfbtest_ascii_{uuid.uuid4().hex[:8]}"
    with postgres.admin() as admin:
        admin.execute(
            f"CREATE DATABASE \"{name}\" ENCODING 'SQL_ASCII' TEMPLATE template0 "
            "LC_COLLATE 'C' LC_CTYPE 'C'"
        )
    postgres.created.append(name)
    yield postgres.connection_string(name)


@pytest.mark.parametrize("driver", ["psycopg", "odbc"])
def test_postgresql_text_that_is_not_utf8_goes_to_the_error_queue_alone(
    tmp_path: Path,
    new_pg_database: Callable[[], str],
    sql_ascii_database: str,
    driver: str,
) -> None:
    sender, receiver = sql_ascii_database, new_pg_database()
    config = build(
        tmp_path,
        {"dialect": "postgresql", "connection": sender, "driver": driver},
        {"dialect": "postgresql", "connection": receiver, "driver": driver},
    )
    pg_create_queue(receiver, RECEIVER)
    labels = ["good-1", "latin-1", "good-2", "lone-continuation", "good-3"]
    with pg_connect(sender) as connection:
        for label in labels:
            # An E'' literal: backslashes doubled, then invalid UTF-8 written as escapes, which
            # the server stores byte for byte in SQL_ASCII.
            text = json.dumps(headers_for(label)).replace("\\", "\\\\").replace("'", "''")
            bad = {"latin-1": "caf\\xe9", "lone-continuation": "\\x80\\x80"}.get(label)
            if bad is not None:
                text = text.replace('"Test.Label"', f'"Bad.{bad}": "x", "Test.Label"')
            connection.execute(
                f"INSERT INTO {FORWARD} (id, headers, body) VALUES (?, E'{text}', ?)",
                uuid.uuid4(),
                label.encode(),
            )
        connection.commit()

    assert forward_everything(config) == [5]

    delivered = pg_rows(receiver, f"SELECT headers FROM {RECEIVER} ORDER BY seq")
    assert [json.loads(h)["Test.Label"] for (h,) in delivered] == ["good-1", "good-2", "good-3"]
    # The error queue is in the SQL_ASCII database: read its headers as bytes.
    failed = {
        json.loads(bytes(h))["Test.Label"]: json.loads(bytes(h))
        for (h,) in pg_rows(sender, f"SELECT convert_to(headers, 'SQL_ASCII') FROM {ERROR}")
    }
    assert sorted(failed) == ["latin-1", "lone-continuation"]
    for headers in failed.values():
        assert headers[REASON] == "unreadable-row"
        assert "Headers" in headers[EXCEPTION] and "UTF-8" in headers[EXCEPTION]
    # What could not be read is replaced, the rest kept.
    assert failed["latin-1"]["Bad.caf\ufffd"] == "x"
    assert pg_rows(sender, f"SELECT count(*) FROM {FORWARD}") == [(0,)]


@pytest.mark.parametrize("driver", ["psycopg", "odbc"])
def test_postgresql_null_ids_and_headers_in_a_hand_made_queue_fail_alone(
    tmp_path: Path, new_pg_database: Callable[[], str], driver: str
) -> None:
    sender, receiver = new_pg_database(), new_pg_database()
    # A queue made by hand without the transport's constraints, before install.
    with pg_connect(sender) as connection:
        connection.execute(
            f"CREATE TABLE {FORWARD} (id uuid, expires timestamp, headers text, body bytea, "
            "seq serial NOT NULL UNIQUE)"
        )
        connection.commit()
    config = build(
        tmp_path,
        {"dialect": "postgresql", "connection": sender, "driver": driver},
        {"dialect": "postgresql", "connection": receiver, "driver": driver},
    )
    pg_create_queue(receiver, RECEIVER)
    with pg_connect(sender) as connection:
        for label, row_id in [
            ("good-1", uuid.uuid4()),
            ("null-id", None),
            ("good-2", uuid.uuid4()),
        ]:
            connection.execute(
                f"INSERT INTO {FORWARD} (id, headers, body) VALUES (?, ?, ?)",
                row_id,
                json.dumps(headers_for(label)),
                b"x",
            )
        connection.execute(
            f"INSERT INTO {FORWARD} (id, headers, body) VALUES (?, NULL, 'y')", uuid.uuid4()
        )
        connection.commit()

    assert forward_everything(config) == [4]

    delivered = pg_rows(receiver, f"SELECT headers FROM {RECEIVER} ORDER BY seq")
    assert [json.loads(h)["Test.Label"] for (h,) in delivered] == ["good-1", "good-2"]
    failed = pg_rows(sender, f"SELECT id, headers, body FROM {ERROR}")
    assert len(failed) == 2
    by_body = {bytes(body): (row_id, headers) for row_id, headers, body in failed}
    null_id_headers = json.loads(by_body[b"x"][1])
    assert "Id is NULL" in null_id_headers[EXCEPTION]
    assert by_body[b"x"][0] is not None  # a new Id, which the error queue needs
    null_headers = json.loads(by_body[b"y"][1])  # only the failure headers
    assert "Headers is NULL" in null_headers[EXCEPTION]
    assert null_headers[REASON] == "unreadable-row"


@pytest.mark.parametrize("driver", ["psycopg", "odbc"])
def test_postgresql_large_rows_travel_alone_between_small_ones(
    tmp_path: Path, new_pg_database: Callable[[], str], driver: str
) -> None:
    sender, receiver = new_pg_database(), new_pg_database()
    config = build(
        tmp_path,
        {"dialect": "postgresql", "connection": sender, "driver": driver},
        {"dialect": "postgresql", "connection": receiver, "driver": driver},
    )
    pg_create_queue(receiver, RECEIVER)
    big_header = "h" * (3 * 1024 * 1024)
    big_body = bytes(range(256)) * (30 * 4096)  # 30 MiB
    plan = [("small-1", {}, b"1"), ("big-headers", {"Big": big_header}, b"2"),
            ("small-2", {}, b"3"), ("big-body", {}, big_body), ("small-3", {}, b"4")]  # fmt: skip
    with pg_connect(sender) as connection:
        for label, extra, body in plan:
            connection.execute(
                f"INSERT INTO {FORWARD} (id, headers, body) VALUES (?, ?, ?)",
                uuid.uuid4(),
                json.dumps({**headers_for(label), **extra}),
                body,
            )
        connection.commit()

    claimed = forward_everything(config)
    assert sum(claimed) == 5

    delivered = pg_rows(receiver, f"SELECT headers, body FROM {RECEIVER} ORDER BY seq")
    assert [json.loads(h)["Test.Label"] for h, _ in delivered] == [label for label, _, _ in plan]
    assert json.loads(delivered[1][0])["Big"] == big_header
    assert bytes(delivered[3][1]) == big_body
    assert pg_rows(sender, f"SELECT count(*) FROM {ERROR}") == [(0,)]


# -- SQLite ----------------------------------------------------------------------------------


def test_sqlite_rows_with_values_the_driver_cannot_read_fail_alone(
    tmp_path: Path, new_pg_database: Callable[[], str]
) -> None:
    receiver = new_pg_database()
    edge = tmp_path / "edge.db"
    config = build(
        tmp_path,
        {"dialect": "sqlite", "path": str(edge)},
        {"dialect": "postgresql", "connection": receiver},
    )
    pg_create_queue(receiver, RECEIVER)

    # (label, Id, Expires, Headers, Body) as SQLite stores them: any type in any column.
    def headers(label: str) -> bytes:
        return json.dumps(headers_for(label, "Receiver")).encode()

    def good(label: str) -> tuple[str, Any, Any, Any, Any]:
        return label, str(uuid.uuid4()), None, headers(label), label.encode()

    big_body = bytes(range(256)) * (30 * 4096)  # 30 MiB
    big_headers = json.dumps({**headers_for("big", "Receiver"), "Big": "h" * (3 << 20)}).encode()
    # A header name with a Latin-1 byte where UTF-8 would have two.
    latin1 = headers("latin-1").replace(b'"Test.Label"', b'"Bad.caf\xe9": "x", "Test.Label"')
    rows: list[tuple[str, Any, Any, Any, Any]] = [
        good("good-1"),
        ("latin-1-headers", str(uuid.uuid4()), None, latin1, b"a"),
        good("good-2"),
        ("bad-id", b"\xff\xfe not an id", None, headers("bad-id"), b"b"),
        ("not-a-date", str(uuid.uuid4()), "not a date", headers("not-a-date"), b"c"),
        ("expires-bytes", str(uuid.uuid4()), b"\xc3\x28", headers("expires-bytes"), b"d"),
        # Text where the transport writes bytes: read as its UTF-8, and delivered.
        ("text-body", str(uuid.uuid4()), None, headers("text-body"), "a text body"),
        ("year-10000", str(uuid.uuid4()), "10000-01-01T00:00:00", headers("year-10000"), b"e"),
        ("year-9999", str(uuid.uuid4()), "9999-12-31T23:59:59.999999", headers("year-9999"), b"f"),
        ("big", str(uuid.uuid4()), None, big_headers, big_body),
        good("good-3"),
    ]
    with sqlite3.connect(edge) as connection:
        for _, row_id, expires, headers, body in rows:
            # Bytes go in as TEXT (CAST), as a writer that does not check its encoding leaves them.
            connection.execute(
                "INSERT INTO forward (Id, Recoverable, Expires, Headers, Body) VALUES "
                "(CAST(? AS TEXT), 1, CAST(? AS TEXT), CAST(? AS TEXT), ?)",
                (row_id, expires, headers, body),
            )

    # Rows are taken while the bytes before them are under batch_bytes: the 30 MiB row ends
    # the first batch, and the one after it waits for the next.
    assert forward_everything(config) == [len(rows) - 1, 1]

    delivered = pg_rows(receiver, f"SELECT headers, body FROM {RECEIVER} ORDER BY seq")
    assert [json.loads(h)["Test.Label"] for h, _ in delivered] == [
        "good-1",
        "good-2",
        "text-body",
        "year-9999",
        "big",
        "good-3",
    ]
    assert bytes(delivered[2][1]) == b"a text body"
    assert bytes(delivered[4][1]) == big_body
    with sqlite3.connect(edge) as connection:
        failed = connection.execute("SELECT Id, Headers, Body FROM error").fetchall()
        left = connection.execute("SELECT count(*) FROM forward").fetchone()
    assert left == (0,)
    by_body = {body: (row_id, json.loads(headers)) for row_id, headers, body in failed}
    assert sorted(by_body) == [b"a", b"b", b"c", b"d", b"e"]
    reasons = {body: headers[EXCEPTION] for body, (_, headers) in by_body.items()}
    assert "Headers cannot be read by the database driver (not valid UTF-8" in reasons[b"a"]
    assert by_body[b"a"][1]["Bad.caf\ufffd"] == "x"
    assert "Id cannot be read by the database driver" in reasons[b"b"]
    assert "Expires holds 'not a date'" in reasons[b"c"]
    assert "Expires cannot be read" in reasons[b"d"]
    assert "Expires holds '10000-01-01T00:00:00'" in reasons[b"e"]
    assert all(headers[REASON] == "unreadable-row" for _, headers in by_body.values())
    uuid.UUID(by_body[b"b"][0])  # a new, valid Id for the row whose Id was unreadable


def test_sqlite_nulls_in_a_hand_made_queue_fail_alone(
    tmp_path: Path, new_pg_database: Callable[[], str]
) -> None:
    receiver = new_pg_database()
    edge = tmp_path / "edge.db"
    with sqlite3.connect(edge) as connection:  # made by hand, without NOT NULL, before install
        connection.execute(
            "CREATE TABLE forward (Id TEXT, CorrelationId TEXT, ReplyToAddress TEXT, "
            "Recoverable INTEGER, Expires TEXT, Headers TEXT, Body BLOB, "
            "RowVersion INTEGER PRIMARY KEY AUTOINCREMENT)"
        )
    config = build(
        tmp_path,
        {"dialect": "sqlite", "path": str(edge)},
        {"dialect": "postgresql", "connection": receiver},
    )
    pg_create_queue(receiver, RECEIVER)
    with sqlite3.connect(edge) as connection:
        for row_id, headers, body in [
            (str(uuid.uuid4()), json.dumps(headers_for("good-1", "Receiver")), b"1"),
            (None, json.dumps(headers_for("null-id", "Receiver")), b"2"),
            (str(uuid.uuid4()), None, b"3"),
            (str(uuid.uuid4()), json.dumps(headers_for("good-2", "Receiver")), b"4"),
        ]:
            connection.execute(
                "INSERT INTO forward (Id, Recoverable, Headers, Body) VALUES (?, 1, ?, ?)",
                (row_id, headers, body),
            )

    assert forward_everything(config) == [4]

    delivered = pg_rows(receiver, f"SELECT headers FROM {RECEIVER} ORDER BY seq")
    assert [json.loads(h)["Test.Label"] for (h,) in delivered] == ["good-1", "good-2"]
    with sqlite3.connect(edge) as connection:
        failed = dict(connection.execute("SELECT Body, Headers FROM error").fetchall())
    assert "Id is NULL" in json.loads(failed[b"2"])[EXCEPTION]
    assert "Headers is NULL" in json.loads(failed[b"3"])[EXCEPTION]
