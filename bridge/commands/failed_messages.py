"""Failed messages in an error queue, as the error-queue tools see them. Pure.

`describe` reads one error-queue row (its Id and Headers column) into a `FailedMessage`: where
it failed (`NServiceBus.FailedQ`), when, why (`$.sfbridge.failure-reason`), where it was going
and after how many attempts. `QueueOwners` tells which forwarder, if any, drains the queue a
message failed in: only those messages can be replayed by the bridge (what the commands select
by is in `bridge.commands.selection`). `replay_headers` takes off exactly the headers the
bridge added when it moved a message to the error queue, so a replayed message goes through
routing again as it was sent.
"""

from __future__ import annotations

import string
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from bridge.exceptions import PoisonHeaders
from bridge.headers import (
    ADDRESS_DATABASE_HEADER,
    ATTEMPTS_HEADER,
    DESTINATION_HEADER,
    EVENT_TYPE_HEADER,
    EXCEPTION_HEADER_PREFIX,
    FAILED_QUEUE_HEADER,
    FAILURE_REASON_HEADER,
    MESSAGE_ID_HEADER,
    PROCESSING_HOST_HEADERS,
    TIME_OF_FAILURE_HEADER,
    Headers,
    parse_headers,
    parse_wire_date,
)
from bridge.storage.error_counts import QueueOwners

# The reasons the bridge writes into `$.sfbridge.failure-reason` (see bridge.forwarding.classify,
# bridge.forwarding.settle and, for `sfbridge retries fail`, bridge.storage.retries), and the one
# the tools give a row whose headers cannot be read.
BRIDGE_REASONS = (
    "no-routing-header",
    "unroutable",
    "delivery-failed",
    "missing-queue",
    "outage-too-long",
    "no-subscribers",
    "bad-event-type",
    "unreadable-row",
    "failed-by-operator",
)
POISON = "poison"
REASONS = (*BRIDGE_REASONS, POISON)

EXCEPTION_MESSAGE_HEADER = EXCEPTION_HEADER_PREFIX + "Message"
EXCEPTION_TYPE_HEADER = EXCEPTION_HEADER_PREFIX + "ExceptionType"


@dataclass(frozen=True)
class FailedMessage:
    """One row of an error queue.

    `row_id` is the row's Id as the tools show it (canonical lower-case UUID text, or the
    column's text when it is not a UUID); `seq` its sequence column. `headers` is None for a
    poison row (`poison` says why). `forwarder` is the forwarder whose queue it failed in, or
    None with `not_replayable` saying why the bridge leaves it alone.
    """

    row_id: str
    seq: int
    headers: Headers | None
    poison: str | None = None
    forwarder: str | None = None
    not_replayable: str | None = None

    def header(self, name: str) -> str | None:
        return None if self.headers is None else self.headers.get(name)

    @property
    def failed_queue(self) -> str | None:
        return self.header(FAILED_QUEUE_HEADER)

    @property
    def reason(self) -> str | None:
        """The bridge's failure reason, `poison` for unreadable headers, else None."""
        return POISON if self.headers is None else self.header(FAILURE_REASON_HEADER)

    @property
    def failed_at(self) -> datetime | None:
        """`NServiceBus.TimeOfFailure` (aware UTC), None when missing or not a wire date."""
        text = self.header(TIME_OF_FAILURE_HEADER)
        return None if text is None else parse_wire_date(text)

    @property
    def destination(self) -> str | None:
        """The routing header: the destination address, or `event <type>` for an event."""
        destination = self.header(DESTINATION_HEADER)
        if destination is not None and destination.strip():
            return destination
        event_type = self.header(EVENT_TYPE_HEADER)
        if event_type is not None and event_type.strip():
            return f"event {event_type}"
        return None

    @property
    def attempts(self) -> int | None:
        text = self.header(ATTEMPTS_HEADER)
        try:
            return None if text is None else int(text)
        except ValueError:
            return None

    @property
    def exception_message(self) -> str | None:
        return self.poison if self.headers is None else self.header(EXCEPTION_MESSAGE_HEADER)

    @property
    def message_id(self) -> str | None:
        return self.header(MESSAGE_ID_HEADER)

    @property
    def known_as(self) -> frozenset[str]:
        """What names the message on the command line: its row Id and its
        `NServiceBus.MessageId`, each as `row_id_text` reads it (UUIDs in canonical form)."""
        names = {self.row_id}
        if self.message_id is not None:
            names.add(row_id_text(self.message_id))
        return frozenset(names)

    @property
    def replayable(self) -> bool:
        return self.forwarder is not None


