"""`Notices`: a change of state said once, whichever process (or worker) saw it first."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from bridge.forwarding.notices import Notices

TABLE = ("postgresql", "receiver", '"public"."Samples.Receiver"')


def test_each_change_of_state_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    notices = Notices()
    caplog.set_level(logging.INFO, logger="bridge.forwarding.writes")
    for state, line in [
        ("refuses COPY", "refuses"),
        ("refuses COPY", "refuses, seen by another process"),
        ("takes COPY", "takes it again"),
        ("takes COPY", "takes it again, seen by another process"),
        ("refuses COPY", "refuses once more"),
    ]:
        notices.say("bridge.forwarding.writes", TABLE, state, logging.WARNING, line)
    # Another table's state is its own.
    notices.say("bridge.forwarding.writes", ("x",), "refuses COPY", logging.WARNING, "other")
    assert [r.getMessage() for r in caplog.records] == [
        "refuses",
        "takes it again",
        "refuses once more",
        "other",
    ]
    assert {r.name for r in caplog.records} == {"bridge.forwarding.writes"}


def test_a_worker_process_passes_every_notice_on(caplog: pytest.LogCaptureFixture) -> None:
    sent: list[tuple[Any, ...]] = []
    notices = Notices(relay=lambda *notice: sent.append(notice))
    caplog.set_level(logging.INFO)
    notice = ("bridge.forwarding.writes", TABLE, "refuses COPY", logging.WARNING, "line")
    for _ in range(2):
        notices.say(*notice)
    assert sent == [notice, notice]
    assert not caplog.records  # said by the daemon, not here
