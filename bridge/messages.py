"""What flows along the data path: claimed messages, what is decided for them, and results.

claim -> `ClaimedMessage`; classify -> a `Decision`; published events are expanded into one
`Unit` per subscriber copy (every other message is one unit); deliver -> a `DeliveryResult`
per unit that was to be delivered; settle -> each unit's fate, from its decision and result.
And what a log line about them is about (`about`), for the structured log formats.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

from bridge.headers import Headers
from bridge.routing import Destination

Source = Literal["queue", "retry"]


def utcnow() -> datetime:
    """Now, in naive UTC: the queue tables and the bridge's own store UTC wall-clock times
    without a zone."""
    return datetime.now(UTC).replace(tzinfo=None)


# Built once per message (or per copy) on every batch, so not frozen: a frozen dataclass costs
# about three times as much to build. Treated as values all the same: nothing assigns to them.
@dataclass(slots=True)
class ClaimedMessage:
    """A row taken (deleted, uncommitted) from the forwarding queue or from retry storage.

    `attempts`, `first_failure_at` and `last_error` come from retry storage (zero and None for
    a message claimed from the queue). The one assignment: classification gives a sender's row
    that carried the bridge's own headers the `headers_text` without them.
    """

    row_id: uuid.UUID
    expired: bool
    expires: datetime | None
    headers_text: str | None
    body: bytes | None
    order: int
    attempts: int = 0
    first_failure_at: datetime | None = None
    last_error: str | None = None
    # Why the row could not be read as a message, column by column (a value the driver cannot
    # convert, out of range, or of a type the transport never writes;
    # `bridge.forwarding.claim.RowReader`): it goes to the error queue with what could be read.
    unreadable: str | None = None
    # Bytes of body and headers as the claim measured them (what `batch_bytes` bounds).
    claimed_size: int = 0


# -- decisions (bridge.forwarding.classify)
# --------------------------------------------------------------

# The failure reason (`$.sfbridge.failure-reason`) of a row the claim could not read whole.
UNREADABLE_ROW = "unreadable-row"


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
class Publish:
    """A published event: to every subscriber of `topics` (the type and its hierarchy)."""

    headers: Headers
    event_type: str
    topics: tuple[str, ...]


# Built once per message (or per copy) on every batch, so not frozen: a frozen dataclass costs
# about three times as much to build. Treated as values all the same: nothing assigns to them.
@dataclass(slots=True)
class Forward:
    """Insert `headers_text` + body into `destination`, deduplicated by `message_id`."""

    headers: Headers
    destination: Destination
    headers_text: str
    message_id: str


Decision = Poison | Expired | Reject | Forward | Publish


# -- what a published event becomes (bridge.forwarding.fan_out)
# ---------------------------------------


@dataclass(frozen=True)
class NoSubscribers:
    publish: Publish


@dataclass(frozen=True)
class SubscribersUnknown:
    """A subscription table could not be read: the event waits whole, as a retry."""

    publish: Publish
    error: str


# What settle sees for one unit: every decision but Publish, which has become its copies.
UnitDecision = Poison | Expired | Reject | Forward | NoSubscribers | SubscribersUnknown


# Built once per message (or per copy) on every batch, so not frozen: a frozen dataclass costs
# about three times as much to build. Treated as values all the same: nothing assigns to them.
@dataclass(slots=True)
class Unit:
    """One thing to deliver or settle: a claimed message, or one subscriber's copy of it.

    `retry_headers_text` is what retry storage keeps (and routes again later) if the unit is
    not delivered now: the message's own headers, or a copy's headers as a unicast to its
    subscriber. `copy_row_id` is a copy's own Id (`bridge.forwarding.fan_out.copy_row_id`).
    """

    message: ClaimedMessage
    decision: UnitDecision
    retry_headers_text: str
    copy_row_id: uuid.UUID | None = None

    @property
    def row_id(self) -> uuid.UUID:
        """The Id of the unit's row in retry storage or the error queue. The copies of one
        event share its row, and the error queue keys on Id (PostgreSQL), so each copy has its
        own."""
        return self.copy_row_id or self.message.row_id


# -- delivery results (bridge.forwarding.deliver)
# ---------------------------------------------------------


@dataclass(frozen=True)
class Delivered:
    pass


@dataclass(frozen=True)
class Duplicate:
    """The ledger already had this message for this destination: it was delivered before."""


@dataclass(frozen=True)
class Failed:
    """Not delivered. `retryable` False sends it to the error queue without further attempts.

    `outage`: the whole database failed (unreachable, or lacking a bridge table it may not
    create), not this message; with `retries.during_outage: wait` that spends no attempt.
    `paused`: nothing was tried, the database is paused (`sfbridge pause`): no attempt spent,
    however long the pause. `login_refused`: an outage in which the database refuses the
    bridge's login; only a person fixes it, so it spends no attempt whatever
    `retries.during_outage` says (the message waits up to `retries.max_wait`).
    """

    error: str
    retryable: bool = True
    missing_queue: bool = False
    outage: bool = False
    paused: bool = False
    login_refused: bool = False


DeliveryResult = Delivered | Duplicate | Failed


@dataclass(frozen=True)
class DeliveryReport:
    """What delivering a batch's units did: a result per unit, in order (None for a unit that
    is not a delivery), and per destination database how many units it delivered (duplicates
    not counted), for metrics."""

    results: list[DeliveryResult | None]
    delivered: dict[str, int]


class Item(NamedTuple):
    """What delivery is handed: the claimed message and the decision to forward it."""

    message: ClaimedMessage
    forward: Forward


# -- What a log line is about -----------------------------------------------------------------
# Beside its text: the forwarder, the database, the messages (`NServiceBus.MessageId`s) and an
# error code (a reason code of this module), for the structured log formats
# (`logging.format: json` and `journal`, `bridge.daemon.observability`) to carry as fields of
# their own; the text format shows only the message, which says all of it in words. Passed as
# `extra=about(...)` to a logging call, kept in record attributes prefixed `sfbridge_` so that
# they never collide with one of the standard library's.
FORWARDER = "sfbridge_forwarder"
DATABASE = "sfbridge_database"
MESSAGE_IDS = "sfbridge_message_ids"
ERROR_CODE = "sfbridge_error_code"

# Record attribute -> the field's name in a JSON line and in a journal entry.
FIELDS: Mapping[str, tuple[str, str]] = {
    FORWARDER: ("forwarder", "FORWARDER"),
    DATABASE: ("database", "DATABASE"),
    MESSAGE_IDS: ("MessageIds", "MESSAGE_IDS"),
    ERROR_CODE: ("error_code", "ERROR_CODE"),
}


def about(
    *,
    forwarder: str | None = None,
    database: str | None = None,
    message_ids: Sequence[str] | None = None,
    error_code: str | None = None,
) -> dict[str, Any]:
    """The `extra` of a logging call: only what is known (None is left out)."""
    given: dict[str, Any] = {
        FORWARDER: forwarder,
        DATABASE: database,
        MESSAGE_IDS: list(message_ids) if message_ids is not None else None,
        ERROR_CODE: error_code,
    }
    return {key: value for key, value in given.items() if value is not None}
