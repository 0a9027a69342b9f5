"""Where a proxy forwarder delivers, as an address: one rule for validation and the data path.

It lives in the config package because validation needs it and `bridge.forwarding.proxies`, which
the data path uses, imports the config package.
"""

from __future__ import annotations

from bridge.addressing import TableAddress
from bridge.config.catalogs import database_catalog, same_catalog
from bridge.config.model import DatabaseConfig, FixedDestination
from bridge.dialects.registry import grammar_for

__all__ = ["fixed_destination_address"]


def fixed_destination_address(
    proxy_queue: str, source: DatabaseConfig, fixed: FixedDestination, target: DatabaseConfig
) -> TableAddress:
    """The queue a proxy delivers to, resolved for `target`.

    Given the proxy's `queue` text (in `source`'s grammar) and its `destination`. Without
    `destination.queue`, the proxy's own table name is used; its schema travels only between
    databases of one dialect and its catalog never does (the destination is another database,
    whatever the proxy's own address says). A catalog in `destination.queue` that is the
    destination database's own is its connection's database, so it is dropped; another stays
    (a catalog on that database's server). Raises AddressError when the queue cannot be a
    queue of `target` (a bad address, a name `target` cannot hold).
    """
    grammar = grammar_for(target.dialect)
    if fixed.queue is not None:
        parsed = grammar.parse(fixed.queue)
        if same_catalog(parsed.catalog, database_catalog(target)):
            parsed = TableAddress(parsed.table, parsed.schema, None)  # the connection's own
    else:
        own = grammar_for(source.dialect).parse(proxy_queue)
        same_dialect = source.dialect == target.dialect
        parsed = TableAddress(own.table, own.schema if same_dialect else None, None)
    address = grammar.resolve(parsed, target.schema, None)
    grammar.render(address)  # validates what only rendering checks
    return address