def row_id_text(value: object) -> str:
    """An Id column's value as the tools show and compare it: canonical UUID text when it is
    one (whatever case or form the driver gives), else its text."""
    if isinstance(value, uuid.UUID):
        return str(value)
    text = str(value)
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return text


def describe(
    row_id: object, seq: int, headers_text: str | None, owners: QueueOwners
) -> FailedMessage:
    """Read one error-queue row: its Id, sequence and Headers column."""
    shown_id = row_id_text(row_id)
    try:
        headers = parse_headers(headers_text)
    except PoisonHeaders as error:
        return FailedMessage(
            shown_id,
            seq,
            None,
            poison=str(error),
            not_replayable=(
                f"its headers cannot be read ({error}); it was moved as it was, and replaying "
                "it would fail the same way"
            ),
        )
    forwarder, why_not = owners.owner_of(headers.get(FAILED_QUEUE_HEADER))
    if forwarder is not None and not isinstance(row_id, uuid.UUID) and not _is_uuid(shown_id):
        forwarder, why_not = None, f"its Id {shown_id!r} is not a UUID, as queue rows' Ids are"
    return FailedMessage(shown_id, seq, headers, forwarder=forwarder, not_replayable=why_not)


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


# -- replaying -------------------------------------------------------------------------------


def replay_headers(headers: Mapping[str, str | None]) -> Headers:
    """The headers a replayed message goes back to its forwarding queue with: everything but
    what the bridge adds on failure (`NServiceBus.FailedQ`, `NServiceBus.ExceptionInfo.*`,
    `NServiceBus.TimeOfFailure`, who processed it (`NServiceBus.ProcessingEndpoint`,
    `NServiceBus.ProcessingMachine`, `$.diagnostics.hostid`, `$.diagnostics.hostdisplayname`),
    `$.sfbridge.failure-reason`, `$.sfbridge.attempts`). The routing headers, a
    `NServiceBus.MessageId` (the row's Id, when the message had none) and everything the
    endpoint wrote stay, in their order."""
    added = (
        FAILED_QUEUE_HEADER,
        TIME_OF_FAILURE_HEADER,
        FAILURE_REASON_HEADER,
        ATTEMPTS_HEADER,
        *PROCESSING_HOST_HEADERS,
    )
    return {
        key: value
        for key, value in headers.items()
        if key not in added and not key.startswith(EXCEPTION_HEADER_PREFIX)
    }


def redirected_headers(headers: Mapping[str, str | None], address: str) -> Headers:
    """`headers` sent to `address` (in the forwarding database's grammar) instead: the routing
    header replaced, an event's type and a subscriber's address database taken off, so the
    message is routed as one sent to `address`."""
    result = {
        key: value
        for key, value in headers.items()
        if key not in (EVENT_TYPE_HEADER, ADDRESS_DATABASE_HEADER)
    }
    result[DESTINATION_HEADER] = address
    return result


# -- showing ---------------------------------------------------------------------------------

_TEXT_CHARACTERS = set(string.printable) - set("\x0b\x0c")


def body_preview(body: bytes | None, limit: int = 2048) -> tuple[str, list[str]]:
    """(what the body is, its preview lines): text when it is UTF-8 without control characters
    (tabs and line breaks allowed), else a hex dump; at most `limit` bytes of it."""
    if body is None:
        return "no body (NULL)", []
    if not body:
        return "empty body", []
    shown = body[:limit]
    more = f" (first {len(shown)} shown)" if len(body) > len(shown) else ""
    text: str | None
    try:
        text = shown.decode("utf-8")
    except UnicodeDecodeError as error:
        # A multi-byte character cut at the limit is still text.
        cut = len(body) > len(shown) and error.start >= len(shown) - 3
        text = shown[: error.start].decode("utf-8") if cut else None
    if text is not None and all(char in _TEXT_CHARACTERS or ord(char) > 127 for char in text):
        return f"text, {len(body)} bytes{more}", text.splitlines() or [""]
    lines = []
    for offset in range(0, len(shown), 16):
        chunk = shown[offset : offset + 16]
        hex_part = " ".join(f"{byte:02x}" for byte in chunk)
        ascii_part = "".join(chr(byte) if 32 <= byte < 127 else "." for byte in chunk)
        lines.append(f"{offset:08x}  {hex_part:<47}  |{ascii_part}|")
    return f"binary, {len(body)} bytes{more}", lines


def one_line(text: str | None, width: int) -> str:
    """`text` on one line (line breaks as spaces), cut to `width` characters with `...`."""
    if text is None:
        return "-"
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: max(width - 3, 0)] + "..."
