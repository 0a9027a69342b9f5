"""Published events: one copy per subscriber. Pure, given the subscribers.

A published event carries `$.store-and-forward.eventtype` instead of a destination. Its
subscribers are looked up by topic (the event type and its hierarchy), each is routed like a
unicast destination, and every distinct destination gets one copy with every header but the
routing headers, `NServiceBus.MessageId` included: the dedup ledger is keyed by (message id,
destination), so each subscriber gets the event exactly once, whatever happens to the others.

A copy that cannot be delivered now becomes a unicast message to its subscriber
(`copy_as_unicast`): it waits in retry storage and, if it never gets through, lands in the
error queue alone, while the copies that were delivered stay delivered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bridge.classify import Deliver, Publish, Reject
from bridge.headers import (
    ADDRESS_DATABASE_HEADER,
    DESTINATION_HEADER,
    EVENT_TYPE_HEADER,
    MESSAGE_ID_HEADER,
    Headers,
    serialize_headers,
    without_routing_headers,
)
from bridge.routing import Destination, Router, Unroutable
from bridge.subscriptions import Subscriber


@dataclass(frozen=True)
class Copy:
    """One subscriber's copy: deliverable, or rejected when its address cannot be routed."""

    subscribers: tuple[Subscriber, ...]  # every listing of this destination (YAML, tables)
    decision: Deliver | Reject

    @property
    def subscriber(self) -> Subscriber:
        return self.subscribers[0]


@dataclass(frozen=True)
class Fanout:
    publish: Publish
    copies: tuple[Copy, ...]


@dataclass(frozen=True)
class NoSubscribers:
    publish: Publish


@dataclass(frozen=True)
class SubscribersUnknown:
    """A subscription table could not be read: the event waits whole, as a retry."""

    publish: Publish
    error: str


def fan_out(
    publish: Publish,
    subscribers: Sequence[Subscriber],
    router: Router,
    *,
    fallback_message_id: str,
) -> Fanout | NoSubscribers:
    """One copy per distinct destination, in the order the subscribers were found."""
    if not subscribers:
        return NoSubscribers(publish)
    outgoing_text = serialize_headers(without_routing_headers(publish.headers))
    message_id = publish.headers.get(MESSAGE_ID_HEADER) or fallback_message_id
    by_destination: dict[object, list[Subscriber]] = {}
    decisions: dict[object, Deliver | Reject] = {}
    for subscriber in subscribers:
        routed = router.route(subscriber.address, subscriber.address_database)
        if isinstance(routed, Destination):
            key: object = (routed.database, routed.canonical)
            decision: Deliver | Reject = Deliver(
                headers=copy_as_unicast(publish.headers, subscriber, router.source_database),
                destination=routed,
                headers_text=outgoing_text,
                message_id=message_id,
            )
        else:
            key = ("unroutable", subscriber.address_database, subscriber.address)
            decision = Reject(
                copy_as_unicast(publish.headers, subscriber, router.source_database),
                "unroutable",
                f"subscriber {subscriber.address!r} ({subscriber.source}) of "
                f"{publish.event_type!r}: {_reason(routed)}",
            )
        by_destination.setdefault(key, []).append(subscriber)
        decisions.setdefault(key, decision)
    copies = tuple(Copy(tuple(by_destination[key]), decisions[key]) for key in by_destination)
    return Fanout(publish, copies)


def copy_as_unicast(headers: Headers, subscriber: Subscriber, forwarding_database: str) -> Headers:
    """The headers of one subscriber's copy as a unicast message through the bridge.

    Used for retry storage and the error queue: the event type header goes, the destination
    header names the subscriber, and when the address is written in another database's
    grammar (it came from that database's subscription table), a bridge header says which.
    """
    result: Headers = {
        key: value
        for key, value in headers.items()
        if key not in (EVENT_TYPE_HEADER, DESTINATION_HEADER, ADDRESS_DATABASE_HEADER)
    }
    result[DESTINATION_HEADER] = subscriber.address
    if subscriber.address_database != forwarding_database:
        result[ADDRESS_DATABASE_HEADER] = subscriber.address_database
    return result


def _reason(routed: Destination | Unroutable) -> str:
    return routed.reason if isinstance(routed, Unroutable) else ""
