"""Reading tables in ranges, as Spark tasks do, without Spark: every row exactly once, whatever
the gaps in the sequence, the pages and the ranges, in SQLite and in PostgreSQL, through the
dialects' own statements."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support import write_config

from bridge.config.load import load_config
from bridge.connections import Connections, connect
from bridge.dialects import dialect_for
from bridge.dialects.base import Dialect
from bridge.drivers import Connection
from bridge.spark import partitions
from bridge.spark.shipped import ShippedConfig
from bridge.storage.ledger import ledger_address
from bridge.storage.tables import forwarder_tables, split_statements

pytestmark = pytest.mark.integration

RANGES = 7
PAGE_ROWS = 13


@pytest.fixture(params=["sqlite", "postgresql"])
def world(
    request: pytest.FixtureRequest, tmp_path: Path, new_pg_database: Any, monkeypatch: Any
) -> dict[str, Any]:
    """One database of each dialect with a forwarder's tables and a ledger; ranges and pages
    small enough that a few thousand rows cross many of both."""
    if request.param == "sqlite":
        entry: dict[str, Any] = {"dialect": "sqlite", "path": str(tmp_path / "db.sqlite")}
    else:
        entry = {"dialect": "postgresql", "connection": new_pg_database()}
    path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {"db": entry},
            "forwarders": [{"name": "f", "database": "db", "queue": "forward"}],
            "routes": [{"match": "*", "database": "db"}],
        },
    )
    config, _ = load_config(path)
    dialect = dialect_for(entry["dialect"])
    tables = forwarder_tables(config, config.forwarders[0])
    connect(config.databases["db"], create=True).close()  # a SQLite file is made by install
    connections = Connections(config.databases)
    connection = connections.get("db")
    connection.begin()
    for name, table in (("create_queue", tables.queue), ("create_retry_table", tables.retry),
                        ("create_ledger_table", ledger_address(config, "db"))):  # fmt: skip
        key = {"create_queue": "queue", "create_retry_table": "retry"}.get(name, "ledger")
        for statement in split_statements(dialect.sql(name, **{key: table})):
            connection.execute(statement)
    connection.commit()
    monkeypatch.setattr(partitions, "task_count", lambda rows, parallelism: RANGES)
    monkeypatch.setattr(partitions, "FIRST_PAGE_ROWS", PAGE_ROWS)
    monkeypatch.setattr(partitions, "next_page_rows", lambda rows, size: PAGE_ROWS)
    yield {"config": config, "shipped": ShippedConfig.read(str(path)), "dialect": dialect,
           "tables": tables, "connection": connection}  # fmt: skip
    connections.close()


def read_all(world: dict[str, Any], ranges: list[partitions.TableRange]) -> Counter[Any]:
    return Counter(row for _, row in partitions.read_ranges(world["shipped"], ranges))


def test_a_queue_with_gaps_is_read_in_ranges_of_about_equal_rows_each_row_once(
    world: dict[str, Any],
) -> None:
    connection: Connection = world["connection"]
    dialect: Dialect = world["dialect"]
    queue = world["tables"].queue
    connection.begin()
    for number in range(3000):
        row_id = dialect.encode_id(uuid.uuid4())
        connection.execute(dialect.sql("send", queue=queue), (row_id, None, f"[{number}]", b"x"))
    connection.commit()
    connection.begin()
    # The first two thirds drained but for every tenth row: a sparse sequence, then a dense one.
    rows = connection.query(dialect.sql("queue_page", queue=queue), (0, 10**9, 10**6))
    kept = [seq for index, (seq, _, _) in enumerate(rows) if index >= 2000 or index % 10 == 0]
    for seq, _, _ in rows:
        if seq not in kept:
            connection.execute(dialect.sql("error_queue_delete_many", rows=1, queue=queue), (seq,))
    connection.commit()

    count, ranges = partitions.plan_queue(connection, dialect, "db", queue, 2, "forward")
    assert count == len(kept) and len(ranges) == RANGES
    read = read_all(world, ranges)
    assert sorted(row[0] for row in read) == kept and max(read.values()) == 1
    sizes = [sum(1 for seq in kept if r.after < seq <= r.up_to) for r in ranges]
    assert max(sizes) - min(sizes) <= len(kept) // RANGES + 1, sizes


def test_retry_storage_is_read_for_one_forwarder_only(world: dict[str, Any]) -> None:
    connection: Connection = world["connection"]
    dialect: Dialect = world["dialect"]
    retry = world["tables"].retry
    now = datetime(2026, 11, 23, 12, 0)
    connection.begin()
    for number in range(700):
        forwarder = "f" if number % 3 else "g"
        connection.execute(
            dialect.sql("retry_store", retry=retry),
            (dialect.encode_id(uuid.uuid4()), forwarder, f"Dest{number % 4}", "db", None, "{}",
             b"x", number % 5, dialect.encode_timestamp(now), dialect.encode_timestamp(now),
             f"error {number}"),
        )  # fmt: skip
    connection.commit()
    count, ranges = partitions.plan_retry(connection, dialect, "db", retry, "f", 2)
    read = read_all(world, ranges)
    assert count == sum(read.values()) == sum(1 for n in range(700) if n % 3)
    assert {row[4] for row in read} == {f"error {n}" for n in range(700) if n % 3}


def test_the_ledger_is_read_since_a_time_in_key_ranges_with_several_destinations_per_message(
    world: dict[str, Any],
) -> None:
    connection: Connection = world["connection"]
    dialect: Dialect = world["dialect"]
    config = world["config"]
    ledger = ledger_address(config, "db")
    old, recent = datetime(2026, 1, 1), datetime(2026, 11, 23)
    expected = set()
    connection.begin()
    for number in range(1200):
        # Ids that sort apart in some collations: case, punctuation, a long digest-like one.
        message_id = f"{'Msg' if number % 2 else 'msg'}-{number:05d}{'.' * (number % 3)}"
        for destination in ("Billing", "Shipping", '"public"."Sales"')[: 1 + number % 3]:
            moment = old if number % 7 == 0 else recent
            connection.execute(
                f"INSERT INTO {dialect.grammar.qualified_name(ledger)} "
                "(message_id, destination, forwarded_at) VALUES (?, ?, ?)",
                (message_id, destination, dialect.encode_timestamp(moment)),
            )
            if moment == recent:
                expected.add((message_id, destination))
    connection.commit()
    since = recent - timedelta(days=1)
    destinations, ranges = partitions.plan_ledger(connection, dialect, "db", ledger, since, 2)
    assert sum(destinations.values()) == len(expected) and len(ranges) == RANGES
    read = read_all(world, ranges)
    assert set(read) == expected and max(read.values()) == 1
