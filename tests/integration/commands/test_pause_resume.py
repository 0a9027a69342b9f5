"""`sfbridge pause` / `resume` against a running daemon, as an operator plans maintenance."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import RETRY_TABLE as RETRY
from support import PgPair, pg_count, pg_rows, wait_for_reads, wait_until

pytestmark = pytest.mark.integration

PAUSES = "sfbridge_pauses"
# A forwarder with work reads its pauses again once a second (docs/operating.md: "every daemon
# on its queue obeys within 1 s"); a little more for the read itself.
PAUSE_OBEYED_WITHIN = 1.5


@pytest.fixture
def pair(pg_pair_factory: Any) -> PgPair:
    return pg_pair_factory(name="orders", retries={"max_attempts": 2})


def status(pair: PgPair) -> dict[str, Any]:
    return pair.status()["forwarders"][0]  # type: ignore[no-any-return]


def test_a_paused_forwarder_holds_its_queue_and_delivers_it_after_resume(
    pair: PgPair, tmp_path: Path
) -> None:
    paused = pair.cli("pause", "orders", "--reason", "receiver upgrade")
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.startswith("paused forwarder 'orders': it claims nothing")
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        ids = pair.send(25)
        # Each of the two workers looks at its pauses once a second: once both have done so
        # twice with the messages there, a daemon that ignored the pause had delivered them.
        wait_for_reads(pair.sender, PAUSES, 4)
        assert pair.queued() == 25
        assert pair.delivered() == 0
        [pause] = status(pair)["paused"]
        assert pause["destination_database"] is None and pause["reason"] == "receiver upgrade"
        text = pair.cli("status").stdout
        assert "PAUSED             the whole forwarder: claims nothing" in text

        resumed = pair.cli("resume", "orders")
        assert resumed.stdout.startswith("resumed forwarder 'orders'"), resumed.stderr
        wait_until(lambda: pair.delivered() == 25, 30, "delivery after resume")
        assert daemon.stop() == 0, daemon.output()
    assert pair.received() == Counter(ids)
    assert status(pair)["paused"] == []
    again = pair.cli("resume", "orders")
    assert again.stdout.startswith("forwarder 'orders' was not paused")


def test_pausing_a_running_daemon_holds_what_is_sent_next_and_resume_delivers_it(
    pair: PgPair, tmp_path: Path
) -> None:
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        before = pair.send(10)
        wait_until(lambda: pair.delivered() == 10, 30, "delivery before")
        assert pair.cli("pause", "orders").returncode == 0
        # An idle daemon reads no pauses (it sends no queries per forwarder): what it sends
        # next is held by every daemon from `PAUSE_OBEYED_WITHIN` after the pause.
        obeyed = time.monotonic() + PAUSE_OBEYED_WITHIN
        wait_until(lambda: time.monotonic() >= obeyed, 5, "the pause to be obeyed")
        during = pair.send(15)
        wait_for_reads(pair.sender, PAUSES, 4)  # and gone round again with the messages there
        assert pair.queued() == 15
        assert pair.delivered() == 10
        assert pair.cli("resume", "orders").returncode == 0
        wait_until(lambda: pair.delivered() == 25, 30, "delivery after resume")
        assert daemon.stop() == 0, daemon.output()
    assert pair.received() == Counter(before | during)


def test_a_paused_destination_waits_without_spending_attempts(pair: PgPair, tmp_path: Path) -> None:
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        first = pair.send(5)
        wait_until(lambda: pair.delivered() == 5, 30, "delivery before")
        assert pair.cli("pause", "orders", "--destination", "receiver").returncode == 0
        obeyed = time.monotonic() + PAUSE_OBEYED_WITHIN  # as above
        wait_until(lambda: time.monotonic() >= obeyed, 5, "the pause to be obeyed")
        held = pair.send(20)
        wait_until(lambda: pg_count(pair.sender, RETRY) == 20, 30, "messages to wait")
        # max_attempts is 2 and the retry delay 1 s: once the workers have looked at retry
        # storage eight more times (each once a second), spent attempts would show.
        wait_for_reads(pair.sender, "sfbridge_retry", 8)
        rows = pg_rows(pair.sender, f"SELECT attempts, last_error FROM {RETRY}")
        assert len(rows) == 20 and {row[0] for row in rows} == {0}
        assert "database 'receiver' is paused since" in rows[0][1]
        assert pair.delivered() == 5
        assert pg_count(pair.sender, '"public"."error"') == 0

        assert pair.cli("resume", "orders", "--destination", "receiver").returncode == 0
        wait_until(lambda: pair.delivered() == 25, 30, "delivery after resume")
        assert daemon.stop() == 0, daemon.output()
    assert pair.received() == Counter(first | held)
    assert pg_count(pair.sender, RETRY) == 0


def test_pause_names_what_it_does_not_know(pair: PgPair) -> None:
    wrong = pair.cli("pause", "order")
    assert wrong.returncode == 2
    assert wrong.stderr == "sfbridge pause: no forwarder named 'order' (did you mean 'orders'?)\n"
    wrong = pair.cli("pause", "orders", "--destination", "reciever")
    assert wrong.returncode == 2
    assert "no database named 'reciever' (did you mean 'receiver'?)" in wrong.stderr
