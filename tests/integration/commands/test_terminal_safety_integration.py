"""Nothing a sender writes can act on the operator's terminal: header text that would clear the
screen, retitle the terminal and print a forged line is shown inert by every command that
shows message data (errors list / show, retries list, status, route, send), through the real
CLI against PostgreSQL with a running daemon."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from support import ERROR_QUEUE, RETRY_TABLE, pg_count, wait_until
from support.pairs import PgPair

pytestmark = pytest.mark.integration

# Clear the screen, retitle the terminal, ring the bell, CSI as one C1 byte, a right-to-left
# override, a line separator, then a carriage return and line feed and a line of its own.
HOSTILE = "\x1b[2J\x1b]0;pwned\x07 \x9b31m \u202eevil\u2028 \x7f\r\nFAKE LINE: all good"
# The same in a destination, within a table name's 55 bytes.
HOSTILE_QUEUE = "R\x1b]0;pwned\x07\x9b\u202e\r\nFAKE LINE"
# What must never reach the terminal raw.
ACTIVE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _assert_inert(result: subprocess.CompletedProcess[str], what: str) -> None:
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        found = ACTIVE.search(text)
        assert found is None, f"{what} {name} has {found.group(0)!r}: {text!r}"
        forged = [line for line in text.splitlines() if line.lstrip().startswith("FAKE")]
        assert not forged, f"{what} {name} starts a line with the sender's text: {forged}"


def test_hostile_header_text_prints_inert_everywhere(
    pg_pair_factory: Callable[..., PgPair], tmp_path: Path
) -> None:
    # No receiver queue: the messages wait in retry storage, with their hostile text.
    pair = pg_pair_factory(create_queue=False, retries={"delay": "1h", "max_delay": "1h"})
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        hostile_id = "id" + HOSTILE
        pair.send(1, **{"X-Evil": HOSTILE, "NServiceBus.MessageId": hostile_id})
        pair.send(1, destination=HOSTILE_QUEUE)
        wait_until(lambda: pg_count(pair.sender, RETRY_TABLE) == 2, 30, "both messages waiting")
        listed = pair.cli("retries", "list")
        assert listed.returncode == 0 and "\\x1b]0;pwned\\x07" in listed.stdout, listed.stdout
        _assert_inert(listed, "retries list")
        status = pair.cli("status")
        assert "\\x1b]0;pwned\\x07" in status.stdout, status.stdout
        _assert_inert(status, "status")

        failed = pair.cli("retries", "fail", "--yes")
        assert failed.returncode == 0, failed.stderr
        _assert_inert(failed, "retries fail")
        assert pg_count(pair.sender, ERROR_QUEUE) == 2
        errors = pair.cli("errors", "list")
        assert "\\x1b[2J" in errors.stdout, errors.stdout
        _assert_inert(errors, "errors list")
        shown = pair.cli("errors", "show", hostile_id)
        assert shown.returncode == 0, shown.stderr
        assert "X-Evil: \\x1b[2J\\x1b]0;pwned\\x07" in shown.stdout, shown.stdout
        _assert_inert(shown, "errors show")
        _assert_inert(pair.cli("errors", "show", "no" + HOSTILE), "errors show (not found)")
        _assert_inert(pair.cli("errors", "replay", "--dry-run"), "errors replay")
        _assert_inert(pair.cli("route", HOSTILE_QUEUE), "route")
        _assert_inert(pair.cli("send", HOSTILE_QUEUE), "send")
        # The MessageIds it echoes are the sender's text too.
        sent = pair.cli("send", "R", "--header", f"NServiceBus.MessageId=evil-{HOSTILE}")
        assert sent.returncode == 0 and "evil-\\x1b[2J" in sent.stdout, sent.stdout + sent.stderr
        _assert_inert(sent, "send --header NServiceBus.MessageId")
        assert daemon.process.poll() is None
        log = daemon.output()
        assert ACTIVE.search(log) is None, log
