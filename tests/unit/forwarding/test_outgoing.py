"""Specification of the outgoing message (bridge.forwarding.outgoing): what a destination queue
receives, for a config with a proxy that leads replies back across databases."""

from __future__ import annotations

from bridge.config.model import (
    BridgeConfig,
    DatabaseConfig,
    FixedDestination,
    ForwarderConfig,
    RouteConfig,
)
from bridge.forwarding.outgoing import (
    CALLBACK_QUEUE_HEADER,
    SUBSCRIBER_ADDRESS_HEADER,
    Outgoing,
    without_routing_headers,
)
from bridge.headers import (
    ADDRESS_DATABASE_HEADER,
    DESTINATION_HEADER,
    EVENT_TYPE_HEADER,
    REPLY_TO_ADDRESS_HEADER,
    parse_headers,
)
from bridge.routing import Router

SENDER = DatabaseConfig("mssql", "sqlserver", connection="Server=sql1;Database=SenderDb")
RECEIVER = DatabaseConfig("receiver", "postgresql", connection="Server=pg1;Database=receiver")
DATABASES = {db.name: db for db in (SENDER, RECEIVER)}
CONFIG = BridgeConfig(
    databases=DATABASES,
    forwarders=(
        ForwarderConfig("sender-out", "mssql", "Samples.Sender.Forward"),
        # In the receiver's database, named after the sender's endpoint: replies go this way.
        ForwarderConfig(
            "back-to-sender",
            "receiver",
            '"Samples.Sender"',
            destination=FixedDestination("mssql"),
        ),
    ),
    routes=(RouteConfig("Samples.Receiver", "receiver"),),
)
PROXY_IN_RECEIVER = '"public"."Samples.Sender"'
SENDER_ENDPOINT = "Samples.Sender@[dbo]@[SenderDb]"  # as transport 7+ writes its own address


def _from_sender() -> Outgoing:
    return Outgoing.from_config(CONFIG, "mssql")


def _to_receiver(headers: dict[str, str | None]) -> dict[str, str | None]:
    """What the receiver database gets for a message the sender endpoint sent."""
    router = Router(SENDER, CONFIG.routes, DATABASES)
    destination = router.route("Samples.Receiver")
    assert not hasattr(destination, "reason"), destination
    forward = _from_sender().forward(headers, destination, "m-1")  # type: ignore[arg-type]
    return parse_headers(forward.headers_text)


def test_a_destination_receives_every_header_but_the_routing_headers_in_their_order() -> None:
    received = _to_receiver(
        {
            "NServiceBus.MessageId": "m-1",
            DESTINATION_HEADER: "Samples.Receiver",
            "NServiceBus.CorrelationId": None,
            EVENT_TYPE_HEADER: "Samples.Event",
            ADDRESS_DATABASE_HEADER: "mssql",
            "Ünï": "日本",
        }
    )
    assert list(received.items()) == [
        ("NServiceBus.MessageId", "m-1"),
        ("NServiceBus.CorrelationId", None),
        ("Ünï", "日本"),
    ]


def test_a_reply_address_is_rewritten_to_the_proxy_that_leads_back() -> None:
    received = _to_receiver(
        {
            DESTINATION_HEADER: "Samples.Receiver",
            REPLY_TO_ADDRESS_HEADER: SENDER_ENDPOINT,
            CALLBACK_QUEUE_HEADER: SENDER_ENDPOINT,
            SUBSCRIBER_ADDRESS_HEADER: "Samples.Sender",
        }
    )
    assert received == {
        REPLY_TO_ADDRESS_HEADER: PROXY_IN_RECEIVER,
        CALLBACK_QUEUE_HEADER: PROXY_IN_RECEIVER,
        SUBSCRIBER_ADDRESS_HEADER: PROXY_IN_RECEIVER,
    }


def test_a_reply_address_no_proxy_leads_back_to_is_left_as_it_is() -> None:
    # The proxy's table, but in another schema: another queue, which no proxy leads back to.
    elsewhere = "Samples.Sender@[sales]@[SenderDb]"
    other_table = "Samples.Other@[dbo]@[SenderDb]"
    received = _to_receiver(
        {REPLY_TO_ADDRESS_HEADER: elsewhere, CALLBACK_QUEUE_HEADER: other_table}
    )
    assert received == {REPLY_TO_ADDRESS_HEADER: elsewhere, CALLBACK_QUEUE_HEADER: other_table}


def test_within_one_database_a_reply_address_is_left_as_it_is() -> None:
    headers = {DESTINATION_HEADER: "x", REPLY_TO_ADDRESS_HEADER: SENDER_ENDPOINT}
    assert _from_sender().headers(headers, "mssql") == {REPLY_TO_ADDRESS_HEADER: SENDER_ENDPOINT}


def test_the_decision_keeps_the_headers_as_they_came_for_retry_storage_and_error_queue() -> None:
    headers = {DESTINATION_HEADER: "Samples.Receiver", REPLY_TO_ADDRESS_HEADER: SENDER_ENDPOINT}
    destination = Router(SENDER, CONFIG.routes, DATABASES).route("Samples.Receiver")
    forward = _from_sender().forward(headers, destination, "m-1")  # type: ignore[arg-type]
    assert forward.headers == {
        DESTINATION_HEADER: "Samples.Receiver",
        REPLY_TO_ADDRESS_HEADER: SENDER_ENDPOINT,
    }
    assert forward.message_id == "m-1"
    assert forward.destination is destination


def test_without_routing_headers_does_not_touch_its_input() -> None:
    headers = {"c": "3", DESTINATION_HEADER: "q", "a": "1", "b": None}
    result = without_routing_headers(headers)
    assert list(result) == ["c", "a", "b"]
    assert DESTINATION_HEADER in headers


def test_routing_header_names_are_matched_exactly() -> None:
    headers = {
        "$.Store-And-Forward.Destination": "x",
        "$.store-and-forward.destination ": "y",
        "$.store-and-forward.destinations": "z",
    }
    assert without_routing_headers(headers) == headers
