"""Decide what happens to each claimed message, before any destination is contacted. Pure.

Order matters and follows the transport: unparseable headers first (a poison row goes to
the error queue as it is, even when expired), then a row the claim could not read whole
(to the error queue with the reason), then expiry, then routing.
"""

from __future__ import annotations

from bridge.exceptions import PoisonHeaders, TypeNameError
from bridge.forwarding.outgoing import Outgoing
from bridge.forwarding.typenames import topics_for
from bridge.headers import (
    ADDRESS_DATABASE_HEADER,
    DESTINATION_HEADER,
    ENCLOSED_TYPES_HEADER,
    EVENT_TYPE_HEADER,
    MESSAGE_ID_HEADER,
    Headers,
    parse_headers,
    serialize_headers,
    without_bridge_headers,
)
from bridge.messages import (
    UNREADABLE_ROW,
    ClaimedMessage,
    Decision,
    Expired,
    Poison,
    Publish,
    Reject,
)
from bridge.routing import Router, Unroutable


def classify(
    message: ClaimedMessage, router: Router, outgoing: Outgoing, *, trusted: bool = False
) -> Decision:
    """What to do with one claimed message; a delivery carries what its destination receives
    (`outgoing`).

    A row is a sender's unless `trusted` (the bridge wrote it: retry storage): the bridge's
    own headers on it are dropped before anything reads them, and the row's `headers_text`
    becomes the text without them, which retry storage keeps (`without_bridge_headers`).

    A non-blank destination is routed; otherwise a non-blank event type makes it a publish (an
    endpoint that writes both headers leaves the destination empty when publishing); otherwise
    a proxy forwarder's message goes to the proxy's destination. Elsewhere a routing header
    that is there but empty is rejected saying so, not as missing.
    """
    try:
        headers = parse_headers(message.headers_text)
    except PoisonHeaders as error:
        return Poison(message.unreadable or str(error))
    if not trusted and (own := without_bridge_headers(headers)) is not None:
        headers = own
        message.headers_text = serialize_headers(own)
    if message.unreadable:
        # Readable headers: the failure headers can say which column and why, and a retry
        # from ServicePulse sends the message (with Expires NULL) through the bridge again.
        return Reject(
            headers,
            UNREADABLE_ROW,
            f"the row cannot be read as a message: {message.unreadable}; it was moved to the "
            "error queue as it is, but for what could not be read",
        )
    if message.expired:
        return Expired()
    destination_header = headers.get(DESTINATION_HEADER)
    if destination_header is not None and destination_header.strip():
        # Routed once per destination text and database (the router remembers it).
        routed = router.route(destination_header, headers.get(ADDRESS_DATABASE_HEADER))
        if isinstance(routed, Unroutable):
            return Reject(headers, "unroutable", routed.reason)
        return outgoing.forward(headers, routed, _message_id(message, headers))
    event_type = headers.get(EVENT_TYPE_HEADER)
    if router.proxy is not None and not (event_type and event_type.strip()):
        # A proxy queue: an ordinary send from an unchanged endpoint.
        return outgoing.forward(headers, router.proxy, _message_id(message, headers))
    if event_type is not None and event_type.strip():
        try:
            topics = topics_for(event_type, headers.get(ENCLOSED_TYPES_HEADER))
        except TypeNameError as error:
            return Reject(
                headers,
                "bad-event-type",
                f"'{EVENT_TYPE_HEADER}' is not a .NET type name ({error}); the publishing "
                "endpoint must set it to the event's assembly-qualified type name",
            )
        return Publish(headers, event_type, tuple(topics))
    if destination_header is not None:
        return Reject(
            headers,
            "unroutable",
            f"the '{DESTINATION_HEADER}' header is present but empty"
            f"{_whitespace(destination_header)}; the sending endpoint must set it to the "
            "address of the destination queue (or, to publish an event, leave it out and set "
            f"'{EVENT_TYPE_HEADER}' to the event's type)",
        )
    if event_type is not None:
        return Reject(
            headers,
            "bad-event-type",
            f"the '{EVENT_TYPE_HEADER}' header is present but empty{_whitespace(event_type)}; "
            "the publishing endpoint must set it to the event's assembly-qualified type name "
            f"(or, to send to one queue, leave it out and set '{DESTINATION_HEADER}')",
        )
    return Reject(
        headers,
        "no-routing-header",
        f"the message has neither a '{DESTINATION_HEADER}' nor a '{EVENT_TYPE_HEADER}' "
        "header; the sending endpoint must set the destination queue's address (or, for "
        "a published event, its type)",
    )


def _message_id(message: ClaimedMessage, headers: Headers) -> str:
    """What the ledger knows the message by: its `NServiceBus.MessageId`, else its row's Id."""
    return headers.get(MESSAGE_ID_HEADER) or str(message.row_id)


def _whitespace(blank: str) -> str:
    """For a blank header value: what it holds, since whitespace is invisible in a log."""
    return f" (only whitespace: {blank!r})" if blank else ""
