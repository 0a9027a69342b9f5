"""Log records straight into systemd's journal, with fields of their own.

Under systemd, stderr already goes to the journal, one entry a line, with the unit's name and
the priority guessed from nothing. Written with the journal's native protocol instead, each
entry has its `PRIORITY`, the logger, the code location, and what the line is about
(`FORWARDER`, `DATABASE`, `MESSAGE_IDS`, `ERROR_CODE`: `bridge.messages`), so that
`journalctl -u sfbridge FORWARDER=orders -p warning` finds what it should, and a traceback
stays one entry.

The protocol is a datagram to `/run/systemd/journal/socket` of `NAME=value` lines, or for a
value with a line break `NAME`, a line break, its length as 64-bit little-endian and the value
(systemd's "Native Journal Protocol"). Written here in a few lines rather than with the
`systemd` Python package, which would be a compiled dependency for one `sendto`. An entry too
large for one datagram is cut (systemd would take it through a memfd; a log line of the bridge
is never that large but for a traceback quoting a huge value); when the socket cannot be used
at all, the line goes to stderr as text, never lost.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import sys
from collections.abc import Iterable

from bridge.messages import FIELDS
from bridge.secrets import inert, mask_secrets

JOURNAL_SOCKET = "/run/systemd/journal/socket"

# What a datagram carries at most here: well under the default socket buffer of Linux.
MAX_MESSAGE_BYTES = 48 * 1024

_PRIORITIES = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


def under_journald() -> bool:
    """Whether stderr is systemd's journal stream (`JOURNAL_STREAM` names its device and
    inode) and the journal's socket is there."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    device, _, inode = stream.partition(":")
    try:
        stat = os.fstat(sys.stderr.fileno())
        return (int(device), int(inode)) == (stat.st_dev, stat.st_ino) and os.path.exists(
            JOURNAL_SOCKET
        )
    except (ValueError, OSError, AttributeError):
        return False


def journal_fields(record: logging.LogRecord, message: str) -> list[tuple[str, str]]:
    """The entry of `record`, whose text (already masked and inert, with its traceback) is
    `message`: the journal's own fields and what the line is about."""
    fields = [
        ("MESSAGE", message),
        ("PRIORITY", str(_priority(record.levelno))),
        ("SYSLOG_IDENTIFIER", "sfbridge"),
        ("LOGGER", record.name),
        ("CODE_FILE", record.pathname),
        ("CODE_LINE", str(record.lineno)),
        ("CODE_FUNC", record.funcName or ""),
    ]
    for attribute, (_, name) in FIELDS.items():
        value = getattr(record, attribute, None)
        if value is None:
            continue
        # A list is the field repeated, which the journal allows: `journalctl MESSAGE_IDS=<id>`
        # then finds the entry by any one of its ids.
        for item in value if isinstance(value, list) else [value]:
            fields.append((name, inert(mask_secrets(str(item)))))
    return fields


def encode(fields: Iterable[tuple[str, str]]) -> bytes:
    """The datagram of `fields` in the native protocol."""
    parts: list[bytes] = []
    for name, value in fields:
        data = value.encode("utf-8", "replace")
        if b"\n" in data:
            parts.append(name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n")
        else:
            parts.append(name.encode() + b"=" + data + b"\n")
    return b"".join(parts)


class JournalHandler(logging.Handler):
    """Sends each record to the journal; to `fallback` (stderr, as text) when it cannot."""

    def __init__(self, fallback: logging.Handler, address: str = JOURNAL_SOCKET) -> None:
        super().__init__()
        self._address = address
        self._fallback = fallback
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_text:
                message = f"{message}\n{record.exc_text}"
            if len(message) > MAX_MESSAGE_BYTES:
                message = message[:MAX_MESSAGE_BYTES] + " ... (cut)"
            self._socket.sendto(encode(journal_fields(record, message)), self._address)
        except OSError:
            self._fallback.handle(record)

    def close(self) -> None:
        self._socket.close()
        super().close()


def _priority(level: int) -> int:
    for threshold in sorted(_PRIORITIES, reverse=True):
        if level >= threshold:
            return _PRIORITIES[threshold]
    return 7
