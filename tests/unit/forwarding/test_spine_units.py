"""The spine's second step: one unit per claimed message, or per subscriber copy of a published
event (bridge.forwarding.spine with bridge.forwarding.fan_out). Subscribers from YAML, so no
database is read."""

from __future__ import annotations

import gc
import json
import uuid
from typing import Any

from bridge.config.model import (
    BridgeConfig,
    DatabaseConfig,
    ForwarderConfig,
    RouteConfig,
)
from bridge.connections import Connections
from bridge.forwarding.spine import (
    YOUNG_COLLECTION_THRESHOLD,
    BatchForwarder,
    tune_garbage_collection,
)
from bridge.headers import DESTINATION_HEADER, EVENT_TYPE_HEADER, parse_headers
from bridge.messages import ClaimedMessage, Forward, NoSubscribers, Poison, Reject

CONFIG = BridgeConfig(
    databases={
        "sender": DatabaseConfig("sender", "postgresql", connection="x"),
        "receiver": DatabaseConfig("receiver", "postgresql", connection="y"),
    },
    forwarders=(ForwarderConfig("f", "sender", "forward"),),
    routes=(RouteConfig("*", "receiver"),),
    subscriptions={"Shared.OrderAccepted": ('"public"."Billing"', '"public"."Shipping"')},
)


def claimed(headers: dict[str, Any] | str) -> ClaimedMessage:
    text = headers if isinstance(headers, str) else json.dumps(headers)
    return ClaimedMessage(uuid.uuid4(), False, None, text, b"body", 1)


def units_of(message: ClaimedMessage):  # type: ignore[no-untyped-def]
    forwarder = BatchForwarder(CONFIG, CONFIG.forwarders[0], Connections(CONFIG.databases))
    return forwarder.units_of(None, message, [])  # type: ignore[arg-type]  # YAML: no connection


def test_a_sent_message_is_one_unit_that_would_be_retried_with_its_own_headers() -> None:
    message = claimed({"NServiceBus.MessageId": "m", DESTINATION_HEADER: '"public"."Billing"'})
    [unit] = units_of(message)
    assert isinstance(unit.decision, Forward)
    assert unit.retry_headers_text == message.headers_text


def test_a_published_event_is_one_unit_per_subscriber_each_retried_as_a_unicast() -> None:
    message = claimed({"NServiceBus.MessageId": "m", EVENT_TYPE_HEADER: "Shared.OrderAccepted"})
    units = units_of(message)
    assert [unit.decision.destination.canonical for unit in units] == [  # type: ignore[union-attr]
        '"public"."Billing"',
        '"public"."Shipping"',
    ]
    for unit, table in zip(units, ('"public"."Billing"', '"public"."Shipping"'), strict=True):
        retried = parse_headers(unit.retry_headers_text)
        assert retried[DESTINATION_HEADER] == table and EVENT_TYPE_HEADER not in retried


def test_an_event_nobody_subscribes_to_is_one_unit_saying_so() -> None:
    [unit] = units_of(claimed({EVENT_TYPE_HEADER: "Shared.Unknown"}))
    assert isinstance(unit.decision, NoSubscribers)


def test_poison_and_rejects_are_one_unit_each() -> None:
    assert isinstance(units_of(claimed("not json"))[0].decision, Poison)
    assert isinstance(units_of(claimed({"x": "y"}))[0].decision, Reject)


def test_forwarding_collects_the_young_generation_less_often_and_keeps_the_older_ones() -> None:
    before = gc.get_threshold()
    try:
        tune_garbage_collection()
        assert gc.get_threshold() == (YOUNG_COLLECTION_THRESHOLD, *before[1:])
        assert before[0] < YOUNG_COLLECTION_THRESHOLD
    finally:
        gc.set_threshold(*before)
