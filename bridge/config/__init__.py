"""Configuration: the YAML schema, its validation, and the frozen objects the bridge runs on."""

from bridge.config.model import (
    BridgeConfig,
    DatabaseConfig,
    ForwarderConfig,
    LedgerConfig,
    LoggingConfig,
    RetryConfig,
    RouteConfig,
    SentryConfig,
)

__all__ = [
    "BridgeConfig",
    "DatabaseConfig",
    "ForwarderConfig",
    "LedgerConfig",
    "LoggingConfig",
    "RetryConfig",
    "RouteConfig",
    "SentryConfig",
]
