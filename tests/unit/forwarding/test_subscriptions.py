"""The subscriber directory: YAML plus tables, cached, and tolerant of a table going away."""

from __future__ import annotations

import sqlite3
import types
from pathlib import Path

import pytest

from bridge.config.model import (
    BridgeConfig,
    DatabaseConfig,
    ForwarderConfig,
    PublishConfig,
    RouteConfig,
    SubscriptionTableConfig,
)
from bridge.exceptions import DatabaseError
from bridge.forwarding.subscriptions import CONFIG_SOURCE, SubscriberDirectory


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
