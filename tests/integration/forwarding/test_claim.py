"""Claiming from retry storage on real databases: messages for a database that is waiting out an
outage stay put, unless they waited past max_wait or expired; rows are decoded by name."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support import write_config

from bridge.commands.install import run_install
from bridge.config import load_config
from bridge.connections import Connections
from bridge.dialects import dialect_for
from bridge.forwarding.claim import claim_batch
from bridge.forwarding.spine import BatchForwarder
from bridge.storage.tables import forwarder_tables

pytestmark = pytest.mark.integration

NOW = datetime.utcnow().replace(microsecond=0)


def config_for(tmp_path: Path, database: dict[str, Any]) -> Any:
    path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {"local": database, "receiver": {"dialect": "sqlite", "path": "r.db"}},
            "forwarders": [{"name": "f", "database": "local", "queue": "forward"}],
            "routes": [{"match": "*", "database": "receiver"}],
            "retries": {"during_outage": "wait", "max_wait": "1h"},
        },
    )
    config, _ = load_config(path)
    run_install(config)
    return config


@pytest.fixture(params=["sqlite", "postgresql"])
def config(request: pytest.FixtureRequest, tmp_path: Path, new_pg_database: Any) -> Any:
    if request.param == "sqlite":
        return config_for(tmp_path, {"dialect": "sqlite", "path": str(tmp_path / "local.db")})
    return config_for(tmp_path, {"dialect": "postgresql", "connection": new_pg_database()})


def test_messages_for_a_waiting_database_stay_unless_overdue_or_expired(config: Any) -> None:
    forwarder = config.forwarders[0]
    tables = forwarder_tables(config, forwarder)
    connections = Connections(config.databases)
    connection = connections.get("local")
    dialect = dialect_for(config.databases["local"].dialect)
    rows = {
        # name: (destination database, first failure, expires)
        "waiting": ("receiver", NOW - timedelta(minutes=5), None),
        "overdue": ("receiver", NOW - timedelta(hours=2), None),
        "expired": ("receiver", NOW - timedelta(minutes=5), NOW - timedelta(seconds=1)),
        "elsewhere": ("billing", NOW - timedelta(minutes=5), None),
        "unknown-database": (None, NOW - timedelta(minutes=5), None),
    }
    ids = {}
    try:
        connection.begin()
        for seq, (name, (database, first, expires)) in enumerate(rows.items()):
            ids[name] = uuid.uuid4()
            connection.execute(
                dialect.sql("retry_store", retry=tables.retry),
                (
                    dialect.encode_id(ids[name]),
                    "f",
                    name,
                    database,
                    dialect.encode_timestamp(expires),
                    "{}",
                    b"body",
                    seq + 1,
                    dialect.encode_timestamp(first),
                    dialect.encode_timestamp(NOW - timedelta(seconds=1)),
                    "down",
                ),
            )
        connection.commit()

        connection.begin()
        claimed = claim_batch(
            connection,
            dialect,
            tables,
            forwarder,
            "retry",
            now=NOW,
            policy=config.retries,
            waiting_databases=["receiver", "audit"],
        )
        connection.rollback()
        by_id = {message.row_id: message for message in claimed}
        claimable = ("overdue", "expired", "elsewhere", "unknown-database")
        assert set(by_id) == {ids[name] for name in claimable}
        expired = by_id[ids["expired"]]
        assert expired.expired and expired.attempts == 3 and expired.last_error == "down"
        assert by_id[ids["overdue"]].first_failure_at == NOW - timedelta(hours=2)
        assert by_id[ids["elsewhere"]].body == b"body"

        connection.begin()
        everything = claim_batch(
            connection, dialect, tables, forwarder, "retry", now=NOW, policy=config.retries
        )
        connection.rollback()
        assert {message.row_id for message in everything} == set(ids.values())
        assert [m.order for m in everything] == sorted(m.order for m in everything)
    finally:
        connections.close()


# --------------------------------------------------------------------------------------------
# Batches bounded by bytes as well as by count


def send_sized(config: Any, sizes: list[int]) -> list[uuid.UUID]:
    """Queue one message per size (its body that many bytes); returns their ids in order."""
    forwarder = config.forwarders[0]
    tables = forwarder_tables(config, forwarder)
    dialect = dialect_for(config.databases["local"].dialect)
    connections = Connections(config.databases)
    ids = [uuid.uuid4() for _ in sizes]
    try:
        connection = connections.get("local")
        connection.begin()
        for message_id, size in zip(ids, sizes, strict=True):
            connection.execute(
                dialect.sql("send", queue=tables.queue),
                (dialect.encode_id(message_id), None, "{}", b"x" * size),
            )
        connection.commit()
    finally:
        connections.close()
    return ids


def claim_all_in_batches(config: Any, batch_bytes: int, batch_size: int = 1000) -> list[int]:
    """Claim (and commit) until the queue is empty; returns each batch's size."""
    forwarder = dataclasses.replace(
        config.forwarders[0], batch_bytes=batch_bytes, batch_size=batch_size
    )
    tables = forwarder_tables(config, forwarder)
    dialect = dialect_for(config.databases["local"].dialect)
    connections = Connections(config.databases)
    batches = []
    try:
        connection = connections.get("local")
        while True:
            connection.begin()
            claimed = claim_batch(
                connection, dialect, tables, forwarder, "queue", now=NOW, policy=config.retries
            )
            connection.commit()
            if not claimed:
                return batches
            batches.append(len(claimed))
    finally:
        connections.close()


