"""The server-side halves of `query_timeout` on PostgreSQL: set once per session, or in every
transaction where the session does not outlive it (behind a transaction pooler)."""

from __future__ import annotations

from bridge.dialects.postgresql import session_setup


def test_the_timeouts_are_set_for_the_session() -> None:
    assert session_setup(15.0) == [
        "SET lock_timeout = '15000ms'",
        "SET statement_timeout = '16000ms'",
    ]


def test_behind_a_transaction_pooler_they_are_set_in_every_transaction() -> None:
    # SET LOCAL: gone with the transaction, so nothing is left on a server connection the
    # pooler lends to another client next.
    assert session_setup(2.5, per_transaction=True) == [
        "SET LOCAL lock_timeout = '2500ms'",
        "SET LOCAL statement_timeout = '3500ms'",
    ]
