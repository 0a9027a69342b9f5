"""check warns about a route whose glob matches a table of the bridge's (which the data path
refuses whatever the route says). Pure: from the configuration alone."""

from __future__ import annotations

from bridge.commands.check_reach import check_route_reach
from bridge.config.model import (
    BridgeConfig,
    DatabaseConfig,
    FixedDestination,
    ForwarderConfig,
    RouteConfig,
)

DATABASES = {
    "sender": DatabaseConfig("sender", "postgresql", connection="Server=a;Database=s"),
    "receiver": DatabaseConfig("receiver", "postgresql", connection="Server=b;Database=r"),
}
FORWARDERS = (
    ForwarderConfig("sender", "sender", '"Samples.Sender.Forward"'),
    ForwarderConfig("receiver-out", "receiver", '"Samples.Receiver.Forward"'),
    ForwarderConfig(
        "to-sender", "receiver", '"Samples.Sender"', error_queue="proxy_error",
        destination=FixedDestination("sender"),
    ),
)  # fmt: skip


def warnings(*routes: RouteConfig) -> list[str]:
    config = BridgeConfig(databases=DATABASES, forwarders=FORWARDERS, routes=routes)
    found = list(check_route_reach(config))
    assert all(finding.ok and finding.warning for finding in found)
    return [str(finding) for finding in found]


def test_a_glob_matching_another_forwarders_queue_is_a_warning() -> None:
    assert warnings(RouteConfig("Samples.Receiver*", "receiver")) == [
        "WARNING  routes[0] (match 'Samples.Receiver*'): matches queue "
        '"public"."Samples.Receiver.Forward" of forwarder \'receiver-out\' in database '
        "'receiver': messages addressed there are refused as unroutable (the bridge never "
        "delivers into its own tables); narrow the glob"
    ]


def test_every_kind_of_table_the_bridge_owns_is_named() -> None:
    [line] = warnings(RouteConfig("*", "receiver"))
    assert 'queue "public"."Samples.Receiver.Forward" of forwarder \'receiver-out\'' in line
    assert 'proxy queue "public"."Samples.Sender" of forwarder \'to-sender\'' in line
    assert 'error queue "public"."proxy_error" of forwarder \'to-sender\'' in line
    assert "the bridge's own sfbridge_* tables" in line
    [some] = warnings(RouteConfig("sfbridge_l*", "sender"))
    assert "the bridge's own tables sfbridge_ledger in database 'sender'" in some


def test_routes_that_reach_only_endpoints_queues_draw_no_warning() -> None:
    # The queue names match only in another database: there they are the endpoints'.
    assert (
        warnings(
            RouteConfig("Samples.Receiver", "receiver"),
            RouteConfig("Samples.Billing*", "receiver"),
            RouteConfig("Samples.Receiver.Forward", "sender"),
        )
        == []
    )
