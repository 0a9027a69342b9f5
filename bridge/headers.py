"""Message headers: the JSON `Headers` column, routing headers, failure headers. Pure.

The column holds one JSON object of string (or null) values, as the NServiceBus SQL
transports write it. Anything else makes the row a poison message, as it does for the
transport itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from bridge.exceptions import PoisonHeaders
from bridge.processing_host import ProcessingHost

DESTINATION_HEADER = "$.store-and-forward.destination"
EVENT_TYPE_HEADER = "$.store-and-forward.eventtype"
# Set by the bridge on a subscriber's copy whose address is written in another database's
# grammar than the forwarding database's (it came from that database's subscription table).
ADDRESS_DATABASE_HEADER = "$.sfbridge.address-database"
ROUTING_HEADERS = (DESTINATION_HEADER, EVENT_TYPE_HEADER, ADDRESS_DATABASE_HEADER)

MESSAGE_ID_HEADER = "NServiceBus.MessageId"
REPLY_TO_ADDRESS_HEADER = "NServiceBus.ReplyToAddress"
ENCLOSED_TYPES_HEADER = "NServiceBus.EnclosedMessageTypes"
TIME_SENT_HEADER = "NServiceBus.TimeSent"
FAILED_QUEUE_HEADER = "NServiceBus.FailedQ"
TIME_OF_FAILURE_HEADER = "NServiceBus.TimeOfFailure"
EXCEPTION_HEADER_PREFIX = "NServiceBus.ExceptionInfo."
# Who handled the failed message (`bridge.processing_host`).
PROCESSING_ENDPOINT_HEADER = "NServiceBus.ProcessingEndpoint"
PROCESSING_MACHINE_HEADER = "NServiceBus.ProcessingMachine"
HOST_ID_HEADER = "$.diagnostics.hostid"
HOST_DISPLAY_NAME_HEADER = "$.diagnostics.hostdisplayname"
PROCESSING_HOST_HEADERS = (
    PROCESSING_ENDPOINT_HEADER,
    PROCESSING_MACHINE_HEADER,
    HOST_ID_HEADER,
    HOST_DISPLAY_NAME_HEADER,
)

# The bridge may add headers only under its own prefix.
BRIDGE_HEADER_PREFIX = "$.sfbridge."
FAILURE_REASON_HEADER = "$.sfbridge.failure-reason"
ATTEMPTS_HEADER = "$.sfbridge.attempts"
# Every header of the bridge's that it reads back (tests/unit/forwarding/test_hostile_senders.py
# keeps it whole).
BRIDGE_HEADERS = frozenset({ADDRESS_DATABASE_HEADER, FAILURE_REASON_HEADER, ATTEMPTS_HEADER})

# Core truncates exception messages to 16 KiB before moving to the error queue.
MAX_EXCEPTION_TEXT = 16_384

Headers = dict[str, str | None]

# Built once: json.dumps with options builds a new encoder on every call.
_ASCII_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))


def parse_headers(text: str | None) -> Headers:
    """Parse the Headers column. SQL NULL, empty and JSON `null` mean no headers.

    Raises PoisonHeaders for anything that is not a JSON object of string-or-null values.
    """
    if not text or text.isspace():  # not text.strip(): that copies every message's headers
        return {}
    try:
        value = _loads(text)
    except (ValueError, RecursionError) as error:
        raise PoisonHeaders(f"headers are not valid JSON: {error}") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PoisonHeaders(f"headers are a JSON {type(value).__name__}, not an object")
    if not _STRING_OR_NULL.issuperset(map(type, value.values())):
        for key, item in value.items():
            if item is not None and not isinstance(item, str):
                raise PoisonHeaders(
                    f"header {key!r} has a {type(item).__name__} value; only strings are allowed"
                )
    return value


_STRING_OR_NULL = frozenset({str, type(None)})


def _loads(text: str) -> Any:
    """`json.loads(text)`, about three times faster for the headers of nearly every message:
    orjson parses first, and what it refuses goes to the standard library, which decides (it
    accepts unpaired surrogate escapes, which .NET strings may hold, and NaN; both parsers keep
    the last of repeated keys, in the place of the first)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def serialize_headers(headers: Mapping[str, str | None]) -> str:
    """Compact JSON in insertion order, non-ASCII kept raw, as the transport writes it.

    Written by orjson, which gives exactly what the standard library's compact encoder gives
    (`tests/unit/test_headers_json.py` compares them) in a third of the time; this runs once
    per message. .NET strings may hold unpaired surrogates (valid JSON as `\\ud800`), which
    cannot be written raw as UTF-8 and which orjson refuses: such headers are written with
    every non-ASCII character escaped, which any JSON reader turns back into the same strings.
    """
    value = headers if isinstance(headers, dict) else dict(headers)
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return _ASCII_ENCODER.encode(value)


