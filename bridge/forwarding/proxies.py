"""Proxy queues: where a proxy forwarder delivers, and the router of each forwarder. Pure.

A *proxy* is a forwarder with a fixed `destination`: its queue is a table named after an
endpoint that lives in another database, so that unchanged endpoints reach that endpoint with
their ordinary send, as they did in the SQL Server transport's multi-instance mode. Every
message in a proxy goes to its destination (one carrying a routing header is still routed by
that header). The reply addresses that cross a proxy are rewritten with the rest of the
outgoing message (`bridge.forwarding.outgoing`).
"""

from __future__ import annotations

from bridge.config.model import (
    BridgeConfig,
    DatabaseConfig,
    FixedDestination,
    ForwarderConfig,
    TransactionMode,
)
from bridge.config.proxy_addresses import fixed_destination_address
from bridge.dialects.registry import grammar_for
from bridge.routing import Destination, Router
from bridge.storage.tables import owned_tables

__all__ = ["forwarder_router", "proxy_destination", "resolve_fixed_destination"]


def resolve_fixed_destination(
    proxy_queue: str,
    source: DatabaseConfig,
    fixed: FixedDestination,
    target: DatabaseConfig,
    default_transaction: TransactionMode = "ledger",
) -> Destination:
    """The queue a proxy delivers to (see `fixed_destination_address`) as a `Destination`."""
    address = fixed_destination_address(proxy_queue, source, fixed, target)
    canonical = grammar_for(target.dialect).render(address)
    return Destination(
        database=target.name,
        address=address,
        canonical=canonical,
        transaction=fixed.transaction or default_transaction,
    )


def proxy_destination(config: BridgeConfig, forwarder: ForwarderConfig) -> Destination | None:
    """Where a proxy forwarder delivers; None for a forwarder that routes by headers.

    Raises AddressError only for a config that skipped validation (it checks the same).
    """
    if forwarder.destination is None:
        return None
    return resolve_fixed_destination(
        forwarder.queue,
        config.databases[forwarder.database],
        forwarder.destination,
        config.databases[forwarder.destination.database],
        config.delivery.transaction,
    )


def forwarder_router(config: BridgeConfig, forwarder: ForwarderConfig) -> Router:
    """The router of one forwarder: its routes and its proxy destination."""
    return Router(
        config.databases[forwarder.database],
        config.routes,
        config.databases,
        proxy=proxy_destination(config, forwarder),
        default_transaction=config.delivery.transaction,
        owned=owned_tables(config),
        address_databases=frozenset(table.database for table in config.subscription_tables),
    )
