"""Forwarding through PgBouncer (Debian's, started on loopback by the `pgbouncer` fixture), the
forwarding database and the destination both behind it: in session pooling everything works as
on the server itself, push included; in transaction pooling, with fewer server connections
than the daemon's clients so that they really are shared, nothing is prepared on the server,
nothing of a session is assumed, and new messages are polled for, as the log and `status` say.
Each run ends with every message delivered once, none in the error queue, retry storage
empty, and no error in the daemon's log."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import (
    ERROR_QUEUE,
    RETRY_TABLE,
    PgPair,
    pg_count,
    pg_rows,
    send_bulk,
    wait_until,
    write_config,
)
from support.pairs import make_pg_pair, pg_pair_config
from support.pgbouncer import PgBouncer

pytestmark = pytest.mark.integration

# Sent before the daemon starts (claimed in full batches) and while it runs (picked up as
# they come), so that both the batches and the pickup cross the pooler.
BACKLOG, TRICKLE = 2500, 500
PUSHING = "2 of 2 table(s) push (LISTEN/NOTIFY)"
POLLING = "database 'sender': push off (transaction pooler: LISTEN/NOTIFY does not pass it)"


# What the tests' own setup earns: a superuser login, and polls a minute apart.
EXPECTED_WARNINGS = ("bridge.daemon.login_check", "peek_interval: warning: 1m is outside")


def database_name(connection_string: str) -> str:
    return connection_string.split("Database=")[1].rstrip(";")


def behind(pair: PgPair, bouncer: PgBouncer, tmp_path: Path, **options: Any) -> PgPair:
    """The pair, its config (`pg_pair_config` with `options`) reaching both databases through
    `bouncer` (its pool mode said as `pooler`); the test's own sends and reads still go to
    the server."""
    config = pg_pair_config(
        bouncer.connection_string(database_name(pair.sender)),
        bouncer.connection_string(database_name(pair.receiver)),
        receiver_database={"pooler": bouncer.pool_mode},
        **options,
        daemon={"processes": 1},  # one process starts sooner; the pooler is the point here
    )
    config["databases"]["sender"]["pooler"] = bouncer.pool_mode
    path = write_config(tmp_path / "behind-pgbouncer.yaml", config)
    return PgPair(config=path, sender=pair.sender, receiver=pair.receiver)


def delivered_ids(pair: PgPair) -> Counter[str]:
    """The message ids in the receiver's queue, each with how often it is there (read, not
    received: a receive per row would take longer than the forwarding)."""
    rows = pg_rows(
        pair.receiver, f"SELECT headers::json->>'NServiceBus.MessageId' FROM {pair.queue}"
    )
    return Counter(str(row[0]) for row in rows)


def forward_through(pair: PgPair, tmp_path: Path, logged: str) -> tuple[str, dict[str, Any]]:
    """Send the backlog, run the daemon until it has delivered it and the trickle, stop it;
    its log and what `status --json` said of the forwarder meanwhile. Asserts exactly once."""
    sent = send_bulk(pair.sender, BACKLOG, destination=pair.queue, queue=pair.forward)
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        daemon.wait_for_output(logged)
        for _ in range(5):
            sent |= send_bulk(pair.sender, TRICKLE // 5, destination=pair.queue, queue=pair.forward)
        wait_until(lambda: pair.delivered() == BACKLOG + TRICKLE, 30, "every message delivered")
        status = json.loads(pair.cli("status", "--json").stdout)["forwarders"][0]
        assert daemon.stop() == 0, daemon.output()
        output = daemon.output()
    assert delivered_ids(pair) == Counter(sent)
    assert pg_count(pair.sender, ERROR_QUEUE) == 0
    assert pg_count(pair.sender, RETRY_TABLE) == 0
    assert pair.queued() == 0
    complaints = [
        line
        for line in output.splitlines()
        if any(word in line for word in (" ERROR ", " WARNING ", "Traceback"))
        and not any(expected in line for expected in EXPECTED_WARNINGS)
    ]
    assert complaints == [], output
    return output, status


def test_session_pooling_forwards_exactly_once_with_push(
    pg_pair: PgPair, pgbouncer: Any, tmp_path: Path
) -> None:
    # Polls a minute apart (the first at the start, for the backlog): the trickle arrives
    # within forward_through's 30 s only if it is pushed.
    slow_polls = {"forwarder": {"peek_interval": "60s"}}
    pair = behind(pg_pair, pgbouncer("session", pool_size=20), tmp_path, **slow_polls)
    output, status = forward_through(pair, tmp_path, PUSHING)
    assert status["pickup"] == {"push": True}
    assert "push off" not in output


def test_transaction_pooling_forwards_exactly_once_and_polls(
    pg_pair: PgPair, pgbouncer: Any, tmp_path: Path
) -> None:
    bouncer = pgbouncer("transaction", pool_size=2)
    pair = behind(pg_pair, bouncer, tmp_path)
    output, status = forward_through(pair, tmp_path, f"{POLLING}, polled every 0.2 s")
    assert "table(s) push" not in output
    assert status["pickup"] == {
        "push": False,
        "poll_seconds": 0.2,
        "why": "transaction pooler: LISTEN/NOTIFY does not pass it",
    }
    text = pair.cli("status").stdout
    assert (
        "pickup             polled every 200ms: push off (transaction pooler: LISTEN/NOTIFY "
        "does not pass it)"
    ) in text


@pytest.mark.xdist_group("two-phase-servers")  # the cluster that allows prepared transactions
@pytest.mark.parametrize(
    ("pool_mode", "logged"),
    [("session", PUSHING), ("transaction", POLLING)],
    ids=["session", "transaction"],
)
def test_two_phase_through_pooling_forwards_exactly_once(
    two_phase_postgres: Any, pgbouncer: Any, tmp_path: Path, pool_mode: str, logged: str
) -> None:
    # PREPARE TRANSACTION ends the transaction, so a transaction pooler may lend the server
    # connection on; COMMIT PREPARED (or a resolver's ROLLBACK PREPARED) may run on any other.
    server = two_phase_postgres
    two_phase = {"transaction": "two-phase"}
    direct = make_pg_pair(
        tmp_path / "direct",
        server.connection_string(server.create_database()),
        server.connection_string(server.create_database()),
        route=two_phase,
    )
    # Two-phase holds two connections of the forwarding database per batch (the source
    # transaction, and the one its records are read on): one more than the 2 workers take.
    # Session pooling keeps one per client: every connection the daemon may hold.
    bouncer = pgbouncer(pool_mode, pool_size=3 if pool_mode == "transaction" else 20, server=server)
    pair = behind(direct, bouncer, tmp_path, route=two_phase)
    forward_through(pair, tmp_path, logged)
    assert pg_rows(pair.receiver, "SELECT gid FROM pg_prepared_xacts") == []
