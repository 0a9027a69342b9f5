"""`sfbridge pause` / `resume` against a running daemon, as an operator plans maintenance."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import RETRY_TABLE as RETRY
from support import PgPair, pg_count, pg_rows, pg_table_reads, wait_for_reads, wait_until

pytestmark = pytest.mark.integration

PAUSES = "sfbridge_pauses"


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


def test_what_is_sent_once_pause_returns_is_never_delivered_until_resume(
    pg_pair_factory: Any, tmp_path: Path
) -> None:
    # Push wakes a worker within milliseconds of a send; the 2 s peek interval keeps what a
    # worker last read of its pauses for 2 s. A pause that only took effect once read again
    # would let the messages sent right after it through.
    pair = pg_pair_factory(name="orders", forwarder={"peek_interval": "2s"})
    sent: set[str] = set()
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        for round_ in range(3):
            sent |= pair.send(3)
            expected = len(sent)
            wait_until(lambda n=expected: pair.delivered() == n, 30, "delivery before the pause")
            target = ["--destination", "receiver"] if round_ % 2 else []
            paused = pair.cli("pause", "orders", *target)
            assert paused.returncode == 0, paused.stdout + paused.stderr
            assert "were in flight" in paused.stdout and "all finished" in paused.stdout
            reads = pg_table_reads(pair.sender, PAUSES)
            held = pair.send(5)

            def held_or_delivered(
                n: int = expected, reads: int = reads, target: list[str] = target
            ) -> bool:
                if pair.delivered() > n:
                    return True  # what must not happen: fail below, not by a timeout
                if target:  # the batch that claimed them wrote them to retry storage instead
                    return pg_count(pair.sender, RETRY) == 5
                # A worker claimed them and read the pause after its claim, or read it first.
                return pg_table_reads(pair.sender, PAUSES) > reads

            wait_until(held_or_delivered, 30, "the messages to be claimed or held")
            assert pair.delivered() == expected, f"round {round_}: delivered while paused"
            assert pair.queued() == (0 if target else 5)
            sent |= held
            assert pair.cli("resume", "orders", *target).returncode == 0
        wait_until(lambda: pair.delivered() == len(sent), 30, "delivery after resume")
        assert daemon.stop() == 0, daemon.output()
    assert pair.received() == Counter(sent)


def test_a_paused_destination_waits_without_spending_attempts(pair: PgPair, tmp_path: Path) -> None:
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        first = pair.send(5)
        wait_until(lambda: pair.delivered() == 5, 30, "delivery before")
        assert pair.cli("pause", "orders", "--destination", "receiver").returncode == 0
        held = pair.send(20)  # at once: the pause holds from when the command returns
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
