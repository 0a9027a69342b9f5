"""The daemon's sessions on the forwarding and destination databases ended with
`pg_terminate_backend` every 300 ms for 10 s while 3,000 messages flow (issue 34), a black box:
with the ledger and two-phase every message ends in the receiver exactly once, nothing in the
error queue or retry storage, the daemon READY; with at-least-once, the suspected duplicates
it warns of are exactly those it cannot know about."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import pg_rows, wait_until
from support.faults import (
    SUSPECTED,
    UNKNOWN,
    SessionKiller,
    assert_settled,
    database_name,
    prepared_transactions,
    receiver_ids,
    send_steadily,
    time_to_flow,
)
from support.pairs import PgPair, make_pg_pair

MESSAGES = 3000
STORM_SECONDS = 10.0
# Small batches, so that the kills strike many of them.
FORWARDER = {"peek_interval": "100ms", "batch_size": 50}
# Smaller still for at-least-once: what is counted is struck between a destination's write and
# its commit, or the source's, a window of a few round trips per batch.
AT_LEAST_ONCE_FORWARDER = {"peek_interval": "100ms", "batch_size": 5}


def storm(
    pair: PgPair, admin: Callable[[], Any], body: bytes = b"x"
) -> tuple[set[str], SessionKiller]:
    """Send MESSAGES over the storm while the daemon's sessions are killed; the ids."""
    killer = SessionKiller(admin, [database_name(pair.sender), database_name(pair.receiver)])
    killer.start()
    try:
        ids = send_steadily(pair, MESSAGES, STORM_SECONDS, body)
    finally:
        killer.stop()
    return ids, killer


def test_killed_sessions_lose_and_duplicate_nothing_with_the_ledger(
    tmp_path: Path, pg_pair_factory: Callable[..., PgPair], postgres: Any
) -> None:
    pair = pg_pair_factory(forwarder=FORWARDER)
    check_storm(tmp_path, pair, postgres.admin)


@pytest.mark.xdist_group("two-phase-faults")
def test_killed_sessions_lose_and_duplicate_nothing_with_two_phase(
    tmp_path: Path, two_phase_postgres: Any
) -> None:
    sender, receiver = (
        two_phase_postgres.connection_string(two_phase_postgres.create_database()) for _ in range(2)
    )
    pair = make_pg_pair(
        tmp_path, sender, receiver, route={"transaction": "two-phase"}, forwarder=FORWARDER
    )
    check_storm(tmp_path, pair, two_phase_postgres.admin)
    wait_until(lambda: prepared_transactions(receiver) == [], 30, "no prepared transaction left")


def check_storm(tmp_path: Path, pair: PgPair, admin: Callable[[], Any]) -> None:
    daemon = pair.daemon(tmp_path / "daemon.log")
    with daemon:
        wait_until(daemon.started, 30, "the daemon to start")
        ids, killer = storm(pair, admin)
        flowing, probe = time_to_flow(pair)
        print(
            f"\n{killer.killed} sessions killed in {killer.rounds} rounds; flowing again "
            f"{flowing:.2f} s after the last"
        )
        assert killer.killed > 20  # the storm struck
        assert_settled(pair, ids | probe)
        assert daemon.stop() == 0, daemon.output()[-3000:]


def test_at_least_once_warns_of_the_duplicates_it_cannot_rule_out_and_only_of_those(
    tmp_path: Path, pg_pair_factory: Callable[..., PgPair], postgres: Any
) -> None:
    pair = pg_pair_factory(
        forwarder=AT_LEAST_ONCE_FORWARDER, route={"transaction": "at-least-once"}
    )
    daemon = pair.daemon(tmp_path / "daemon.log")
    with daemon:
        wait_until(daemon.started, 30, "the daemon to start")
        # Bodies of 1 KiB: a batch's destination write takes long enough for kills to strike
        # it (and the source meanwhile) often.
        ids, killer = storm(pair, postgres.admin, b"b" * 1024)
        assert killer.killed > 20
        wait_until(lambda: pair.delivered() >= MESSAGES and pair.queued() == 0, 60, "delivery")
        # Every record in flight is gone: dropped by its batch, or counted by the sweep.
        wait_until(
            lambda: (
                pg_rows(
                    pair.sender, "SELECT count(*) FROM sfbridge_transactions WHERE outcome = 'P'"
                )[0][0]
                == 0
            ),
            30,
            "the records in flight to be settled",
        )
        assert daemon.stop() == 0, daemon.output()[-3000:]
    log = daemon.output()
    warned = [i for line in SUSPECTED.findall(log) for i in line.split(", ")]
    unknown = {i for line in UNKNOWN.findall(log) for i in line.split(", ")}
    received = receiver_ids(pair)
    duplicated = {i for i, n in received.items() if n > 1}
    counted = pg_rows(
        pair.sender,
        "SELECT coalesce(sum(value), 0) FROM sfbridge_counters "
        "WHERE counter = 'suspected_duplicates'",
    )[0][0]
    print(
        f"\n{killer.killed} sessions killed; {len(unknown)} message(s) of commits without an "
        f"answer, {len(warned)} warned of, {len(duplicated)} really twice in the receiver"
    )
    assert set(received) == ids
    assert counted == len(warned)
    # Each message delivered twice was warned of; each warned of but there once was in a
    # commit whose outcome the daemon could not know.
    assert duplicated <= set(warned), duplicated - set(warned)
    assert set(warned) - duplicated <= unknown, sorted(set(warned) - duplicated - unknown)[:5]
