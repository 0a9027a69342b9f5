"""Specification of fanning a published event out to its subscribers (bridge.forwarding.fan_out)."""

from __future__ import annotations

from bridge.config.model import DatabaseConfig, RouteConfig
from bridge.forwarding.fan_out import Fanout, fan_out
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
        PUBLISH, [bad, good], Router(SENDER, ROUTES, DATABASES), fallback_message_id="r"
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
