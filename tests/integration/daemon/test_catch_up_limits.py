"""Catch-up limits on a destination database, through the real daemon in two worker processes:
a backlog drains no faster than `max_messages_per_second` allows, exactly once, and `sfbridge
status` says what the limits held back."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from support import wait_until
from support.faults import assert_settled
from support.pairs import PgPair

RATE = 1000
BACKLOG = 3000


def test_a_backlog_drains_at_the_catch_up_rate_and_status_says_it_was_held_back(
    tmp_path: Path, pg_pair_factory: Callable[..., PgPair]
) -> None:
    pair = pg_pair_factory(
        receiver_database={"max_messages_per_second": RATE, "max_batches_in_flight": 1},
        forwarder={"batch_size": 100, "concurrency": 4, "peek_interval": "100ms"},
        daemon={"processes": 2},
    )
    ids = pair.send(BACKLOG)
    daemon = pair.daemon(tmp_path / "daemon.log")
    with daemon:
        wait_until(lambda: pair.delivered() > 0, 30, "the first delivery")
        started, first = time.monotonic(), pair.delivered()
        wait_until(lambda: pair.delivered() == BACKLOG, 60, "the backlog to drain")
        rate = (BACKLOG - first) / (time.monotonic() - started)
        print(f"\ndrained at {rate:.0f} msg/s with a limit of {RATE}")
        # A lower bound only: a slow machine may drain slower, never faster than allowed
        # (one batch of slack, and the 0.2 s of polling).
        assert rate < RATE * 1.15, rate
        text = pair.cli("status").stdout
        assert "catch-up limits    held back" in text, text
        assert_settled(pair, ids)
        assert daemon.stop() == 0, daemon.output()[-3000:]
