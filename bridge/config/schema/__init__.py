"""The declarative schema of the YAML configuration file.

This module is the single source of truth about the configuration: `bridge.config.walker`
walks `SCHEMA` to check and convert a parsed YAML document, and `bridge.config.reference` turns
the very same description into the Markdown reference in docs/configuration.md. A key added here
is therefore validated and documented at once; a key that is not here is rejected as unknown.

Keys are named exactly like the fields of the dataclasses in `bridge.config.model`, and a unit
test checks that the defaults here equal the dataclass defaults.
"""

from __future__ import annotations

from typing import Final

from bridge.config.keys import Section
from bridge.config.schema.common import (
    CATALOG_DIALECTS,
    DIALECTS,
    DRIVER_DIALECTS,
    DRIVERS,
    FILE_DIALECTS,
    IMPLEMENTED_DIALECTS,
    NAME_MESSAGE,
    NAME_PATTERN,
    SCHEMA_DIALECTS,
    SERVER_DIALECTS,
)
from bridge.config.schema.databases import DATABASES
from bridge.config.schema.delivery import DELIVERY, ERROR_ARCHIVE, INSTALL, LEDGER, RETRIES
from bridge.config.schema.forwarding import (
    FORWARDERS,
    PUBLISH,
    ROUTES,
    SUBSCRIPTION_TABLES,
    SUBSCRIPTIONS,
)
from bridge.config.schema.operations import DAEMON, LOGGING, METRICS, SENTRY, TRACING
from bridge.config.schema.servicecontrol import SERVICECONTROL

__all__ = [
    "CATALOG_DIALECTS",
    "DAEMON",
    "DATABASES",
    "DELIVERY",
    "DIALECTS",
    "DRIVERS",
    "DRIVER_DIALECTS",
    "ERROR_ARCHIVE",
    "FILE_DIALECTS",
    "FORWARDERS",
    "IMPLEMENTED_DIALECTS",
    "INSTALL",
    "LEDGER",
    "LOGGING",
    "METRICS",
    "NAME_MESSAGE",
    "NAME_PATTERN",
    "PUBLISH",
    "RETRIES",
    "ROUTES",
    "SCHEMA",
    "SCHEMA_DIALECTS",
    "SENTRY",
    "SERVER_DIALECTS",
    "SERVICECONTROL",
    "SUBSCRIPTIONS",
    "SUBSCRIPTION_TABLES",
    "TRACING",
    "section",
]

SCHEMA: Final[tuple[Section, ...]] = (
    DATABASES,
    FORWARDERS,
    ROUTES,
    SUBSCRIPTIONS,
    SUBSCRIPTION_TABLES,
    PUBLISH,
    RETRIES,
    DELIVERY,
    INSTALL,
    LEDGER,
    ERROR_ARCHIVE,
    DAEMON,
    LOGGING,
    SENTRY,
    METRICS,
    SERVICECONTROL,
    TRACING,
)


def section(name: str) -> Section:
    """The top-level section called `name`; raises KeyError when there is none."""
    for candidate in SCHEMA:
        if candidate.name == name:
            return candidate
    raise KeyError(name)
