"""Failover to a promoted streaming standby, as a managed PostgreSQL does it: the old primary
stops dead, the standby is promoted, and connection strings that list both servers with
`target_session_attrs=read-write` follow it, in the ODBC-style form and as a URL.

The pair replicates synchronously (`streaming_postgres`): a commit the primary acknowledged
is on the standby, so the test can ask for every message exactly once. With asynchronous
replication a message committed on the old primary after its last WAL shipped is lost by
PostgreSQL itself, whatever the bridge does.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support import (
    ERROR_QUEUE,
    RETRY_TABLE,
    SAMPLES_RECEIVER,
    SENDER_FORWARD,
    DaemonProcess,
    nsb_message_headers,
    pg_connect,
    pg_count,
    pg_create_queue,
    pg_nsb_send,
    pg_rows,
    sfbridge,
    wait_until,
    write_config,
)
from support.pairs import make_pg_pair, message_ids, pg_pair_config, pg_send

pytestmark = pytest.mark.integration


def _destinations_up(config: Path) -> bool:
    """`status` exits 0 (a daemon runs, every database readable) and says every destination
    the daemon knows is up."""
    result = sfbridge("-c", str(config), "status", "--json")
    if result.returncode != 0:
        return False
    status = json.loads(result.stdout)
    return all(entry["state"] == "up" for entry in status["destinations"])


def _first_growth(count: Any, since: int, started: float, timeout: float) -> float:
    """Seconds from `started` until `count()` exceeds `since` (fails after `timeout`)."""
    wait_until(lambda: count() > since, timeout, "messages to flow again after the promotion")
    return time.monotonic() - started


def test_check_and_install_say_which_server_they_reached_and_refuse_a_standby(
    tmp_path: Path, new_pg_database: Any, streaming_postgres: Any
) -> None:
    pair = streaming_postgres
    pair.create_database("receiver")
    sender = new_pg_database()
    standby_only = pair.standby.connection_string("receiver")
    config = write_config(tmp_path / "standby.yaml", pg_pair_config(sender, standby_only))

    installed = sfbridge("-c", str(config), "install")
    assert installed.returncode != 0
    assert (
        f"database 'receiver': the connection reached 127.0.0.1:{pair.standby.port}, which "
        "does not accept writes: it is a standby in recovery" in installed.stderr
    ), installed.stderr
    assert "target_session_attrs=read-write" in installed.stderr
    checked = sfbridge("-c", str(config), "check")
    assert checked.returncode != 0
    assert (
        f"PROBLEM  database 'receiver': reachable at 127.0.0.1:{pair.standby.port}, which does "
        "not accept writes: it is a standby in recovery (pg_is_in_recovery()); the bridge "
        "delivers there" in checked.stdout
    ), checked.stdout

    # Both servers, the standby first: each driver and form goes on to the primary.
    for driver, form in (("psycopg", "odbc"), ("psycopg", "url"), ("odbc", "odbc")):
        receiver = {"driver": driver}
        options = pg_pair_config(
            sender, pair.failover_string("receiver", form), receiver_database=receiver
        )
        config = write_config(tmp_path / f"{driver}-{form}.yaml", options)
        checked = sfbridge("-c", str(config), "check")
        reached = f"database 'receiver': reachable at 127.0.0.1:{pair.primary.port}, accepts writes"
        assert reached in checked.stdout, (driver, form, checked.stdout)


@pytest.mark.parametrize("transaction", ["ledger", "two-phase"])
def test_a_promoted_standby_of_the_destination_gets_every_message_once(
    tmp_path: Path, new_pg_database: Any, streaming_postgres: Any, transaction: str
) -> None:
    """Two-phase: a transaction the old primary had prepared is on the standby too (synchronous
    replication); the promoted one must have it committed or rolled back, none left over."""
    pair = streaming_postgres
    pair.create_database("receiver")
    sender = new_pg_database()
    route = {"transaction": transaction} if transaction != "ledger" else {}
    bridge_pair = make_pg_pair(
        tmp_path, sender, pair.failover_string("receiver"), create_queue=False, route=route
    )
    pg_create_queue(pair.primary.connection_string("receiver"), SAMPLES_RECEIVER)
    old, new = (
        pair.primary.connection_string("receiver"),
        pair.standby.connection_string("receiver"),
    )

    with DaemonProcess(bridge_pair.config, tmp_path / "daemon.log") as daemon:
        sent = pg_send(sender, SENDER_FORWARD, 2000, body=b"x" * 200)
        wait_until(lambda: pg_count(old, SAMPLES_RECEIVER) >= 200, 30, "traffic to flow")
        pair.primary.kill()
        sent |= pg_send(sender, SENDER_FORWARD, 1000, body=b"x" * 200)
        # Counted on the standby before its promotion (it answers reads): after it, the
        # backlog may be delivered before a count could be taken.
        at_promotion = pg_count(new, SAMPLES_RECEIVER)
        pair.standby.promote()
        promoted = time.monotonic()
        again = _first_growth(lambda: pg_count(new, SAMPLES_RECEIVER), at_promotion, promoted, 60)
        print(f"destination failover: flowing again {again:.1f} s after the promotion")
        wait_until(lambda: pg_count(new, SAMPLES_RECEIVER) >= 3000, 60, "every message")
        wait_until(lambda: _destinations_up(bridge_pair.config), 30, "status to say all is up")
        assert pg_count(sender, RETRY_TABLE) == 0
        assert pg_count(sender, ERROR_QUEUE) == 0
        assert pg_count(sender, SENDER_FORWARD) == 0
        wait_until(lambda: not pg_rows(new, "SELECT gid FROM pg_prepared_xacts"), 30,
                   "no prepared transaction left on the promoted standby")  # fmt: skip
        assert daemon.stop() == 0, daemon.output()

    received = message_ids(new, SAMPLES_RECEIVER)
    assert set(received) == sent and max(received.values()) == 1


class FailoverSender:
    """Sends batches of messages into the forwarding queue through a connection string that
    follows the primary, in a thread, until stopped. `acknowledged`: ids of commits that
    returned; `uncertain`: ids of transactions that broke (their commit may have happened)."""

    def __init__(self, connection_string: str, batch: int = 100) -> None:
        self.connection_string = connection_string
        self.batch = batch
        self.acknowledged: set[str] = set()
        self.uncertain: set[str] = set()
        self.last_error = ""
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import pyodbc

        while not self.stopping.is_set():
            ids: set[str] = set()
            try:
                with pg_connect(self.connection_string) as connection:
                    while not self.stopping.is_set():
                        ids = set()
                        for _ in range(self.batch):
                            headers = nsb_message_headers(SAMPLES_RECEIVER)
                            ids.add(str(headers["NServiceBus.MessageId"]))
                            pg_nsb_send(connection, SENDER_FORWARD, headers, b"y" * 100)
                        connection.commit()
                        self.acknowledged |= ids
                        ids = set()
                        time.sleep(0.05)  # a steady stream, not a flood
            except pyodbc.Error as error:
                self.last_error = str(error)
                self.uncertain |= ids
                time.sleep(0.1)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)


@pytest.mark.parametrize(
    "transaction",
    # Two-phase: the destination on the cluster that allows prepared transactions; the
    # decisions about what it prepared are in the forwarding database that fails over.
    ["ledger", pytest.param("two-phase", marks=pytest.mark.xdist_group("two-phase-servers"))],
)
def test_a_promoted_standby_of_the_forwarding_database_forwards_every_message_once(
    tmp_path: Path,
    new_pg_database: Any,
    streaming_postgres: Any,
    request: pytest.FixtureRequest,
    transaction: str,
) -> None:
    pair = streaming_postgres
    pair.create_database("sender")
    if transaction == "ledger":
        receiver, route = new_pg_database(), {}
    else:
        server = request.getfixturevalue("two_phase_postgres")
        receiver = server.connection_string(server.create_database())
        route = {"transaction": transaction}
    bridge_pair = make_pg_pair(
        tmp_path, pair.failover_string("sender", "url"), receiver, route=route
    )
    # psqlODBC reads libpq's keys from pqopt only, and cuts a Port list short (the bridge
    # moves them there; a test client must write it so).
    follower = (
        "Driver={PostgreSQL Unicode};Uid=postgres;Database=sender;pqopt={host=127.0.0.1,"
        f"127.0.0.1 port={pair.standby.port},{pair.primary.port} "
        "target_session_attrs=read-write};"
    )
    new = pair.standby.connection_string("sender")

    with DaemonProcess(bridge_pair.config, tmp_path / "daemon.log") as daemon:
        sender = FailoverSender(follower)
        try:
            wait_until(
                lambda: pg_count(receiver, SAMPLES_RECEIVER) >= 500,
                30,
                f"traffic (the sender's last error: {sender.last_error or 'none'})",
            )
            pair.primary.kill()
            at_promotion = pg_count(receiver, SAMPLES_RECEIVER)  # nothing moves until promoted
            pair.standby.promote()
            promoted = time.monotonic()
            again = _first_growth(
                lambda: pg_count(receiver, SAMPLES_RECEIVER), at_promotion, promoted, 60
            )
            print(f"forwarding database failover: flowing again {again:.1f} s after promotion")
            acknowledged = len(sender.acknowledged)
            wait_until(lambda: len(sender.acknowledged) >= acknowledged + 500, 30, "sends")
        finally:
            sender.stop()
        wait_until(lambda: pg_count(new, SENDER_FORWARD) == 0, 60, "the queue to drain")
        wait_until(lambda: pg_count(new, RETRY_TABLE) == 0, 30, "retry storage to empty")
        wait_until(lambda: _destinations_up(bridge_pair.config), 30, "status to say all is up")
        assert pg_count(new, ERROR_QUEUE) == 0
        left = "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
        wait_until(lambda: not pg_rows(receiver, left), 30, "no prepared transaction left")
        assert daemon.stop() == 0, daemon.output()

    received = message_ids(receiver, SAMPLES_RECEIVER)
    assert max(received.values()) == 1
    assert sender.acknowledged <= set(received)
    assert set(received) <= sender.acknowledged | sender.uncertain
