"""`databases.<name>.pooler`: what stands between the bridge and a PostgreSQL server."""

from __future__ import annotations

from typing import Any

from bridge.config import validate

SENDER = "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=6432;Database=sender;Uid=postgres"


def document(**sender: Any) -> dict[str, Any]:
    return {
        "databases": {
            "sender": {"dialect": "postgresql", "connection": SENDER, **sender},
            "edge": {"dialect": "sqlite", "path": "/var/lib/sfbridge/edge.db"},
        },
        "forwarders": [{"name": "orders", "database": "sender", "queue": "sfbridge.forward"}],
        "routes": [{"match": "*", "database": "edge"}],
    }


def errors(raw: dict[str, Any]) -> list[str]:
    return [str(p) for p in validate(raw, {})[1] if p.severity == "error"]


def test_a_database_is_reached_directly_unless_the_config_says_otherwise() -> None:
    config, _ = validate(document(), {})
    assert config is not None
    assert config.databases["sender"].pooler is None  # `none`: the server itself


def test_session_and_transaction_pooling_are_accepted_on_postgresql() -> None:
    for mode in ("session", "transaction"):
        config, problems = validate(document(pooler=mode), {})
        assert config is not None, [str(p) for p in problems]
        assert config.databases["sender"].pooler == mode


def test_an_unknown_pool_mode_is_refused_with_the_choices() -> None:
    (error,) = errors(document(pooler="statement"))
    assert error.startswith("databases.sender.pooler:")
    assert "none, session, transaction" in error


def test_sqlite_sits_behind_no_pooler() -> None:
    raw = document()
    raw["databases"]["edge"]["pooler"] = "session"
    assert errors(raw) == [
        "databases.edge.pooler: not used by sqlite databases; only postgresql databases sit "
        "behind a pooler"
    ]


def test_odbc_behind_a_transaction_pooler_is_refused_with_what_to_do() -> None:
    (error,) = errors(document(pooler="transaction", driver="odbc"))
    assert error.startswith("databases.sender.driver: database 'sender' is behind a transaction")
    assert "use 'driver: psycopg'" in error
    assert errors(document(pooler="session", driver="odbc")) == []
