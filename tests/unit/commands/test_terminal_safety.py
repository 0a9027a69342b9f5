"""Nothing a sender writes can act on the operator's terminal: header text that would clear the
screen, retitle the terminal and print a forged line is shown inert by every command that
shows message data (errors list / show, retries list, status, route, send), through the real
CLI against PostgreSQL with a running daemon."""

from __future__ import annotations

import re

from bridge.secrets import inert

# Clear the screen, retitle the terminal, ring the bell, CSI as one C1 byte, a right-to-left
# override, a line separator, then a carriage return and line feed and a line of its own.
HOSTILE = "\x1b[2J\x1b]0;pwned\x07 \x9b31m \u202eevil\u2028 \x7f\r\nFAKE LINE: all good"
# What must never reach the terminal raw.
ACTIVE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def test_unit_inert_escapes_every_control_and_keeps_letters() -> None:
    shown = inert(HOSTILE + " Zürich 日本")
    assert ACTIVE.search(shown) is None and "\n" not in shown
    assert shown.endswith("\\x0d\\x0aFAKE LINE: all good Zürich 日本")
    assert "\\x1b[2J\\x1b]0;pwned\\x07 \\x9b31m \\u202eevil\\u2028 \\x7f" in shown
