"""`logging.format`: JSON lines a standard parser reads one by one, and journal entries in
systemd's native protocol, both with the fields a line is about; message data inert in both,
passwords masked."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.daemon import journal
from bridge.daemon.journal import JournalHandler, encode, journal_fields, under_journald
from bridge.daemon.observability import JsonFormatter, SecretMaskingFilter, log_handler
from bridge.messages import about

SECRET = "hunter2-Secret"


@pytest.fixture
def json_log() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(SecretMaskingFilter())
    logger = logging.getLogger("test.json")
    logger.addHandler(handler)
    logger.propagate = False
    yield logger, stream
    logger.removeHandler(handler)


def test_a_json_line_has_the_fields_and_stays_one_line_whatever_the_data(
    json_log: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = json_log
    forged = "Q\x1b]0;pwned\x07\r\n2026-01-01 INFO forged\u2028x"
    logger.warning(
        "to %s: %s",
        forged,
        f"Server=db;Pwd={SECRET}",
        extra=about(forwarder="orders", message_ids=["id-1", "id\n2"], error_code="missing-queue"),
    )
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    assert not any(c in text for c in ("\x1b", "\x07", "\r", "\u2028"))
    assert SECRET not in text
    line = json.loads(text)
    assert line["level"] == "WARNING" and line["logger"] == "test.json"
    assert line["time"].endswith("+00:00")
    assert line["message"] == (
        "to Q\\x1b]0;pwned\\x07\\x0d\\x0a2026-01-01 INFO forged\\u2028x: Server=db;Pwd=***"
    )
    assert line["forwarder"] == "orders" and line["error_code"] == "missing-queue"
    assert line["MessageIds"] == ["id-1", "id\\x0a2"]
    assert "database" not in line  # only what the line is about


def test_a_json_line_carries_its_traceback_masked(
    json_log: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = json_log
    try:
        raise RuntimeError(f"driver said Pwd={SECRET}")
    except RuntimeError:
        logger.exception("batch failed")
    [line] = [json.loads(text) for text in stream.getvalue().splitlines()]
    assert "RuntimeError: driver said Pwd=***" in line["exception"]
    assert SECRET not in stream.getvalue()


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord(
        "bridge.outages", logging.ERROR, "/x/outages.py", 7, message, args, None
    )
    for key, value in extra.items():
        setattr(made, key, value)
    SecretMaskingFilter().filter(made)
    return made


def decode(datagram: bytes) -> dict[str, str]:
    """The native protocol read back: NAME=value lines, and NAME\\n<le64 size><value>\\n."""
    fields: dict[str, str] = {}
    position = 0
    while position < len(datagram):
        end = datagram.index(b"\n", position)
        line = datagram[position:end]
        if b"=" in line:
            name, _, value = line.partition(b"=")
            fields[name.decode()] = value.decode()
            position = end + 1
        else:
            (size,) = struct.unpack("<Q", datagram[end + 1 : end + 9])
            fields[line.decode()] = datagram[end + 9 : end + 9 + size].decode()
            assert datagram[end + 9 + size : end + 10 + size] == b"\n"
            position = end + 10 + size
    return fields


def test_journal_fields_give_the_priority_the_logger_and_what_the_line_is_about() -> None:
    made = record(
        "database '%s' cannot be reached", "receiver\x1b[2J", **about(database="receiver\x1b[2J")
    )
    fields = dict(journal_fields(made, made.getMessage()))
    assert fields["MESSAGE"] == "database 'receiver\\x1b[2J' cannot be reached"
    assert fields["PRIORITY"] == "3" and fields["SYSLOG_IDENTIFIER"] == "sfbridge"
    assert fields["LOGGER"] == "bridge.outages" and fields["CODE_LINE"] == "7"
    assert fields["DATABASE"] == "receiver\\x1b[2J"
    assert "FORWARDER" not in fields
    made = record("moved", **about(message_ids=["id-1", "id-2"]))
    assert [v for n, v in journal_fields(made, "moved") if n == "MESSAGE_IDS"] == ["id-1", "id-2"]


def test_a_value_with_a_line_break_is_sent_with_its_length() -> None:
    datagram = encode([("MESSAGE", "failed\nTraceback: ..."), ("PRIORITY", "3")])
    assert datagram == (
        b"MESSAGE\n" + struct.pack("<Q", 21) + b"failed\nTraceback: ...\nPRIORITY=3\n"
    )
    assert decode(datagram) == {"MESSAGE": "failed\nTraceback: ...", "PRIORITY": "3"}


def test_the_journal_handler_sends_one_datagram_per_record(tmp_path: Path) -> None:
    address = str(tmp_path / "journal.socket")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(address)
    fallback = logging.StreamHandler(io.StringIO())
    handler = JournalHandler(fallback, address=address)
    try:
        handler.handle(record("%d message(s) to %s", 3, "Q\r\nforged", **about(forwarder="o")))
        fields = decode(server.recv(65536))
    finally:
        handler.close()
        server.close()
    assert fields["MESSAGE"] == "3 message(s) to Q\\x0d\\x0aforged"
    assert fields["FORWARDER"] == "o" and fields["PRIORITY"] == "3"


def test_the_journal_handler_falls_back_to_text_when_the_socket_is_gone(tmp_path: Path) -> None:
    stream = io.StringIO()
    fallback = logging.StreamHandler(stream)
    handler = JournalHandler(fallback, address=str(tmp_path / "none"))
    handler.handle(record("database '%s' is usable again", "receiver"))
    handler.close()
    assert stream.getvalue() == "database 'receiver' is usable again\n"


def test_auto_is_the_journal_only_where_stderr_is_the_journal_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    socket_path = tmp_path / "socket"
    socket_path.touch()
    monkeypatch.setattr(journal, "JOURNAL_SOCKET", str(socket_path))
    stderr = (tmp_path / "stderr").open("w")
    monkeypatch.setattr(sys, "stderr", stderr)
    stat = os.fstat(stderr.fileno())
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    assert not under_journald()
    assert isinstance(log_handler("auto").formatter, logging.Formatter)
    monkeypatch.setenv("JOURNAL_STREAM", f"{stat.st_dev}:{stat.st_ino + 1}")
    assert not under_journald()  # stderr redirected elsewhere by the service
    monkeypatch.setenv("JOURNAL_STREAM", f"{stat.st_dev}:{stat.st_ino}")
    assert under_journald()
    for chosen in ("auto", "journal"):
        handler = log_handler(chosen)
        assert isinstance(handler, JournalHandler)
        handler.close()
    assert not isinstance(log_handler("text"), JournalHandler)
    assert isinstance(log_handler("json").formatter, JsonFormatter)
    stderr.close()
