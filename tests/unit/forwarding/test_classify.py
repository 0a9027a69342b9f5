"""Specification of message classification (bridge.forwarding.classify), before any destination is
used."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

import pytest

from bridge.addressing import TableAddress
from bridge.config.model import DatabaseConfig, RouteConfig
from bridge.forwarding.classify import classify
from bridge.forwarding.outgoing import Outgoing
from bridge.headers import DESTINATION_HEADER, EVENT_TYPE_HEADER, parse_headers
from bridge.messages import (
    ClaimedMessage,
    Expired,
    Forward,
    Poison,
    Publish,
    Reject,
)
from bridge.routing import Destination, Router

SENDER = DatabaseConfig("sender", "postgresql", connection="Driver=x")
RECEIVER = DatabaseConfig("receiver", "postgresql", connection="Driver=y")
EDGE = DatabaseConfig("edge", "sqlite", path="/var/lib/sfbridge/edge.db")
DATABASES = {db.name: db for db in (SENDER, RECEIVER, EDGE)}
ROUTES = (RouteConfig("Receiver*", "receiver"), RouteConfig("Edge*", "edge"))

ROW_ID = uuid.UUID("9c8b3f6e-2f6a-4a4e-9f3e-6c1d2b7a5e01")


def _router() -> Router:
    return Router(SENDER, ROUTES, DATABASES)


def _message(
    headers: dict[str, Any] | str | None, *, expired: bool = False, **fields: Any
) -> ClaimedMessage:
    text = headers if headers is None or isinstance(headers, str) else json.dumps(headers)
    values: dict[str, Any] = {
        "row_id": ROW_ID,
        "expired": expired,
        "expires": None,
        "headers_text": text,
        "body": b'{"hello":"world"}',
        "order": 1,
    }
    values.update(fields)
    return ClaimedMessage(**values)


def _classify(headers: dict[str, Any] | str | None, **fields: Any) -> Any:
    return classify(_message(headers, **fields), _router(), Outgoing(SENDER.name))


# --------------------------------------------------------------------------------------------
# Poison
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "{",
        "not json",
        '["a"]',
        '"string"',
        "42",
        '{"NServiceBus.MessageId": 42}',
        '{"' + DESTINATION_HEADER + '": ["Receiver"]}',
        '{"a": {"nested": "x"}}',
        '{"a": true}',
        "[" * 50_000,
    ],
)
def test_headers_that_cannot_be_parsed_make_the_message_poison(text: str) -> None:
    decision = _classify(text)
    assert isinstance(decision, Poison)
    assert decision.reason


def test_the_poison_reason_says_what_is_wrong() -> None:
    decision = _classify('{"NServiceBus.MessageId": 42}')
    assert isinstance(decision, Poison)
    assert "'NServiceBus.MessageId'" in decision.reason
    assert "int" in decision.reason


def test_expired_poison_row_is_still_poison() -> None:
    decision = _classify("{not json", expired=True)
    assert isinstance(decision, Poison)


def test_poison_wins_even_with_a_valid_looking_destination_in_the_text() -> None:
    text = '{"' + DESTINATION_HEADER + '": "Receiver", "bad": 1}'
    assert isinstance(_classify(text), Poison)


# --------------------------------------------------------------------------------------------
# Expired
# --------------------------------------------------------------------------------------------


def test_an_expired_message_with_valid_headers_is_expired() -> None:
    decision = _classify({DESTINATION_HEADER: "Receiver"}, expired=True)
    assert decision == Expired()


def test_expiry_comes_before_routing_problems() -> None:
    assert isinstance(_classify({}, expired=True), Expired)
    assert isinstance(_classify(None, expired=True), Expired)
    assert isinstance(_classify({DESTINATION_HEADER: "Nowhere"}, expired=True), Expired)
    assert isinstance(_classify({EVENT_TYPE_HEADER: "Samples.Event"}, expired=True), Expired)
    assert isinstance(_classify({DESTINATION_HEADER: '"bad'}, expired=True), Expired)
    assert isinstance(_classify({DESTINATION_HEADER: ""}, expired=True), Expired)
    assert isinstance(_classify({EVENT_TYPE_HEADER: ""}, expired=True), Expired)


def test_the_expired_flag_decides_not_the_expires_time() -> None:
    # The database computes `expired` against its own clock; classify trusts it.
    past = datetime(2000, 1, 1)
    assert isinstance(
        _classify({DESTINATION_HEADER: "Receiver"}, expired=False, expires=past), Forward
    )
    future = datetime(2999, 1, 1)
    assert isinstance(
        _classify({DESTINATION_HEADER: "Receiver"}, expired=True, expires=future), Expired
    )


# --------------------------------------------------------------------------------------------
# Reject
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        None,
        "",
        "null",
        {},
        {"NServiceBus.MessageId": "m-1"},
        {DESTINATION_HEADER: None},
        {DESTINATION_HEADER: None, EVENT_TYPE_HEADER: None},
        {"$.Store-And-Forward.Destination": "Receiver"},
    ],
)
def test_a_message_without_a_routing_header_is_rejected(headers: Any) -> None:
    decision = _classify(headers)
    assert isinstance(decision, Reject)
    assert decision.reason_code == "no-routing-header"
    assert decision.reason.startswith(
        f"the message has neither a '{DESTINATION_HEADER}' nor a '{EVENT_TYPE_HEADER}' header"
    )


@pytest.mark.parametrize(
    "headers",
    [
        {DESTINATION_HEADER: ""},
        {DESTINATION_HEADER: "", EVENT_TYPE_HEADER: None},
        {DESTINATION_HEADER: "", EVENT_TYPE_HEADER: ""},
        {DESTINATION_HEADER: "", EVENT_TYPE_HEADER: " "},
    ],
)
def test_an_empty_destination_header_is_unroutable_with_a_reason_saying_it_is_empty(
    headers: dict[str, str | None],
) -> None:
    decision = _classify(headers)
    assert isinstance(decision, Reject)
    assert decision.reason_code == "unroutable"
    assert decision.reason == (
        f"the '{DESTINATION_HEADER}' header is present but empty; the sending endpoint must "
        "set it to the address of the destination queue (or, to publish an event, leave it "
        f"out and set '{EVENT_TYPE_HEADER}' to the event's type)"
    )
    assert decision.headers == headers


@pytest.mark.parametrize("blank", [" ", "\t", " \r\n "])
def test_a_blank_destination_header_is_unroutable_and_the_reason_shows_the_whitespace(
    blank: str,
) -> None:
    decision = _classify({DESTINATION_HEADER: blank})
    assert isinstance(decision, Reject)
    assert decision.reason_code == "unroutable"
    assert decision.reason.startswith(
        f"the '{DESTINATION_HEADER}' header is present but empty (only whitespace: {blank!r}); "
        "the sending endpoint must set it"
    )


def test_a_rejected_message_carries_its_parsed_headers() -> None:
    headers = {"NServiceBus.MessageId": "m-1", "n": None, "Ort": "Zürich"}
    decision = _classify(headers)
    assert isinstance(decision, Reject)
    assert decision.headers == headers


# An endpoint that writes both routing headers leaves the destination empty when publishing.
@pytest.mark.parametrize("destination", [None, "", "  "])
def test_a_message_with_only_an_event_type_is_a_publish_of_its_type_hierarchy(
    destination: str | None,
) -> None:
    headers = {
        EVENT_TYPE_HEADER: "Samples.OrderPlaced, Samples, Version=1.0.0.0",
        DESTINATION_HEADER: destination,
        "NServiceBus.EnclosedMessageTypes": (
            "Samples.OrderPlaced, Samples;Samples.IOrderEvent, Samples"
        ),
    }
    decision = _classify(headers)
    assert isinstance(decision, Publish)
    assert decision.topics == ("Samples.OrderPlaced", "Samples.IOrderEvent", "System.Object")
    assert decision.headers == headers


def test_an_event_type_that_is_not_a_type_name_is_rejected() -> None:
    decision = _classify({EVENT_TYPE_HEADER: ", Samples"})
    assert isinstance(decision, Reject)
    assert decision.reason_code == "bad-event-type"
    assert EVENT_TYPE_HEADER in decision.reason


@pytest.mark.parametrize(
    "headers", [{EVENT_TYPE_HEADER: ""}, {EVENT_TYPE_HEADER: "", DESTINATION_HEADER: None}]
)
def test_an_empty_event_type_header_is_a_bad_event_type_with_a_reason_saying_it_is_empty(
    headers: dict[str, str | None],
) -> None:
    decision = _classify(headers)
    assert isinstance(decision, Reject)
    assert decision.reason_code == "bad-event-type"
    assert decision.reason == (
        f"the '{EVENT_TYPE_HEADER}' header is present but empty; the publishing endpoint must "
        "set it to the event's assembly-qualified type name (or, to send to one queue, leave "
        f"it out and set '{DESTINATION_HEADER}')"
    )


def test_a_blank_event_type_header_is_a_bad_event_type_showing_the_whitespace() -> None:
    decision = _classify({EVENT_TYPE_HEADER: " \t"})
    assert isinstance(decision, Reject)
    assert decision.reason_code == "bad-event-type"
    assert decision.reason.startswith(
        f"the '{EVENT_TYPE_HEADER}' header is present but empty (only whitespace: ' \\t'); "
    )


def test_a_destination_header_wins_over_an_event_type_header() -> None:
    decision = _classify({EVENT_TYPE_HEADER: "Samples.Event", DESTINATION_HEADER: "Receiver"})
    assert isinstance(decision, Forward)


def test_a_destination_no_route_matches_is_rejected_as_unroutable() -> None:
    decision = _classify({DESTINATION_HEADER: "Shipping"})
    assert isinstance(decision, Reject)
    assert decision.reason_code == "unroutable"
    assert "'Shipping'" in decision.reason
    assert "'Receiver*'" in decision.reason


def test_an_invalid_destination_address_is_rejected_as_unroutable() -> None:
    decision = _classify({DESTINATION_HEADER: '"unbalanced'})
    assert isinstance(decision, Reject)
    assert decision.reason_code == "unroutable"
    assert DESTINATION_HEADER in decision.reason


def test_a_destination_the_target_cannot_express_is_rejected_as_unroutable() -> None:
    decision = _classify({DESTINATION_HEADER: '"Edge@1"'})
    assert isinstance(decision, Reject)
    assert decision.reason_code == "unroutable"


# A .NET string may hold an unpaired surrogate, which JSON carries as `\ud800` and json.loads
# turns into a str that UTF-8 cannot encode; no database can store it as a table name.


@pytest.mark.parametrize("table", ["Receiver\\ud800", "Edge\\udc00Queue"])
@pytest.mark.parametrize(
    "source",
    [
        SENDER,
        DatabaseConfig("mssql", "sqlserver", connection="Driver=w"),
        DatabaseConfig("store", "sqlite", path="/var/lib/sfbridge/store.db"),
    ],
    ids=lambda db: db.dialect,
)
def test_a_destination_with_an_unpaired_surrogate_is_unroutable_with_a_reason_not_poison(
    source: DatabaseConfig, table: str
) -> None:
    text = '{"' + DESTINATION_HEADER + '": "' + table + '"}'  # JSON escape, as .NET writes it
    router = Router(source, ROUTES, {**DATABASES, source.name: source})
    decision = classify(_message(text), router, Outgoing(source.name))
    assert isinstance(decision, Reject)
    assert decision.reason_code == "unroutable"
    assert f"table name '{table}' contains an unpaired surrogate" in decision.reason
    assert "which no database can store" in decision.reason
    assert DESTINATION_HEADER in decision.reason
    decision.reason.encode("utf-8")  # it goes into a header of the error queue row


# --------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------


def test_a_routable_message_is_delivered_to_the_routed_destination() -> None:
    decision = _classify({DESTINATION_HEADER: "Receiver", "NServiceBus.MessageId": "m-1"})
    assert isinstance(decision, Forward)
    assert decision.destination == Destination(
        database="receiver",
        address=TableAddress("Receiver", "public"),
        canonical='"public"."Receiver"',
    )


def test_a_message_for_another_dialect_gets_that_dialects_address() -> None:
    decision = _classify({DESTINATION_HEADER: '"public"."EdgeQueue"'})
    assert isinstance(decision, Forward)
    assert decision.destination.database == "edge"
    assert decision.destination.canonical == "EdgeQueue"


def test_delivered_headers_lose_the_routing_headers_and_keep_everything_else_unchanged() -> None:
    # Everything an endpoint wrote travels as it was: order, odd keys, nulls, controls...
    headers = {
        "NServiceBus.MessageId": "m-1",
        DESTINATION_HEADER: "Receiver",
        "NServiceBus.CorrelationId": None,
        EVENT_TYPE_HEADER: "Samples.Event",
        "NServiceBus.EnclosedMessageTypes": "Samples.Msg, Samples",
        "Ort": "Zürich – 東京 🎉",
        "": "",
        "$.sfbridge.attempts": "2",
        'quote"back\\slash': "line\nbreak\x00",
    }
    decision = _classify(headers)
    assert isinstance(decision, Forward)
    # ...and the bridge's own headers, which are not a sender's to set (issue 32).
    expected = {
        k: v
        for k, v in headers.items()
        if k not in (DESTINATION_HEADER, EVENT_TYPE_HEADER) and not k.startswith("$.sfbridge.")
    }
    delivered = parse_headers(decision.headers_text)
    assert delivered == expected
    assert list(delivered) == list(expected)


def test_delivered_headers_text_is_compact_with_raw_non_ascii() -> None:
    text = '{"NServiceBus.MessageId":"m-1","' + DESTINATION_HEADER + '":"Receiver","Ort":"Zürich"}'
    decision = _classify(text)
    assert isinstance(decision, Forward)
    assert decision.headers_text == '{"NServiceBus.MessageId":"m-1","Ort":"Zürich"}'


def test_deliver_keeps_the_full_parsed_headers_for_error_handling() -> None:
    headers = {DESTINATION_HEADER: "Receiver", "NServiceBus.MessageId": "m-1"}
    decision = _classify(headers)
    assert isinstance(decision, Forward)
    assert decision.headers == headers


def test_the_message_id_comes_from_the_nservicebus_message_id_header() -> None:
    decision = _classify({DESTINATION_HEADER: "Receiver", "NServiceBus.MessageId": "abc-123"})
    assert isinstance(decision, Forward)
    assert decision.message_id == "abc-123"


@pytest.mark.parametrize("message_id", [None, ""])
def test_the_message_id_falls_back_to_the_row_id(message_id: str | None) -> None:
    headers = {DESTINATION_HEADER: "Receiver", "NServiceBus.MessageId": message_id}
    decision = _classify(headers)
    assert isinstance(decision, Forward)
    assert decision.message_id == str(ROW_ID)


def test_the_message_id_falls_back_to_the_row_id_when_the_header_is_absent() -> None:
    decision = _classify({DESTINATION_HEADER: "Receiver"})
    assert isinstance(decision, Forward)
    assert decision.message_id == "9c8b3f6e-2f6a-4a4e-9f3e-6c1d2b7a5e01"


def test_the_message_id_header_is_forwarded_too() -> None:
    decision = _classify({DESTINATION_HEADER: "Receiver", "NServiceBus.MessageId": "m-1"})
    assert isinstance(decision, Forward)
    assert parse_headers(decision.headers_text)["NServiceBus.MessageId"] == "m-1"


def test_retry_storage_fields_do_not_change_the_decision() -> None:
    decision = _classify(
        {DESTINATION_HEADER: "Receiver"},
        attempts=7,
        first_failure_at=datetime(2024, 1, 1),
        last_error="timeout",
    )
    assert isinstance(decision, Forward)


def test_the_body_does_not_matter_to_classification() -> None:
    assert isinstance(_classify({DESTINATION_HEADER: "Receiver"}, body=None), Forward)
    assert isinstance(_classify({DESTINATION_HEADER: "Receiver"}, body=b"\xff\x00"), Forward)


def test_a_deliverable_message_has_headers_text_the_destination_can_store() -> None:
    # An unpaired surrogate (valid JSON, which .NET strings may hold) is delivered, not
    # poison: escaped, so that the text is UTF-8 and reads back as the same string.
    decision = _classify('{"' + DESTINATION_HEADER + '":"Receiver","a":"\\ud800"}')
    assert isinstance(decision, Forward)
    assert decision.headers_text == '{"a":"\\ud800"}'
    assert decision.headers_text.encode("utf-8").decode("utf-8") == decision.headers_text
