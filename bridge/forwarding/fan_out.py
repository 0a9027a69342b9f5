"""Published events: one copy per subscriber.

A published event carries `$.store-and-forward.eventtype` instead of a destination. Its
subscribers are looked up by topic (the event type and its hierarchy), each is routed like a
unicast destination, and every distinct destination gets one copy with every header but the
routing headers, `NServiceBus.MessageId` included: the dedup ledger is keyed by (message id,
destination), so each subscriber gets the event exactly once, whatever happens to the others.

A copy that cannot be delivered now becomes a unicast message to its subscriber
(`copy_as_unicast`): it waits in retry storage and, if it never gets through, lands in the
error queue alone, while the copies that were delivered stay delivered. Its row there has
its own Id (`copy_row_id`): the error queue keys on Id, and one event's copies may all end up
in it. Its `NServiceBus.MessageId` stays the event's.

`fan_out` is pure, given the subscribers. `PublishedEvents` is the data path's side of it: it
looks the subscribers up (`subscriptions`), fans the event out into one `Unit` per copy, and
has what `status` shows per event type recorded (`bridge.storage.event_types`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.exceptions import BridgeTableMissing, DatabaseError
from bridge.forwarding.outgoing import Outgoing
from bridge.forwarding.subscriptions import Subscriber, SubscriberDirectory
from bridge.headers import (
    ADDRESS_DATABASE_HEADER,
    DESTINATION_HEADER,
    EVENT_TYPE_HEADER,
    MESSAGE_ID_HEADER,
    Headers,
    serialize_headers,
)
from bridge.messages import (
    ClaimedMessage,
    Forward,
    NoSubscribers,
    Publish,
    Reject,
    SubscribersUnknown,
    Unit,
)
from bridge.routing import Destination, Router, Unroutable
from bridge.storage.event_types import record_event_type
from bridge.storage.tables import ForwarderTables

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Copy:
    """One subscriber's copy: deliverable, or rejected when its address cannot be routed."""

    subscribers: tuple[Subscriber, ...]  # every listing of this destination (YAML, tables)
    decision: Forward | Reject

    @property
    def subscriber(self) -> Subscriber:
        return self.subscribers[0]


@dataclass(frozen=True)
class Fanout:
    publish: Publish
    copies: tuple[Copy, ...]


def fan_out(
    publish: Publish,
    subscribers: Sequence[Subscriber],
    router: Router,
    outgoing: Outgoing,
    *,
    fallback_message_id: str,
) -> Fanout | NoSubscribers:
    """One copy per distinct destination, in the order the subscribers were found; the copies
    for one database share what it receives (`outgoing`), serialized once."""
    if not subscribers:
        return NoSubscribers(publish)
    # Per destination database: reply addresses are rewritten for the database they enter.
    outgoing_texts: dict[str, str] = {}
    message_id = publish.headers.get(MESSAGE_ID_HEADER) or fallback_message_id
    by_destination: dict[object, list[Subscriber]] = {}
    decisions: dict[object, Forward | Reject] = {}
    for subscriber in subscribers:
        routed = router.route(subscriber.address, subscriber.address_database)
        if isinstance(routed, Destination):
            key: object = (routed.database, routed.canonical)
            if routed.database not in outgoing_texts:
                outgoing_texts[routed.database] = outgoing.text(publish.headers, routed.database)
            decision: Forward | Reject = Forward(
                headers=copy_as_unicast(
                    publish.headers, subscriber, router.source_database, message_id
                ),
                destination=routed,
                headers_text=outgoing_texts[routed.database],
                message_id=message_id,
            )
        else:
            key = ("unroutable", subscriber.address_database, subscriber.address)
            decision = Reject(
                copy_as_unicast(publish.headers, subscriber, router.source_database, message_id),
                "unroutable",
                f"subscriber {subscriber.address!r} ({subscriber.source}) of "
                f"{publish.event_type!r}: {_reason(routed)}",
            )
        by_destination.setdefault(key, []).append(subscriber)
        decisions.setdefault(key, decision)
    copies = tuple(Copy(tuple(by_destination[key]), decisions[key]) for key in by_destination)
    return Fanout(publish, copies)


