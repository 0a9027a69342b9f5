"""The dedup ledger's keys and where ledgers live (bridge.storage.ledger). Pure."""

from __future__ import annotations

import hashlib

import pytest

from bridge.config.model import BridgeConfig, DatabaseConfig, ForwarderConfig, RouteConfig
from bridge.forwarding.fan_out import event_type_key
from bridge.forwarding.spine import probe_interval
from bridge.storage.ledger import ledger_databases, ledger_key


def test_an_ordinary_message_id_is_stored_as_it_is() -> None:
    message_id = "5f1c9a4e-2b1d-4c8e-9a0b-3f6d7e8c1a2b"
    assert ledger_key(message_id) == message_id


@pytest.mark.parametrize(
    "message_id",
    ["x" * 200, "é" * 100, "\U0001f600" * 50],  # exactly 200 bytes of UTF-8
)
def test_an_id_of_200_utf8_bytes_still_fits(message_id: str) -> None:
    assert ledger_key(message_id) == message_id


@pytest.mark.parametrize(
    "message_id",
    [
        "x" * 201,
        "é" * 101,  # 101 characters, 202 bytes
        "\U0001f600" * 51,  # 51 characters, 102 UTF-16 code units (SQL Server), 204 bytes
        "order/" + "7" * 5000,
        "nul\x00inside",  # PostgreSQL text cannot hold NUL
    ],
)
def test_a_long_or_unstorable_id_becomes_a_fixed_length_digest(message_id: str) -> None:
    key = ledger_key(message_id)
    expected = hashlib.sha256(message_id.encode("utf-8")).hexdigest()
    assert key == f"sha256:{expected}" and len(key) == 71


def test_long_ids_that_share_their_first_200_characters_get_different_keys() -> None:
    assert ledger_key("a" * 300 + "1") != ledger_key("a" * 300 + "2")


def test_an_unpaired_surrogate_does_not_break_the_digest() -> None:
    assert ledger_key("x" * 300 + "\ud800").startswith("sha256:")


def test_event_types_are_recorded_whole_until_they_would_not_fit_a_key() -> None:
    short = "Shared.Events.OrderAccepted"
    assert event_type_key(short) == short
    long = "Shared.Events.E" + "0123456789abcdef" * 600
    key = event_type_key(long)
    assert key.startswith(long[:300] + "... (sha256 ") and len(key) < 400
    assert event_type_key(long + "x") != key


def _config(*routes: RouteConfig, forwarders: tuple[str, ...] = ("sender",)) -> BridgeConfig:
    names = {"sender", "receiver", "billing", *(route.database for route in routes)}
    return BridgeConfig(
        databases={name: DatabaseConfig(name, "postgresql", connection="x") for name in names},
        forwarders=tuple(ForwarderConfig(f"f-{name}", name, "forward") for name in forwarders),
        routes=routes,
    )


def test_a_ledger_lives_in_every_database_delivered_to_from_another_one() -> None:
    config = _config(RouteConfig("Local*", "sender"), RouteConfig("*", "receiver"))
    assert ledger_databases(config) == ["receiver"]


def test_the_forwarding_database_gets_a_ledger_when_another_forwarder_delivers_into_it() -> None:
    config = _config(RouteConfig("*", "sender"), forwarders=("sender", "billing"))
    assert ledger_databases(config) == ["sender"]


def test_probing_follows_the_retry_delay_when_outages_wait_and_is_quick_otherwise() -> None:
    from dataclasses import replace

    config = _config(RouteConfig("*", "receiver"))
    waiting = replace(config, retries=replace(config.retries, during_outage="wait", delay=30.0))
    assert probe_interval(waiting) == 30.0
    counting = replace(config, retries=replace(config.retries, during_outage="count", delay=30.0))
    assert probe_interval(counting) == 5.0
