"""Specification of fanning a published event out to its subscribers (bridge.forwarding.fan_out)."""

from __future__ import annotations

import uuid

from bridge.config.model import DatabaseConfig, RouteConfig
from bridge.forwarding.fan_out import Fanout, copy_row_id, fan_out
from bridge.forwarding.outgoing import Outgoing
from bridge.forwarding.subscriptions import Subscriber
from bridge.headers import EVENT_TYPE_HEADER
from bridge.messages import Forward, Publish, Reject
from bridge.routing import Router

SENDER = DatabaseConfig("sender", "postgresql", connection="Driver=x")
RECEIVER = DatabaseConfig("receiver", "postgresql", connection="Driver=y")
MSSQL = DatabaseConfig("mssql", "sqlserver", connection="Driver=w")
DATABASES = {db.name: db for db in (SENDER, RECEIVER, MSSQL)}
ROUTES = (RouteConfig("Receiver*", "receiver"), RouteConfig("*", "mssql"))

EVENT = "Samples.OrderPlaced, Samples"
PUBLISH = Publish(
    {EVENT_TYPE_HEADER: EVENT, "NServiceBus.MessageId": "m-1"}, EVENT, ("Samples.OrderPlaced",)
)


def test_a_subscriber_address_with_an_unpaired_surrogate_is_rejected_the_others_delivered() -> None:
    # Read from SQL Server's subscription table, where a .NET string can hold a lone surrogate.
    table = "subscription table mssql.SubscriptionRouting"
    bad = Subscriber("Billing\udc00@[dbo]", table, "mssql")
    good = Subscriber("Receiver", "subscriptions in the config", "sender")
    fanout = fan_out(
        PUBLISH,
        [bad, good],
        Router(SENDER, ROUTES, DATABASES),
        Outgoing(SENDER.name),
        fallback_message_id="r",
    )
    assert isinstance(fanout, Fanout)
    rejected, delivered = (copy.decision for copy in fanout.copies)
    assert isinstance(rejected, Reject)
    assert rejected.reason_code == "unroutable"
    assert rejected.reason.startswith(f"subscriber 'Billing\\udc00@[dbo]' ({table}) of {EVENT!r}: ")
    assert "table name 'Billing\\udc00' contains an unpaired surrogate (\\udc00)" in rejected.reason
    rejected.reason.encode("utf-8")
    assert isinstance(delivered, Forward)
    assert delivered.destination.canonical == '"public"."Receiver"'


def test_a_copy_of_an_event_without_a_message_id_is_known_by_the_event_row_id() -> None:
    # Its own row Id (`copy_row_id`) is another: a retry must find it in the ledger by this one.
    publish = Publish({EVENT_TYPE_HEADER: EVENT}, EVENT, ("Samples.OrderPlaced",))
    good = Subscriber("Receiver", "subscriptions in the config", "sender")
    bad = Subscriber("Nowhere\udc00", "subscriptions in the config", "sender")
    fanout = fan_out(
        publish,
        [good, bad],
        Router(SENDER, ROUTES, DATABASES),
        Outgoing(SENDER.name),
        fallback_message_id="row-1",
    )
    assert isinstance(fanout, Fanout)
    for copy in fanout.copies:
        assert copy.decision.headers["NServiceBus.MessageId"] == "row-1"


def test_each_copy_has_its_own_row_id_the_same_every_time() -> None:
    event_row = uuid.UUID("6f1c1f0e-8a53-4cf3-9a40-5b8a3c1d2e7f")
    here = Subscriber("Receiver", "subscriptions in the config", "sender")
    there = Subscriber("Receiver", "subscription table mssql.SubscriptionRouting", "mssql")
    ids = {copy_row_id(event_row, here), copy_row_id(event_row, there), event_row}
    assert len(ids) == 3
    assert copy_row_id(event_row, here) == copy_row_id(event_row, here)