def copy_as_unicast(
    headers: Headers, subscriber: Subscriber, forwarding_database: str, message_id: str
) -> Headers:
    """The headers of one subscriber's copy as a unicast message through the bridge.

    Used for retry storage and the error queue: the event type header goes, the destination
    header names the subscriber, and when the address is written in another database's
    grammar (it came from that database's subscription table), a bridge header says which.
    An event without `NServiceBus.MessageId` gets `message_id` (its row's Id), the one the
    ledger knows it by: the copy's own row Id (`copy_row_id`) is another.
    """
    result: Headers = {
        key: value
        for key, value in headers.items()
        if key not in (EVENT_TYPE_HEADER, DESTINATION_HEADER, ADDRESS_DATABASE_HEADER)
    }
    if not result.get(MESSAGE_ID_HEADER):
        result[MESSAGE_ID_HEADER] = message_id
    result[DESTINATION_HEADER] = subscriber.address
    if subscriber.address_database != forwarding_database:
        result[ADDRESS_DATABASE_HEADER] = subscriber.address_database
    return result


def copy_row_id(event_row_id: uuid.UUID, subscriber: Subscriber) -> uuid.UUID:
    """The Id of a copy's row in retry storage or the error queue: derived from the event's
    row and the subscriber's address, so the same copy has the same Id every time the event is
    fanned out (a batch rolled back and tried again)."""
    return uuid.uuid5(event_row_id, json.dumps([subscriber.address_database, subscriber.address]))


def _reason(routed: Destination | Unroutable) -> str:
    return routed.reason if isinstance(routed, Unroutable) else ""


# The event types table keys on the type name; a longer name is stored shortened, with a
# digest, so that it fits every dialect's key (SQL Server: 600 characters).
MAX_EVENT_TYPE_KEY = 400


def event_type_key(event_type: str) -> str:
    """`event_type` as the event types table stores it: whole when short enough, else its first
    300 characters, an ellipsis and a digest of the whole."""
    if len(event_type.encode("utf-8", "surrogatepass")) <= MAX_EVENT_TYPE_KEY:
        return event_type
    digest = hashlib.sha256(event_type.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{event_type[:300]}... (sha256 {digest})"


class PublishedEvents:
    """Turns a claimed published event into units: one per subscriber copy, or one saying why
    there are none. One per worker (it holds the subscriber cache)."""

    def __init__(
        self,
        forwarder: str,
        dialect: Dialect,
        tables: ForwarderTables,
        router: Router,
        outgoing: Outgoing,
        subscribers: SubscriberDirectory,
    ) -> None:
        self._forwarder = forwarder
        self._dialect = dialect
        self._tables = tables
        self._router = router
        self._outgoing = outgoing
        self._subscribers = subscribers

    def units(
        self,
        connection: Connection,
        message: ClaimedMessage,
        publish: Publish,
        missing_tables: list[BridgeTableMissing],
    ) -> list[Unit]:
        """The event's units; the event types table, when found missing, is added to
        `missing_tables` (the spine heals it after the batch)."""
        own_headers = message.headers_text or ""
        try:
            lookup = self._subscribers.lookup(publish.topics)
        except DatabaseError as error:
            unknown = SubscribersUnknown(publish, f"cannot read subscribers: {error}")
            return [Unit(message, unknown, own_headers)]
        fanned = fan_out(
            publish,
            lookup.subscribers,
            self._router,
            self._outgoing,
            fallback_message_id=str(message.row_id),
        )
        if lookup.fresh:
            missing = self._record_event_type(connection, publish, fanned)
            if missing is not None:
                missing_tables.append(missing)
        if isinstance(fanned, NoSubscribers):
            return [Unit(message, fanned, own_headers)]
        # A copy that is not delivered now waits alone, as a unicast to its subscriber.
        return [
            Unit(
                message,
                copy.decision,
                serialize_headers(copy.decision.headers),
                copy_row_id(message.row_id, copy.subscriber),
            )
            for copy in fanned.copies
        ]

    def _record_event_type(
        self, connection: Connection, publish: Publish, fanned: Fanout | NoSubscribers
    ) -> BridgeTableMissing | None:
        """What `status` and `check` show: per event type seen, its subscribers and sources."""
        subscribers = [
            {
                "address": listed.address,
                "source": listed.source,
                "destination": (
                    f"{copy.decision.destination.canonical} in database "
                    f"'{copy.decision.destination.database}'"
                    if isinstance(copy.decision, Forward)
                    else f"unroutable: {copy.decision.reason}"
                ),
            }
            for copy in (fanned.copies if isinstance(fanned, Fanout) else ())
            for listed in copy.subscribers
        ]
        return record_event_type(
            connection,
            self._dialect,
            self._tables.event_types,
            self._forwarder,
            event_type_key(publish.topics[0]),
            {"topics": list(publish.topics), "subscribers": subscribers},
        )
