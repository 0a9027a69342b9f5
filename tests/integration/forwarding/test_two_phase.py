"""`transaction: two-phase` and `at-least-once` on real PostgreSQL databases: every crash point
between PREPARE TRANSACTION, the source commit and COMMIT PREPARED, a batch still deciding
while a resolver looks, and a destination connection lost after the prepare. Each ends with
every message in exactly one place and no prepared transaction left behind."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from support import (
    SAMPLES_RECEIVER,
    SENDER_FORWARD,
    CommitFailsOnce,
    install_pg_pair,
    pg_connect,
    pg_count,
    pg_nsb_receive_all,
    pg_rows,
    send_to_receiver,
    write_config,
)

import bridge.forwarding.in_doubt
from bridge.config import load_config
from bridge.connections import Connections
from bridge.exceptions import ConnectionLost
from bridge.forwarding.in_doubt import resolve_in_doubt
from bridge.forwarding.settle import Settlement
from bridge.forwarding.spine import BatchForwarder
from bridge.forwarding.transactions import BatchTransactions

# On one worker of the parallel run: the cluster that allows prepared transactions
# (two_phase_postgres, tests/conftest.py) is started once, not once per worker.
pytestmark = pytest.mark.xdist_group("two-phase")

FORWARD, RECEIVER = SENDER_FORWARD, SAMPLES_RECEIVER
TRANSACTIONS = '"public"."sfbridge_transactions"'


@pytest.fixture
def new_2pc_database(two_phase_postgres: Any) -> Callable[[], str]:
    def create() -> str:
        return two_phase_postgres.connection_string(two_phase_postgres.create_database())

    return create


def make_setup(
    tmp_path: Path,
    sender: str,
    receiver: str,
    transaction: str = "two-phase",
    **forwarder: Any,
) -> dict[str, Any]:
    return install_pg_pair(
        tmp_path,
        sender,
        receiver,
        route={"transaction": transaction},
        **{"peek_interval": "100ms", **forwarder},
    )


def send(sender: str, count: int) -> set[str]:
    return send_to_receiver(sender, count, b"body")


def received(receiver: str) -> Counter[str]:
    return Counter(
        m["headers"]["NServiceBus.MessageId"] for m in pg_nsb_receive_all(receiver, RECEIVER)
    )


def prepared(database: str) -> list[str]:
    return [
        str(row[0])
        for row in pg_rows(
            database, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
        )
    ]


def bridge_tables(database: str) -> list[str]:
    return [
        str(row[0])
        for row in pg_rows(
            database,
            "SELECT table_name FROM information_schema.tables WHERE table_name LIKE 'sfbridge%'",
        )
    ]


def in_process(setup: dict[str, Any]) -> tuple[Any, Connections, BatchForwarder]:
    config, _ = load_config(setup["config"])
    connections = Connections(config.databases)
    return config, connections, BatchForwarder(config, config.forwarders[0], connections)


def test_two_phase_delivers_exactly_once_with_no_bridge_table_in_the_destination(
    tmp_path: Path, new_2pc_database: Any
) -> None:
    sender, receiver = new_2pc_database(), new_2pc_database()
    setup = make_setup(tmp_path, sender, receiver)
    assert bridge_tables(receiver) == []  # install made nothing there: no ledger
    ids = send(sender, 120)
    config, connections, forwarder = in_process(setup)
    report = forwarder.forward_batch()
    assert report.counts == Counter({"delivered": 120})
    assert received(receiver) == Counter(dict.fromkeys(ids, 1))
    assert pg_count(sender, FORWARD) == 0
    assert prepared(receiver) == []
    assert bridge_tables(receiver) == []
    # The decision is kept until a resolver round sees its transaction committed.
    assert pg_count(sender, f"{TRANSACTIONS} WHERE outcome = 'C'") == 1
    resolve_in_doubt(config, connections)
    assert pg_count(sender, f"{TRANSACTIONS} WHERE outcome = 'C'") == 0
    connections.close()


def test_a_crash_after_the_prepare_before_the_source_commit_rolls_the_prepared_back(
    tmp_path: Path, new_2pc_database: Any
) -> None:
    sender, receiver = new_2pc_database(), new_2pc_database()
    setup = make_setup(tmp_path, sender, receiver)
    ids = send(sender, 50)
    config, connections, forwarder = in_process(setup)
    connections._open[("sender", "")] = CommitFailsOnce(connections.get("sender"))

    with pytest.raises(ConnectionLost):
        forwarder.forward_batch()
    # Prepared in the destination (invisible there), back in the source: no decision.
    assert len(prepared(receiver)) == 1
    assert pg_count(receiver, RECEIVER) == 0
    assert pg_count(sender, FORWARD) == 50

    settled = resolve_in_doubt(config, connections)
    assert (settled.committed, settled.rolled_back) == (0, 1)
    assert prepared(receiver) == []
    forwarder.forward_batch()
    assert received(receiver) == Counter(dict.fromkeys(ids, 1))
    assert pg_count(sender, FORWARD) == 0
    connections.close()


def test_a_crash_after_the_source_commit_before_commit_prepared_commits_it(
    tmp_path: Path,
    new_2pc_database: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="bridge.forwarding.in_doubt")
    sender, receiver = new_2pc_database(), new_2pc_database()
    setup = make_setup(tmp_path, sender, receiver)
    ids = send(sender, 50)
    config, connections, forwarder = in_process(setup)
    # The bridge dies right after the source commit: nothing commits what was prepared.
    monkeypatch.setattr(BatchTransactions, "commit_prepared", lambda self, dialects: 0)
    forwarder.forward_batch()
    assert pg_count(sender, FORWARD) == 0
    assert pg_count(receiver, RECEIVER) == 0
    assert len(prepared(receiver)) == 1

    settled = resolve_in_doubt(config, connections)
    assert (settled.committed, settled.rolled_back) == (1, 0)
    assert prepared(receiver) == []
    assert received(receiver) == Counter(dict.fromkeys(ids, 1))
    # Prepared moments ago: its batch may have been about to commit it, so no warning that a
    # batch did not finish (a live batch's, settled by a resolver first, was said so).
    [said] = [r for r in caplog.records if r.name == "bridge.forwarding.in_doubt"]
    assert said.levelno == logging.INFO and "about to" in said.getMessage()
    assert pg_count(sender, f"{TRANSACTIONS} WHERE outcome IN ('C', 'A')") == 0
    connections.close()


def test_a_resolver_leaves_alone_what_a_running_batch_has_prepared(
    tmp_path: Path, new_2pc_database: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender, receiver = new_2pc_database(), new_2pc_database()
    setup = make_setup(tmp_path, sender, receiver)
    ids = send(sender, 40)
    config, connections, forwarder = in_process(setup)
    prepared_now, go_on = threading.Event(), threading.Event()
    settle = Settlement.settle

    def settle_slowly(self: Settlement, *args: Any, **kwargs: Any) -> Any:
        prepared_now.set()  # the destination is prepared; the source has not committed
        assert go_on.wait(30)
        return settle(self, *args, **kwargs)

    monkeypatch.setattr(Settlement, "settle", settle_slowly)
    batch = threading.Thread(target=forwarder.forward_batch)
    batch.start()
    assert prepared_now.wait(30)
    other = Connections(config.databases)  # another daemon's resolver
    settled = resolve_in_doubt(config, other)
    assert (settled.committed, settled.rolled_back, settled.undecided) == (0, 0, 1)
    assert len(prepared(receiver)) == 1
    go_on.set()
    batch.join(30)
    assert received(receiver) == Counter(dict.fromkeys(ids, 1))
    assert prepared(receiver) == []
    other.close()
    connections.close()


def test_a_destination_lost_between_prepare_and_commit_is_committed_when_back(
    tmp_path: Path, new_2pc_database: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender, receiver = new_2pc_database(), new_2pc_database()
    setup = make_setup(tmp_path, sender, receiver)
    ids = send(sender, 30)
    config, connections, forwarder = in_process(setup)
    settle = Settlement.settle
    receiver_name = pg_rows(receiver, "SELECT current_database()")[0][0]

    def settle_and_lose_the_destination(self: Settlement, *args: Any, **kwargs: Any) -> Any:
        with pg_connect(sender) as admin:  # any database of the same server will do
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = ?",
                receiver_name,
            )
        return settle(self, *args, **kwargs)

    monkeypatch.setattr(Settlement, "settle", settle_and_lose_the_destination)
    report = forwarder.forward_batch()
    assert report.counts == Counter({"delivered": 30})
    # The source committed; COMMIT PREPARED found its connection gone: still prepared.
    assert pg_count(sender, FORWARD) == 0
    monkeypatch.setattr(Settlement, "settle", settle)
    assert len(prepared(receiver)) == 1
    settled = resolve_in_doubt(config, connections)
    assert settled.committed == 1
    assert received(receiver) == Counter(dict.fromkeys(ids, 1))
    assert prepared(receiver) == []
    connections.close()


def test_at_least_once_counts_the_duplicates_a_crash_between_the_commits_makes(
    tmp_path: Path, new_2pc_database: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender, receiver = new_2pc_database(), new_2pc_database()
    setup = make_setup(tmp_path, sender, receiver, transaction="at-least-once")
    assert bridge_tables(receiver) == []
    ids = send(sender, 25)
    config, connections, forwarder = in_process(setup)
    connections._open[("sender", "")] = CommitFailsOnce(connections.get("sender"))
    with pytest.raises(ConnectionLost):
        forwarder.forward_batch()
    assert pg_count(receiver, RECEIVER) == 25 and pg_count(sender, FORWARD) == 25
    forwarder.forward_batch()  # delivered again: this mode has no ledger
    assert received(receiver) == Counter(dict.fromkeys(ids, 2))

    monkeypatch.setattr(bridge.forwarding.in_doubt, "ORPHAN_AGE", timedelta(0))
    settled = resolve_in_doubt(config, connections)
    assert settled.suspected_duplicates == Counter({"sender": 25})
    assert pg_count(sender, TRANSACTIONS + " WHERE outcome = 'P'") == 0
    counted = pg_rows(
        sender,
        "SELECT sum(value) FROM sfbridge_counters WHERE counter = 'suspected_duplicates'",
    )
    assert counted[0][0] == 25
    # A batch that commits normally leaves no record, so nothing more is suspected.
    send(sender, 10)
    forwarder.forward_batch()
    assert resolve_in_doubt(config, connections).suspected_duplicates == Counter()
    connections.close()


@pytest.mark.slow
def test_a_storm_of_sigkills_on_competing_daemons_leaves_every_message_exactly_once(
    tmp_path: Path, new_2pc_database: Any
) -> None:
    """The issue's "done when": two-phase PostgreSQL -> PostgreSQL with no bridge table in the
    destination, two competing daemons SIGKILLed at random moments (at least ten kills) while
    thousands of messages are being sent and forwarded."""
    import random

    from support import DaemonProcess, wait_until

    sender, receiver = new_2pc_database(), new_2pc_database()
    # Small batches, so that a kill lands between a PREPARE and its COMMIT PREPARED often.
    setup = make_setup(tmp_path, sender, receiver, batch_size=40, peek_interval="20ms")
    rng = random.Random(13)
    sent: set[str] = set()
    stop_sending = threading.Event()

    def keep_sending() -> None:  # about 250 messages a second, for the whole storm
        while not stop_sending.is_set() and len(sent) < 4000:
            sent.update(send(sender, 50))
            stop_sending.wait(0.2)  # pacing only: nothing is asserted after it

    sending = threading.Thread(target=keep_sending)
    sending.start()
    daemons = [DaemonProcess(setup["config"], tmp_path / f"daemon-{n}.log") for n in range(2)]
    kills, left_prepared = 0, 0
    try:
        while kills < 16 or len(sent) < 3000:
            # Each kill lands while the daemons are at work: after delivery has gone on since
            # the last one (or all was delivered), at a random moment within a batch or two.
            before = pg_count(receiver, RECEIVER)

            def went_on(before: int = before) -> bool:
                delivered = pg_count(receiver, RECEIVER)
                return delivered > before or delivered >= len(sent) >= 4000

            wait_until(went_on, 60, "delivery to go on between kills")
            stop_sending.wait(rng.uniform(0.1, 0.6))
            victim = kills % 2
            daemons[victim].kill()
            kills += 1
            left_prepared += len(prepared(receiver))
            daemons[victim] = DaemonProcess(setup["config"], tmp_path / f"daemon-{kills}.log")
        stop_sending.set()
        sending.join(60)
        assert bridge_tables(receiver) == []
        wait_until(lambda: pg_count(receiver, RECEIVER) >= len(sent), 120, "every message")
        # The settling round (every retry delay) commits or rolls back what the kills left.
        wait_until(lambda: prepared(receiver) == [], 30, "prepared transactions to be settled")
        for daemon in daemons:
            assert daemon.stop() == 0, daemon.output()
    finally:
        stop_sending.set()
        for daemon in daemons:
            if daemon.process.poll() is None:
                daemon.kill()
    got = received(receiver)
    assert kills >= 10
    assert set(got) == sent and max(got.values()) == 1, (len(got), len(sent))
    assert prepared(receiver) == [], "prepared transactions left behind"
    assert pg_count(sender, FORWARD) == 0
    assert pg_count(sender, '"public"."sfbridge_retry"') == 0
    assert pg_count(sender, '"public"."error"') == 0
    logs = "".join(path.read_text() for path in tmp_path.glob("daemon-*.log"))
    settled = logs.count("left by a batch that did not finish")
    print(
        f"{kills} kills, {len(sent)} messages, {left_prepared} prepared found right after a "
        f"kill, {settled} settled by a resolver"
    )


def test_check_and_status_report_what_the_transaction_modes_need_and_leave(
    tmp_path: Path, new_2pc_database: Any, new_pg_database: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bridge.commands.check import run_checks
    from bridge.commands.status import collect_status, render_text

    sender, receiver = new_2pc_database(), new_2pc_database()
    setup = make_setup(tmp_path, sender, receiver)
    config, connections, _ = in_process(setup)
    findings = [str(f) for f in run_checks(config)]
    [(allowed,)] = pg_rows(receiver, "SHOW max_prepared_transactions")
    assert any("receiver" in f and f"allows {allowed} prepared transactions" in f for f in findings)
    assert not any(f.startswith("PROBLEM") for f in findings), findings

    # A prepared transaction of the bridge that nobody settles is a problem for both.
    with pg_connect(receiver) as connection:
        connection.execute(
            f"INSERT INTO {RECEIVER} (id, headers) VALUES (gen_random_uuid(), '{{}}')"
        )
        connection.execute("PREPARE TRANSACTION 'sfbridge:00000000:left-behind'")
    monkeypatch.setattr(bridge.forwarding.in_doubt, "PREPARED_REPORT_AGE", 0.0)
    problems = [str(f) for f in run_checks(config) if not f.ok]
    assert len(problems) == 1 and "prepared transaction(s) of the bridge older" in problems[0]
    assert "sfbridge:00000000:left-behind" in problems[0]
    status = collect_status(config)
    assert [e["gid"] for e in status["prepared_transactions"]] == ["sfbridge:00000000:left-behind"]
    assert "PREPARED TRANSACTION left in database 'receiver'" in render_text(status)
    with pg_connect(receiver) as connection:
        connection.autocommit = True
        connection.execute("ROLLBACK PREPARED 'sfbridge:00000000:left-behind'")

    # An at-least-once route is named as running without exactly-once.
    path = write_config(
        tmp_path / "alo.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": sender},
                "receiver": {"dialect": "postgresql", "connection": receiver},
            },
            "forwarders": [{"name": "sender", "database": "sender", "queue": FORWARD}],
            "routes": [{"match": "*", "database": "receiver"}],
            "delivery": {"transaction": "at-least-once"},
        },
    )
    warnings = [str(f) for f in run_checks(load_config(path)[0]) if f.warning]
    assert any("routes[0]" in w and "without exactly-once" in w for w in warnings), warnings
    connections.close()


def test_a_destination_without_prepared_transactions_makes_messages_wait_with_advice(
    tmp_path: Path, new_pg_database: Any, postgres: Any
) -> None:
    from bridge.commands.check import run_checks

    with postgres.admin() as admin:
        if int(admin.execute("SHOW max_prepared_transactions").fetchone()[0]) > 0:
            pytest.skip("the test server allows prepared transactions")
    sender, receiver = new_pg_database(), new_pg_database()
    setup = make_setup(tmp_path, sender, receiver)
    ids = send(sender, 10)
    config, connections, forwarder = in_process(setup)
    report = forwarder.forward_batch()
    assert report.counts == Counter({"retries-scheduled": 10})
    assert pg_count(sender, '"public"."sfbridge_retry"') == 10 and pg_count(receiver, RECEIVER) == 0
    errors = pg_rows(sender, "SELECT DISTINCT last_error FROM sfbridge_retry")
    assert "max_prepared_transactions = 0" in errors[0][0] and "restart" in errors[0][0]
    problems = [str(f) for f in run_checks(config) if not f.ok]
    assert any("max_prepared_transactions is 0" in p for p in problems), problems
    assert len(ids) == 10
    connections.close()
