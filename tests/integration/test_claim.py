"""Claiming from retry storage on real databases: messages for a database that is waiting out an
outage stay put, unless they waited past max_wait or expired; rows are decoded by name."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support import write_config

from bridge.claim import claim_batch
from bridge.config import load_config
from bridge.connections import Connections
from bridge.dialects import dialect_for
from bridge.install import run_install
from bridge.tables import forwarder_tables

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
