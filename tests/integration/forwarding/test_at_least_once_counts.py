"""`transaction: at-least-once` counts what it knows (issue 34): a session ended for real
(`pg_terminate_backend`) before the destination commit went out counts no suspected
duplicate; a commit whose answer is lost counts its messages, and the log names every one."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from support import pg_count, pg_rows
from support.pairs import PgPair

import bridge.forwarding.in_doubt
from bridge.config import load_config
from bridge.connections import Connections
from bridge.exceptions import ConnectionLost, DatabaseUnavailable
from bridge.forwarding.in_doubt import resolve_in_doubt
from bridge.forwarding.spine import BatchForwarder
from bridge.forwarding.transactions import BatchTransactions

MESSAGES = 25


@pytest.fixture
def at_least_once(
    pg_pair_factory: Callable[..., PgPair], monkeypatch: pytest.MonkeyPatch
) -> tuple[PgPair, Connections, BatchForwarder]:
    pair = pg_pair_factory(route={"transaction": "at-least-once"})
    config, _ = load_config(pair.config)
    connections = Connections(config.databases)
    # A record left behind counts at the next round, not 5 s later.
    monkeypatch.setattr(bridge.forwarding.in_doubt, "ORPHAN_AGE", timedelta(0))
    yield pair, connections, BatchForwarder(config, config.forwarders[0], connections)
    connections.close()


def backend_pid(connections: Connections, database: str) -> int:
    connection = connections.get(database)
    pid = int(connection.query("SELECT pg_backend_pid()")[0][0])
    connection.rollback()
    return pid


def terminate(pair: PgPair, pid: int) -> None:
    # With a timeout, PostgreSQL returns once the session is gone.
    [(ended,)] = pg_rows(pair.sender, f"SELECT pg_terminate_backend({pid}, 5000)::int")
    assert int(ended) == 1


def kill_before_record(monkeypatch: pytest.MonkeyPatch, pair: PgPair, pid: int) -> None:
    """The session `pid` ends once the batch has written into the destination, before its
    record in flight and its commit."""
    record = BatchTransactions.record_in_flight
    killed: list[int] = []

    def kill_first(self: BatchTransactions, database: str, items: Any) -> Any:
        if not killed:
            killed.append(pid)
            terminate(pair, pid)
        return record(self, database, items)

    monkeypatch.setattr(BatchTransactions, "record_in_flight", kill_first)


def suspected(pair: PgPair, connections: Connections) -> Counter[str]:
    config, _ = load_config(pair.config)
    return resolve_in_doubt(config, connections).suspected_duplicates


def test_a_source_session_ended_before_the_destination_commit_counts_no_duplicate(
    at_least_once: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair, connections, forwarder = at_least_once
    ids = pair.send(MESSAGES)
    kill_before_record(monkeypatch, pair, backend_pid(connections, "sender"))
    with pytest.raises(DatabaseUnavailable):
        forwarder.forward_batch()
    assert pair.delivered() == 0 and pair.queued() == MESSAGES  # nothing committed anywhere
    assert suspected(pair, connections) == Counter()
    monkeypatch.undo()
    forwarder.forward_batch()
    assert pair.received() == Counter(dict.fromkeys(ids, 1))


def test_a_destination_session_ended_before_its_commit_counts_no_duplicate(
    at_least_once: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair, connections, forwarder = at_least_once
    ids = pair.send(MESSAGES)
    kill_before_record(monkeypatch, pair, backend_pid(connections, "receiver"))
    # The COMMIT is answered with the session's end (57P01): not committed, and tried again
    # at once on a new connection.
    assert forwarder.forward_batch().counts == Counter({"delivered": MESSAGES})
    assert suspected(pair, connections) == Counter()
    assert pair.received() == Counter(dict.fromkeys(ids, 1))
    assert pg_count(pair.sender, "sfbridge_transactions WHERE outcome = 'P'") == 0


class AnswerLost:
    """The destination connection whose next commit happens but whose answer never comes
    (the link breaks after the COMMIT went out): what no real fault makes on demand."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.database = inner.database
        self.armed = True

    def commit(self) -> None:
        self._inner.commit()
        if self.armed:
            self.armed = False
            lost = ConnectionLost(self.database, "server closed the connection unexpectedly")
            lost.outcome_unknown = True
            raise lost

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_commit_whose_answer_is_lost_counts_its_messages_and_names_them(
    at_least_once: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    pair, connections, forwarder = at_least_once
    ids = pair.send(MESSAGES)
    connections._open[("receiver", "")] = AnswerLost(connections.get("receiver"))
    # Tried again at once on a new connection: delivered again, as this mode allows.
    assert forwarder.forward_batch().counts == Counter({"delivered": MESSAGES})
    assert pair.received() == Counter(dict.fromkeys(ids, 2))
    unknown = [r.getMessage() for r in caplog.records if "is unknown" in r.getMessage()]
    assert len(unknown) == 1 and all(i in unknown[0] for i in ids), unknown
    assert suspected(pair, connections) == Counter({"sender": MESSAGES})
    warned = [r.getMessage() for r in caplog.records if "delivered twice" in r.getMessage()]
    assert len(warned) == 1 and all(i in warned[0] for i in ids), warned
