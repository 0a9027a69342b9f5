"""The tables a forwarder works with, resolved in its database's grammar."""

from __future__ import annotations

from dataclasses import dataclass

from bridge.addressing import QueueAddress
from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.dialects import dialect_for
from bridge.dialects.base import COUNTERS_TABLE, EVENT_TYPES_TABLE, RETRY_TABLE


@dataclass(frozen=True)
class ForwarderTables:
    """The resolved addresses a forwarder works with, all in its own database."""

    queue: QueueAddress
    error_queue: QueueAddress
    retry: QueueAddress
    counters: QueueAddress
    event_types: QueueAddress
    queue_canonical: str


def forwarder_tables(config: BridgeConfig, forwarder: ForwarderConfig) -> ForwarderTables:
    """Resolve a forwarder's queue, error queue and bridge tables in its database's grammar."""
    database = config.databases[forwarder.database]
    dialect = dialect_for(database.dialect)
    grammar = dialect.grammar
    queue = grammar.resolve(grammar.parse(forwarder.queue), database.schema, None)
    return ForwarderTables(
        queue=queue,
        error_queue=grammar.resolve(grammar.parse(forwarder.error_queue), database.schema, None),
        retry=dialect.bridge_table(RETRY_TABLE, database.schema),
        counters=dialect.bridge_table(COUNTERS_TABLE, database.schema),
        event_types=dialect.bridge_table(EVENT_TYPES_TABLE, database.schema),
        queue_canonical=grammar.render(queue),
    )