KIB = 1024


def test_a_batch_stops_before_the_message_that_would_cross_its_byte_bound(config: Any) -> None:
    # 40 KiB bodies under a 100 KiB bound: two fit (the bytes before the third are 80 KiB and
    # some headers, under the bound, so it goes too), the fourth would start past it.
    send_sized(config, [40 * KIB] * 7)
    assert claim_all_in_batches(config, batch_bytes=100 * KIB) == [3, 3, 1]


def test_a_message_larger_than_the_bound_travels_alone_and_small_ones_fill_batches(
    config: Any,
) -> None:
    # The bytes before the large one are small, so it closes the first batch; the row after
    # it would start past the bound and begins the next.
    send_sized(config, [10, 10, 300 * KIB, 10, 10, 10])
    assert claim_all_in_batches(config, batch_bytes=64 * KIB) == [3, 3]
    # Two large ones in a row: each alone.
    send_sized(config, [300 * KIB, 300 * KIB, 10])
    assert claim_all_in_batches(config, batch_bytes=64 * KIB) == [1, 1, 1]


def test_the_count_bound_still_holds_for_small_messages(config: Any) -> None:
    send_sized(config, [100] * 25)
    assert claim_all_in_batches(config, batch_bytes=8 * 1024 * KIB, batch_size=10) == [10, 10, 5]


def test_a_batch_cut_short_by_its_byte_bound_reports_full_so_the_worker_goes_on(
    config: Any,
) -> None:
    """The daemon and the Spark drain forward again at once after a full batch and wait a peek
    interval (or stop) otherwise: a batch cut by bytes must count as full, or a queue of large
    messages would move one batch per peek interval."""
    send_sized(config, [40 * KIB] * 7)  # no routing header: each goes to the error queue
    forwarder = dataclasses.replace(config.forwarders[0], batch_bytes=100 * KIB)
    connections = Connections(config.databases)
    try:
        batches = BatchForwarder(config, forwarder, connections)
        reports = [batches.forward_batch() for _ in range(4)]
    finally:
        connections.close()
    assert [(r.claimed, r.full) for r in reports] == [(3, True), (3, True), (1, False), (0, False)]


def test_a_batch_that_reaches_its_row_limit_reports_full(config: Any) -> None:
    send_sized(config, [100] * 12)
    forwarder = dataclasses.replace(config.forwarders[0], batch_size=5)
    connections = Connections(config.databases)
    try:
        batches = BatchForwarder(config, forwarder, connections)
        reports = [batches.forward_batch() for _ in range(3)]
    finally:
        connections.close()
    assert [(r.claimed, r.full) for r in reports] == [(5, True), (5, True), (2, False)]


def test_retry_storage_is_claimed_within_the_byte_bound_too(config: Any) -> None:
    forwarder = dataclasses.replace(config.forwarders[0], batch_bytes=100 * KIB)
    tables = forwarder_tables(config, forwarder)
    dialect = dialect_for(config.databases["local"].dialect)
    connections = Connections(config.databases)
    try:
        connection = connections.get("local")
        connection.begin()
        for seq in range(5):
            connection.execute(
                dialect.sql("retry_store", retry=tables.retry),
                (
                    dialect.encode_id(uuid.uuid4()),
                    "f",
                    "somewhere",
                    "receiver",
                    None,
                    "{}",
                    b"x" * 40 * KIB,
                    seq + 1,
                    dialect.encode_timestamp(NOW - timedelta(minutes=1)),
                    dialect.encode_timestamp(NOW - timedelta(seconds=seq + 1)),
                    "down",
                ),
            )
        connection.commit()
        batches = []
        for _ in range(3):
            connection.begin()
            claimed = claim_batch(
                connection, dialect, tables, forwarder, "retry", now=NOW, policy=config.retries
            )
            connection.commit()
            batches.append(len(claimed))
    finally:
        connections.close()
    assert batches == [3, 2, 0]
