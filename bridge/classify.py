"""Decide what happens to each claimed message, before any destination is contacted. Pure.

Order matters and follows the transport: unparseable headers first (a poison row goes to
the error queue as it is, even when expired), then expiry, then routing.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from bridge.headers import (
    DESTINATION_HEADER,
    EVENT_TYPE_HEADER,
    MESSAGE_ID_HEADER,
    Headers,
    PoisonHeaders,
    parse_headers,
    serialize_headers,
    without_routing_headers,
)
from bridge.routing import Destination, Router, Unroutable


@dataclass(frozen=True)
class ClaimedMessage:
    """A row taken (deleted, uncommitted) from the forwarding queue or from retry storage."""

    row_id: uuid.UUID
    expired: bool
    expires: datetime | None
    headers_text: str | None
    body: bytes | None
    order: int
    attempts: int = 0
    first_failure_at: datetime | None = None
    last_error: str | None = None


@dataclass(frozen=True)
class Poison:
    """Headers cannot be parsed: to the error queue exactly as received."""

    reason: str


@dataclass(frozen=True)
class Expired:
    """`Expires` is in the past: dropped and counted."""


@dataclass(frozen=True)
class Reject:
    """Cannot be forwarded and retrying will not help: to the error queue with a reason."""

    headers: Headers
    reason_code: str
    reason: str


@dataclass(frozen=True)
class Deliver:
    """Insert `headers_text` + body into `destination`, deduplicated by `message_id`."""

    headers: Headers
    destination: Destination
    headers_text: str
    message_id: str


Decision = Poison | Expired | Reject | Deliver


def classify(message: ClaimedMessage, router: Router) -> Decision:
    """What to do with one claimed message."""
    try:
        headers = parse_headers(message.headers_text)
    except PoisonHeaders as error:
        return Poison(str(error))
    if message.expired:
        return Expired()
    destination_header = headers.get(DESTINATION_HEADER)
    if not destination_header:
        if headers.get(EVENT_TYPE_HEADER):
            return Reject(
                headers,
                "unsupported-publish",
                f"published event {headers[EVENT_TYPE_HEADER]!r} cannot be forwarded: this "
                "version of sfbridge forwards only messages with a "
                f"'{DESTINATION_HEADER}' header",
            )
        return Reject(
            headers,
            "no-routing-header",
            f"the message has no '{DESTINATION_HEADER}' header; the sending endpoint must set "
            "it to the destination queue's address",
        )
    decision = router.route(destination_header)
    if isinstance(decision, Unroutable):
        return Reject(headers, "unroutable", decision.reason)
    outgoing = without_routing_headers(headers)
    return Deliver(
        headers=headers,
        destination=decision,
        headers_text=serialize_headers(outgoing),
        message_id=headers.get(MESSAGE_ID_HEADER) or str(message.row_id),
    )
