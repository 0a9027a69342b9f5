"""The tables no message may be delivered into are worked out once per configuration: a daemon
builds a router per forwarder in every worker, and with hundreds of forwarders working them
out again for each made every forwarder's first batch slow (docs/performance.md)."""

from __future__ import annotations

from bridge.config.model import BridgeConfig, DatabaseConfig, ForwarderConfig, RouteConfig
from bridge.storage.tables import owned_tables


def _config(forwarders: int) -> BridgeConfig:
    return BridgeConfig(
        databases={
            "src": DatabaseConfig("src", "postgresql", "x"),
            "dst": DatabaseConfig("dst", "postgresql", "x"),
        },
        forwarders=tuple(ForwarderConfig(f"f{i}", "src", f"q{i}") for i in range(forwarders)),
        routes=(RouteConfig("*", "dst"),),
    )


def test_every_forwarders_queue_and_error_queue_are_owned() -> None:
    owned = owned_tables(_config(3))
    assert owned["src"][("public", "q2")] == "the forwarding queue of forwarder 'f2'"
    assert ("public", "error") in owned["src"]
    assert "dst" not in owned


def test_one_configuration_is_worked_out_once_and_a_reloaded_one_again() -> None:
    config = _config(500)
    first = owned_tables(config)
    assert owned_tables(config) is first  # the same, not worked out again
    reloaded = _config(2)
    assert ("public", "q499") not in owned_tables(reloaded)["src"]
    assert owned_tables(config) == first
