"""check: what the routes let a sender reach that it should not. Pure: reads the config only.

The data path refuses a destination that is one of the bridge's own tables (`bridge.routing`),
whatever the routes say; a route whose glob could match one is still worth a warning, since
it was probably meant narrower, and the messages a sender addresses there fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from fnmatch import fnmatchcase

from bridge.commands.check_tables import Finding
from bridge.config.model import BridgeConfig
from bridge.dialects.base import BRIDGE_TABLES
from bridge.dialects.registry import grammar_for
from bridge.storage.tables import forwarder_tables


def check_route_reach(config: BridgeConfig) -> Iterator[Finding]:
    """A warning per route whose glob matches a queue the bridge owns in the route's database
    (a forwarder's queue, a proxy queue, an error queue) or one of its `sfbridge_*` tables."""
    for index, route in enumerate(config.routes):
        grammar = grammar_for(config.databases[route.database].dialect)
        matched: list[str] = []
        for forwarder in config.forwarders:
            if forwarder.database != route.database:
                continue
            tables = forwarder_tables(config, forwarder)
            kind = "proxy queue" if forwarder.destination is not None else "queue"
            for what, address in ((kind, tables.queue), ("error queue", tables.error_queue)):
                if fnmatchcase(address.table, route.match):
                    rendered = grammar.render(address)
                    matched.append(f"{what} {rendered} of forwarder '{forwarder.name}'")
        own = [name for name in BRIDGE_TABLES if fnmatchcase(name, route.match)]
        if len(own) == len(BRIDGE_TABLES):
            matched.append("the bridge's own sfbridge_* tables")
        elif own:
            matched.append("the bridge's own tables " + ", ".join(own))
        if matched:
            yield Finding(
                True,
                f"routes[{index}] (match '{route.match}')",
                f"matches {'; '.join(dict.fromkeys(matched))} in database '{route.database}': "
                "messages addressed there are refused as unroutable (the bridge never "
                "delivers into its own tables); narrow the glob",
                warning=True,
            )
