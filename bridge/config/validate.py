"""Validation of a parsed YAML document: the walk against the schema, then the checks across
keys, then the frozen `BridgeConfig`.

Every problem is collected (`bridge.config.walker` never stops at the first mistake) and only
a document without errors becomes a configuration.
"""

from __future__ import annotations

import os
import types
from collections.abc import Mapping
from typing import Any

from bridge.config.catalogs import partial_catalog
from bridge.config.cross_checks import check_across_keys
from bridge.config.environment import Unresolved
from bridge.config.model import (
    BridgeConfig,
    DaemonConfig,
    DatabaseConfig,
    DeliveryConfig,
    ErrorArchiveConfig,
    ForwarderConfig,
    InstallConfig,
    LedgerConfig,
    LoggingConfig,
    MetricsConfig,
    PublishConfig,
    RetryConfig,
    RouteConfig,
    SentryConfig,
    ServiceControlConfig,
    SubscriptionTableConfig,
    TracingConfig,
)
from bridge.config.problems import Problem, ProblemLog
from bridge.config.schema import SUBSCRIPTIONS
from bridge.config.walker import Document, Entry, walk

__all__ = ["validate"]


def validate(
    raw: object, environ: Mapping[str, str], source_path: str | None = None
) -> tuple[BridgeConfig | None, list[Problem]]:
    """Check a parsed YAML document and build the configuration from it.

    Given the document as `yaml.safe_load` returns it, the environment used for `${VAR}`
    expansion and the file it came from (stored as `BridgeConfig.source_path`; relative SQLite
    paths are resolved against its folder). Returns `(config, problems)`: every problem found,
    in document order followed by cross-key checks, and the config only when none of them is an
    error (warnings allowed), else None. Never raises for bad input.
    """
    log = ProblemLog()
    document = walk(raw, environ, log)
    if document is None:
        return None, log.problems
    check_across_keys(document, log)
    if log.has_errors:
        return None, log.problems
    return _build(document, source_path), log.problems


def _build(document: Document, source_path: str | None) -> BridgeConfig:
    databases = {
        name: DatabaseConfig(name=name, **_database_values(entry, source_path))
        for name, entry in document.databases.items()
    }
    mappings = {name: entry.values if entry else {} for name, entry in document.mappings.items()}
    return BridgeConfig(
        databases=types.MappingProxyType(databases),
        forwarders=tuple(ForwarderConfig(**e.values) for e in document.forwarders if e),
        routes=tuple(RouteConfig(**e.values) for e in document.routes if e),
        retries=RetryConfig(**mappings["retries"]),
        delivery=DeliveryConfig(**mappings["delivery"]),
        install=InstallConfig(**mappings["install"]),
        ledger=LedgerConfig(**mappings["ledger"]),
        error_archive=ErrorArchiveConfig(**mappings["error_archive"]),
        daemon=DaemonConfig(**mappings["daemon"]),
        logging=LoggingConfig(**mappings["logging"]),
        sentry=SentryConfig(**_resolved(mappings["sentry"], "dsn")),
        metrics=MetricsConfig(**mappings["metrics"]),
        servicecontrol=(
            ServiceControlConfig(**mappings["servicecontrol"])
            if "servicecontrol" in mappings
            else None
        ),
        tracing=TracingConfig(**mappings["tracing"]),
        subscriptions=types.MappingProxyType(
            {
                topic: tuple(item.value for item in items)
                for topic, items in document.multimaps.get(SUBSCRIPTIONS.name, {}).items()
            }
        ),
        subscription_tables=tuple(
            SubscriptionTableConfig(**e.values) for e in document.subscription_tables if e
        ),
        publish=PublishConfig(**mappings["publish"]),
        source_path=source_path,
    )


def _resolved(values: dict[str, Any], key: str) -> dict[str, Any]:
    """`values` with an `Unresolved` value of `key` moved to `unresolved` (`key`: None)."""
    value = values.get(key)
    if not isinstance(value, Unresolved):
        return values
    return {**values, key: None, "unresolved": value}


def _database_values(entry: Entry, source_path: str | None) -> dict[str, Any]:
    values = _resolved(_resolved(dict(entry.values), "connection"), "path")
    unresolved = values.get("unresolved")
    if unresolved is not None and values.get("catalog") is None:
        # The catalog addresses name the database by, where the connection string says it
        # without the unset variables (`Database=ReceiverDb;Pwd=${RECEIVER_PASSWORD}`);
        # else `bridge.config.catalogs` asks for them when the catalog is needed.
        values["catalog"] = partial_catalog(values["dialect"], unresolved)
    path = values.get("path")
    # Relative SQLite paths are taken from the config file's folder, not from the working
    # directory, which under systemd is `/` and differs between a shell and the service.
    if (
        path
        and source_path
        and not os.path.isabs(path)
        and path != ":memory:"
        and not path.startswith("file:")
    ):
        base = os.path.dirname(os.path.abspath(source_path))
        values["path"] = os.path.normpath(os.path.join(base, path))
    return values
