"""Faults made for real against a running daemon, and what must hold after them (issue 34):
its sessions killed over and over, a steady sender, and the end state every fault test checks
(every message exactly once, nothing in the error queue or retry storage, the daemon READY)."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from support import ERROR_QUEUE, RETRY_TABLE, pg_count, pg_rows, wait_until
from support.pairs import PgPair

# A warning of the in-doubt sweep, and one of a batch whose destination COMMIT got no answer
# (`bridge.forwarding.in_doubt`, `bridge.forwarding.transactions`): the MessageIds they name.
SUSPECTED = re.compile(r"may have been delivered twice to database '[^']+' .*?\): (.+)$", re.M)
UNKNOWN = re.compile(r"were delivered there is unknown; .*?at-least-once\): (.+)$", re.M)


class SessionKiller(threading.Thread):
    """Ends `per_round` of the daemon's sessions (`application_name` sfbridge) on `databases`,
    picked at random among those in a statement or a transaction first (a batch's), with
    `pg_terminate_backend` every `every` seconds until stopped; `admin` opens an autocommit
    connection to the server (a pyodbc one). A few at a time, not all: a
    batch whose sessions all die at once fails at its next statement, whichever it is, while
    one that loses its source and keeps its destination (or the reverse) goes down the paths
    that must not lose, duplicate or miscount."""

    def __init__(
        self,
        admin: Callable[[], Any],
        databases: list[str],
        every: float = 0.2,
        per_round: int = 2,
    ):
        super().__init__(daemon=True)
        self._admin, self._databases, self._every = admin, databases, every
        self._per_round = per_round
        self._stopping = threading.Event()
        self.killed = 0
        self.rounds = 0

    def run(self) -> None:
        marks = ", ".join("?" for _ in self._databases)
        with self._admin() as admin:
            while not self._stopping.wait(self._every):
                rows = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM (SELECT pid FROM "
                    "pg_stat_activity WHERE application_name = 'sfbridge' AND datname IN "
                    f"({marks}) ORDER BY state = 'idle', random() LIMIT ?) AS chosen",
                    *self._databases,
                    self._per_round,
                ).fetchone()
                self.killed += int(rows[0])
                self.rounds += 1

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=10)


def database_name(connection_string: str) -> str:
    return connection_string.split("Database=")[1].rstrip(";")


def send_steadily(pair: PgPair, total: int, seconds: float, body: bytes = b"x") -> set[str]:
    """`total` messages in 20 chunks spread over `seconds` (the sending's own time included);
    their ids."""
    chunks = 20
    started = time.monotonic()
    ids: set[str] = set()
    for chunk in range(chunks):
        ids |= pair.send(total // chunks, body=body)
        time.sleep(max(0.0, started + seconds * (chunk + 1) / chunks - time.monotonic()))
    return ids


def receiver_ids(pair: PgPair) -> Counter[str]:
    """The receiver queue's MessageIds, each with how often it is there (read, not received:
    one query, where receiving as the transport does takes a statement per message)."""
    rows = pg_rows(
        pair.receiver,
        f"SELECT Headers::json->>'NServiceBus.MessageId', count(*) FROM {pair.queue} GROUP BY 1",
    )
    return Counter({str(message_id): int(count) for message_id, count in rows})


def time_to_flow(pair: PgPair, timeout: float = 60) -> tuple[float, set[str]]:
    """Seconds from now (the fault just ended) until the receiver's queue grows again, a
    message sent now making sure there is something to forward: how soon the daemon forwards
    again after a fault. Also that message's id."""
    before = pair.delivered()
    started = time.monotonic()
    probe = pair.send(1)
    wait_until(lambda: pair.delivered() > before, timeout, "a delivery after the fault")
    return time.monotonic() - started, probe


def assert_settled(pair: PgPair, ids: set[str], *, exactly_once: bool = True) -> Counter[str]:
    """Wait until every message of `ids` reached the receiver and the daemon reports READY
    (running, every destination up, no forwarder failing); then check that nothing is left in
    the forwarding queue, the error queue or retry storage. Returns the receiver's ids."""
    wait_until(lambda: pair.delivered() >= len(ids), 60, f"{len(ids)} messages delivered")

    def ready() -> bool:
        status = pair.status()
        forwarders = status["forwarders"]
        return (
            bool(status["daemons_running"])
            and all(d["state"] == "up" for d in status["destinations"])
            and all(not f.get("failing") and "error" not in f for f in forwarders)
        )

    wait_until(ready, 30, "the daemon to report READY")
    assert pair.queued() == 0
    assert pg_count(pair.sender, ERROR_QUEUE) == 0
    assert pg_count(pair.sender, RETRY_TABLE) == 0
    received = receiver_ids(pair)
    assert set(received) == ids, (len(ids - set(received)), len(set(received) - ids))
    if exactly_once:
        assert max(received.values()) == 1, [i for i, n in received.items() if n > 1][:5]
    return received


def prepared_transactions(connection_string: str) -> list[str]:
    return [
        str(row[0])
        for row in pg_rows(
            connection_string,
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()",
        )
    ]
