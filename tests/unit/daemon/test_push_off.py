"""Whether the daemon listens for pushes from a database, and why not (`push_off_reason`):
never where the notifications cannot reach it."""

from __future__ import annotations

from bridge.config.model import DatabaseConfig
from bridge.daemon.push import push_off_reason
from bridge.dialects import dialect_for

CONNECTION = "Server=127.0.0.1;Port=6432;Database=sender;Uid=postgres"


def reason(database: DatabaseConfig) -> str | None:
    return push_off_reason(database, dialect_for(database.dialect))


def test_postgresql_through_psycopg_pushes_directly_and_behind_session_pooling() -> None:
    assert reason(DatabaseConfig("sender", "postgresql", connection=CONNECTION)) is None
    pooled = DatabaseConfig("sender", "postgresql", connection=CONNECTION, pooler="session")
    assert reason(pooled) is None


def test_a_transaction_pooler_turns_push_off() -> None:
    pooled = DatabaseConfig("sender", "postgresql", connection=CONNECTION, pooler="transaction")
    assert reason(pooled) == "transaction pooler: LISTEN/NOTIFY does not pass it"


def test_what_cannot_listen_is_said_too() -> None:
    odbc = DatabaseConfig("sender", "postgresql", connection=CONNECTION, driver="odbc")
    assert reason(odbc) == "its ODBC driver cannot listen for pushes"
    assert reason(DatabaseConfig("edge", "sqlite", path="/tmp/edge.db")) == "SQLite has no push"


def test_a_budget_without_room_for_the_listening_connection_turns_push_off() -> None:
    tight = DatabaseConfig("sender", "postgresql", connection=CONNECTION, max_connections=4)
    assert reason(tight) == "max_connections 4 leaves no connection to listen on (it takes 5)"
    roomy = DatabaseConfig("sender", "postgresql", connection=CONNECTION, max_connections=5)
    assert reason(roomy) is None
