"""The subscriber directory: YAML plus tables, cached, and tolerant of a table going away."""

from __future__ import annotations

import sqlite3
import types
from pathlib import Path
from typing import Any

import pytest

from bridge.config.model import (
    BridgeConfig,
    DatabaseConfig,
    ForwarderConfig,
    PublishConfig,
    RouteConfig,
    SubscriptionTableConfig,
)
from bridge.exceptions import AuthenticationFailed, DatabaseError
from bridge.forwarding.subscriptions import CONFIG_SOURCE, SubscriberDirectory
from bridge.outages import OutageTracker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_config(tmp_path: Path) -> BridgeConfig:
    table_db = tmp_path / "subs.db"
    with sqlite3.connect(table_db) as connection:
        connection.execute(
            "CREATE TABLE SubscriptionRouting (QueueAddress TEXT, Endpoint TEXT, Topic TEXT)"
        )
        connection.execute(
            "INSERT INTO SubscriptionRouting VALUES ('Shipping', 'S', 'Shared.Base')"
        )
    databases = {
        "edge": DatabaseConfig("edge", "sqlite", path=str(tmp_path / "edge.db")),
        "subs": DatabaseConfig("subs", "sqlite", path=str(table_db)),
    }
    return BridgeConfig(
        databases=types.MappingProxyType(databases),
        forwarders=(ForwarderConfig("edge", "edge", "forward"),),
        routes=(RouteConfig("*", "subs"),),
        subscriptions=types.MappingProxyType({"Shared.Concrete": ("Billing",)}),
        subscription_tables=(SubscriptionTableConfig("subs"),),
        publish=PublishConfig(cache=5.0),
    )


def test_subscribers_come_from_the_config_and_the_tables_with_their_sources(tmp_path: Path) -> None:
    directory = SubscriberDirectory(make_config(tmp_path), "edge", clock=Clock())
    lookup = directory.lookup(["Shared.Concrete", "Shared.Base", "System.Object"])
    assert [(s.address, s.source, s.address_database) for s in lookup.subscribers] == [
        ("Billing", CONFIG_SOURCE, "edge"),
        ("Shipping", "table SubscriptionRouting in database 'subs'", "subs"),
    ]
    assert lookup.fresh


def test_table_lookups_are_cached_for_the_configured_time(tmp_path: Path) -> None:
    clock = Clock()
    config = make_config(tmp_path)
    directory = SubscriberDirectory(config, "edge", clock=clock)
    directory.lookup(["Shared.Base"])
    with sqlite3.connect(tmp_path / "subs.db") as connection:
        connection.execute("INSERT INTO SubscriptionRouting VALUES ('Audit', 'A', 'Shared.Base')")
    clock.now += 4.9
    cached = directory.lookup(["Shared.Base"])
    assert [s.address for s in cached.subscribers] == ["Shipping"] and not cached.fresh
    clock.now += 0.2
    refreshed = directory.lookup(["Shared.Base"])
    assert [s.address for s in refreshed.subscribers] == ["Audit", "Shipping"]
    assert refreshed.fresh


def test_an_unreadable_table_falls_back_to_the_last_list_or_raises_without_one(
    tmp_path: Path,
) -> None:
    clock = Clock()
    directory = SubscriberDirectory(make_config(tmp_path), "edge", clock=clock)
    directory.lookup(["Shared.Base"])
    (tmp_path / "subs.db").rename(tmp_path / "gone.db")
    clock.now += 60
    stale = directory.lookup(["Shared.Base"])
    assert [s.address for s in stale.subscribers] == ["Shipping"]
    with pytest.raises(DatabaseError):
        directory.lookup(["Shared.Other"])


@pytest.mark.integration
def test_a_subscription_table_whose_login_is_refused_is_not_logged_into_per_event(
    postgres: Any,
) -> None:
    # A role that does not exist is refused like a wrong password (the server trusts every
    # password here); the relay counts the logins. Every published event looks subscribers up:
    # while the daemon's tracker says the login is refused, none of them may log in.
    import re

    from support import TcpRelay

    port = int(re.search(r"Port=(\d+)", postgres.prefix).group(1))  # type: ignore[union-attr]
    relay = TcpRelay("127.0.0.1", port)
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
