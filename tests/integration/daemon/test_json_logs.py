"""`logging.format: json`: every line a real daemon writes is one JSON object that a standard
parser reads, with the fields of what it is about, and message data in it inert."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from support import ERROR_QUEUE, DaemonProcess, pg_count, wait_until
from support.pairs import PgPair

pytestmark = pytest.mark.integration

# A destination that forges a log line, retitles the terminal and turns its text red.
FORGED = '"public"."Evil\x1b]0;pwned\x07\x1b[31m\r\n2026-01-01 INFO forged line\u2028x"'


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of `text` parsed on its own (a line that is not one JSON object fails)."""
    lines = text.split("\n")
    assert lines[-1] == "", "the log ends with a line break"
    return [json.loads(line) for line in lines[:-1]]


def test_every_line_parses_as_json_with_its_fields_and_message_data_inert(
    pg_pair_factory: Callable[..., PgPair], start_daemon: Callable[..., DaemonProcess]
) -> None:
    # One attempt: the forged destination (no such queue) goes to the error queue at once.
    pair = pg_pair_factory(logging={"format": "json"}, retries={"max_attempts": 1})
    daemon = start_daemon(pair.config)
    [forged] = pair.send(1, destination=FORGED)
    pair.send(2, destination=None)  # no destination header: the error queue, with a reason
    wait_until(lambda: pg_count(pair.sender, ERROR_QUEUE) == 3, 30, "the error queue")
    daemon.wait_for_output("moved to the error queue", count=1)
    assert daemon.stop() == 0
    text = daemon.output()
    lines = json_lines(text)
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    assert all(line["time"].endswith("+00:00") for line in lines)
    errors = [line for line in lines if "error queue" in line["message"]]
    assert errors, text
    for line in errors:
        assert line["forwarder"] == "sender" and line["error_code"], line
        assert line["MessageIds"], line
    named = [line for line in lines if forged in line.get("MessageIds", [])]
    assert named, "the forged message's line names its MessageId"
    # The destination's control characters are written out as escapes, in the message and
    # in the file: nothing a terminal or a log reader would act on.
    for character in ("\x1b", "\x07", "\r", "\u2028"):
        assert character not in text
        assert all(character not in line["message"] for line in lines)
    assert any("\\x1b]0;pwned" in line["message"] for line in lines), text