def without_bridge_headers(headers: Headers) -> Headers | None:
    """A sender's headers without the bridge's own (`$.sfbridge.*`); None when it wrote none
    the bridge reads (`BRIDGE_HEADERS`: a set lookup, nearly always the answer).

    Those headers are the bridge's to set, on rows it writes itself (retry storage): a sender
    must not choose, say, the grammar its destination is read in, or the failure reason and
    attempt count the error queue shows. When one is there, every `$.sfbridge.*` header goes.
    """
    if BRIDGE_HEADERS.isdisjoint(headers):
        return None
    return {
        key: value for key, value in headers.items() if not key.startswith(BRIDGE_HEADER_PREFIX)
    }


def with_legacy_reply_to(headers_text: str | None, reply_to: str) -> str | None:
    """The Headers column with `ReplyToAddress` set from the legacy column of the same name.

    Transports before 7.0 wrote that column beside the header and, on receive, let a
    non-empty column replace the header; the bridge writes the column NULL, so the header
    carries the value on. Headers that do not parse are left as they are (poison anyway).
    """
    try:
        headers = parse_headers(headers_text)
    except PoisonHeaders:
        return headers_text
    if headers.get(REPLY_TO_ADDRESS_HEADER) == reply_to:
        return headers_text
    headers[REPLY_TO_ADDRESS_HEADER] = reply_to
    return serialize_headers(headers)


def wire_date(moment: datetime) -> str:
    """NServiceBus wire date: `yyyy-MM-dd HH:mm:ss:ffffff Z` in UTC (its DateTimeOffsetHelper)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S:%f") + " Z"


# A wire date as NServiceBus and the bridge write it, read without strptime (ten times
# slower): `errors summary` reads one per failed message.
_WIRE_DATE = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2}) ([0-9]{2}):([0-9]{2}):([0-9]{2}):([0-9]{6}) Z"
)


def parse_wire_date(text: str) -> datetime | None:
    """Parse a wire date; None when the text is not one."""
    match = _WIRE_DATE.fullmatch(text) if isinstance(text, str) else None
    if match is not None:
        try:
            year, month, day, hour, minute, second, micro = map(int, match.groups())
            return datetime(year, month, day, hour, minute, second, micro, tzinfo=UTC)
        except ValueError:
            return None
    try:
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S:%f Z").replace(tzinfo=UTC)
    except (TypeError, ValueError):
        return None


def with_failure_headers(
    headers: Mapping[str, str | None],
    *,
    failed_queue: str,
    exception_type: str,
    message: str,
    reason: str,
    failed_at: datetime,
    processed_by: ProcessingHost,
    row_id: str,
    attempts: int | None = None,
    stack_trace: str | None = None,
) -> Headers:
    """Headers for the error queue, in the shape NServiceBus Core and ServicePulse expect.

    Given the queue the message failed in (its canonical address), what went wrong, who
    handled it and the row's Id, which becomes `NServiceBus.MessageId` when the message has
    none (NServiceBus uses the native Id then, and writes it on the failed copy). The routing
    headers are kept so that a retry from ServicePulse (which sends the message back to
    `NServiceBus.FailedQ`, the forwarding queue) goes through the bridge again.
    """
    result: Headers = {
        key: value
        for key, value in headers.items()
        if not key.startswith(EXCEPTION_HEADER_PREFIX)
        and key not in ("NServiceBus.Retries", "NServiceBus.FLRetries")
    }
    if not result.get(MESSAGE_ID_HEADER):
        result[MESSAGE_ID_HEADER] = row_id
    result[FAILED_QUEUE_HEADER] = failed_queue
    result[EXCEPTION_HEADER_PREFIX + "ExceptionType"] = exception_type
    result[EXCEPTION_HEADER_PREFIX + "Message"] = message[:MAX_EXCEPTION_TEXT]
    result[EXCEPTION_HEADER_PREFIX + "Source"] = "sfbridge"
    result[EXCEPTION_HEADER_PREFIX + "StackTrace"] = (stack_trace or message)[:MAX_EXCEPTION_TEXT]
    result[TIME_OF_FAILURE_HEADER] = wire_date(failed_at)
    result[PROCESSING_ENDPOINT_HEADER] = processed_by.endpoint
    result[PROCESSING_MACHINE_HEADER] = processed_by.machine
    result[HOST_ID_HEADER] = processed_by.host_id
    result[HOST_DISPLAY_NAME_HEADER] = processed_by.host_display_name
    result[FAILURE_REASON_HEADER] = reason
    if attempts is not None:
        result[ATTEMPTS_HEADER] = str(attempts)
    return result
