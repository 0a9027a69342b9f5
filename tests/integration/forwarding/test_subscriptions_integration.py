"""The subscriber directory: YAML plus tables, cached, and tolerant of a table going away."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.config.model import (
    BridgeConfig,
    DatabaseConfig,
    ForwarderConfig,
    RouteConfig,
    SubscriptionTableConfig,
)
from bridge.exceptions import AuthenticationFailed
from bridge.forwarding.subscriptions import SubscriberDirectory
from bridge.outages import OutageTracker


@pytest.mark.integration
def test_a_subscription_table_whose_login_is_refused_is_not_logged_into_per_event(
    postgres: Any,
) -> None:
    # A role that does not exist is refused like a wrong password (the server trusts every
    # password here); the relay counts the logins. Every published event looks subscribers up:
    # while the daemon's tracker says the login is refused, none of them may log in.
    from support import TcpRelay

    relay = TcpRelay.before(postgres.prefix)
    connection = (
        f"Driver={{PostgreSQL Unicode}};Server=127.0.0.1;Port={relay.port};"
        "Database=postgres;Uid=sfbridge_no_such_role;Pwd=secret;"
    )
    config = BridgeConfig(
        databases={
            "edge": DatabaseConfig("edge", "sqlite", path="/nonexistent/edge.db"),
            "central": DatabaseConfig("central", "postgresql", connection=connection),
        },
        forwarders=(ForwarderConfig("edge", "edge", "Edge.Forward"),),
        routes=(RouteConfig("*", "central"),),
        subscription_tables=(SubscriptionTableConfig("central"),),
    )
    tracker = OutageTracker(5.0, external_probe=True)
    directory = SubscriberDirectory(config, "edge", logins=tracker)
    for _ in range(20):
        with pytest.raises(AuthenticationFailed):
            directory.lookup(["Shared.OrderSubmitted"])
    assert relay.accepted == 1
    state = tracker.state("central")
    assert state is not None and state.state == "auth-failed"
