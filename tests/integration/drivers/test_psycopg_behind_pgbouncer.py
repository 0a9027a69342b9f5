"""A psycopg connection behind PgBouncer in transaction pooling (`pooler: transaction`), one
server connection shared with another client: its timeouts hold in every transaction, nothing
of its session is left on the server connection for the other client, and no statement is
prepared there."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.config.model import DatabaseConfig
from bridge.connections import connect

pytestmark = pytest.mark.integration


def test_a_transaction_pooled_connection_leaves_nothing_of_its_session_behind(
    postgres: Any, pgbouncer: Any
) -> None:
    import psycopg

    bouncer = pgbouncer("transaction", pool_size=1)
    name = postgres.create_database()
    bridge = connect(
        DatabaseConfig(
            name,
            "postgresql",
            connection=bouncer.connection_string(name),
            query_timeout=3.0,
            pooler="transaction",
        )
    )
    other = psycopg.connect(
        f"host=127.0.0.1 port={bouncer.port} user=postgres dbname={name}", autocommit=True
    )
    try:
        for _ in range(3):  # statements that repeat are those psycopg would prepare
            assert bridge.query("SELECT current_setting(?)", ["statement_timeout"]) == [("4s",)]
            assert bridge.query("SHOW lock_timeout") == [("3s",)]
            bridge.commit()
            # The same server connection, lent to another client between the transactions.
            assert other.execute("SHOW statement_timeout").fetchall() == [("0",)]
            assert other.execute("SELECT count(*) FROM pg_prepared_statements").fetchall() == [(0,)]
    finally:
        bridge.close()
        other.close()
