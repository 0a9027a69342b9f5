"""Configuration: the YAML schema, its validation, and the frozen objects the bridge runs on."""

from bridge.config.durations import parse_duration
from bridge.config.load import load_config
from bridge.config.model import (
    BridgeConfig,
    DatabaseConfig,
    ForwarderConfig,
    LedgerConfig,
    LoggingConfig,
    PublishConfig,
    RetryConfig,
    RouteConfig,
    SentryConfig,
    SubscriptionTableConfig,
    TracingConfig,
)
from bridge.config.problems import Problem
from bridge.config.validate import validate
from bridge.exceptions import ConfigError

__all__ = [
    "BridgeConfig",
    "ConfigError",
    "DatabaseConfig",
    "ForwarderConfig",
    "LedgerConfig",
    "LoggingConfig",
    "Problem",
    "PublishConfig",
    "RetryConfig",
    "RouteConfig",
    "SentryConfig",
    "SubscriptionTableConfig",
    "TracingConfig",
    "load_config",
    "parse_duration",
    "validate",
]
