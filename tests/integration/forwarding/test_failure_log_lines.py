"""2,000 unroutable messages through a running daemon are a handful of log lines: one per batch
and reason with a count and a few NServiceBus.MessageIds (the row Id where a message has none),
then the repeats summed ("... and N more in the last 3s ..."), once for all the daemon's
processes, never one line per message."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from support import ERROR_QUEUE, pg_count, wait_until
from support.pairs import pg_send

pytestmark = pytest.mark.integration

UNKNOWN = '"public"."Samples.Unknown"'
ORDERS = r"WARNING bridge\.forwarding\.settle: forwarder 'orders': "
FIRST = re.compile(
    ORDERS + r"([\d,]+) message\(s\) from .* moved to the error queue: .*\(MessageIds: (.*)\)$"
)
REPEAT = re.compile(
    ORDERS + r"\.\.\. and ([\d,]+) more in the last 3s from .*\(MessageIds: (.*)\)$"
)


def test_thousands_of_unroutable_messages_are_a_few_lines_with_counts_and_message_ids(
    pg_pair_factory: Any, tmp_path: Path
) -> None:
    pair = pg_pair_factory(
        name="orders",
        # One batch at a time, so that the first line is of the first batch claimed (two at
        # once, on a loaded machine the second could be told first).
        forwarder={"batch_size": 250, "concurrency": 1},
        route={"match": "Samples.Receiver"},  # anything else is unroutable
        logging={"repeats": "3s"},
    )
    # The first two claimed: one without a MessageId, one whose MessageId holds an escape
    # sequence that must stay inert on the terminal reading the journal.
    pg_send(pair.sender, pair.forward, 1, destination=UNKNOWN, **{"NServiceBus.MessageId": None})
    pg_send(pair.sender, pair.forward, 1, destination=UNKNOWN,
            **{"NServiceBus.MessageId": "evil\x1b[2Jid"})  # fmt: skip
    ids = pg_send(pair.sender, pair.forward, 1998, destination=UNKNOWN)
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        wait_until(lambda: pg_count(pair.sender, ERROR_QUEUE) == 2000, 60, "the error queue")

        def told() -> int:
            total = 0
            for line in daemon.output().splitlines():
                if match := FIRST.search(line) or REPEAT.search(line):
                    total += int(match.group(1).replace(",", ""))
            return total

        wait_until(lambda: told() == 2000, 30, "every message told in a line or a repeat")
        lines = [line for line in daemon.output().splitlines() if "Samples.Unknown" in line]
        assert daemon.stop() == 0, daemon.output()
    assert 2 <= len(lines) <= 6, "\n".join(lines)
    assert all(FIRST.search(line) or REPEAT.search(line) for line in lines), "\n".join(lines)
    # Told once for the daemon's processes: a new window at most every 3 s (1 s resolution).
    firsts = [datetime.fromisoformat(line[:19]) for line in lines if FIRST.search(line)]
    assert all(later - earlier >= timedelta(seconds=2) for earlier, later in pairwise(firsts))
    first = FIRST.search(lines[0])
    assert first is not None
    named = first.group(2).removesuffix(", ...").split(", ")
    assert named[0].startswith("row Id ")  # no MessageId: its row's
    assert named[1] == "evil\\x1b[2Jid"  # inert
    assert set(named[2:]) <= ids
    repeats = [match for line in lines if (match := REPEAT.search(line))]
    assert repeats, "\n".join(lines)
    assert set(repeats[-1].group(2).removesuffix(", ...").split(", ")) <= ids
    assert "\x1b" not in daemon.output()
