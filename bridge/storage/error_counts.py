"""Error-queue counts that belong to their forwarder.

An error queue may be shared by several forwarders and by the endpoints themselves. Each
message in it names the queue it failed in (`NServiceBus.FailedQ`, which the daemon writes as
the forwarder's own queue address); `QueueOwners` tells which forwarder drains that queue, if
any. `read_error_counts` counts a forwarding database's error queues with one grouped query
per queue (never one per forwarder): per forwarder, and apart, what failed elsewhere (the
endpoints' own failures, rows without `FailedQ`, poison), for `sfbridge status` and the metrics.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from bridge.addressing import AddressGrammar, TableAddress
from bridge.config.catalogs import database_catalog, same_catalog
from bridge.config.model import BridgeConfig
from bridge.dialects import dialect_for
from bridge.drivers import Connection
from bridge.exceptions import AddressError, TableNotFound
from bridge.headers import FAILED_QUEUE_HEADER
from bridge.storage.tables import forwarder_tables


class QueueOwners:
    """Which forwarder drains a queue in one database, by the queue's address.

    Given the database's name, address grammar and default schema, each forwarder's resolved
    queue address, and the database's own catalog where addresses have catalogs (SQL Server).
    Addresses compare as the transports compare them: table and schema exactly; catalogs
    (a missing one being the database's own) without case, when both are known.
    """

    def __init__(
        self,
        database: str,
        grammar: AddressGrammar,
        default_schema: str | None,
        queues: Mapping[str, TableAddress],
        default_catalog: str | None = None,
    ) -> None:
        self.database = database
        self._grammar = grammar
        self._default_schema = default_schema
        self._queues = dict(queues)
        self._default_catalog = default_catalog
        # Answers by FailedQ text: an error queue's messages name a few queues many times.
        self._answers: dict[str | None, tuple[str | None, str | None]] = {}

    def owner_of(self, failed_queue: str | None) -> tuple[str | None, str | None]:
        """(forwarder, None) for a queue a forwarder drains, else (None, why not)."""
        answer = self._answers.get(failed_queue)
        if answer is None:
            answer = self._answers[failed_queue] = self._owner_of(failed_queue)
        return answer

    def _owner_of(self, failed_queue: str | None) -> tuple[str | None, str | None]:
        if failed_queue is None or not failed_queue.strip():
            return None, (
                f"it has no '{FAILED_QUEUE_HEADER}' header, so the queue it failed in is unknown"
            )
        try:
            address = self._grammar.resolve(
                self._grammar.parse(failed_queue), self._default_schema, None
            )
        except AddressError as error:
            return (
                None,
                f"its '{FAILED_QUEUE_HEADER}' {failed_queue!r} is not a queue address ({error})",
            )
        seen = address.catalog or self._default_catalog
        for name, queue in self._queues.items():
            own = queue.catalog or self._default_catalog
            if (queue.table, queue.schema) == (address.table, address.schema) and (
                own is None or seen is None or same_catalog(own, seen)
            ):
                return name, None
        return None, (
            f"it failed in {failed_queue}, which no forwarder in database '{self.database}' "
            "drains (an endpoint's failed message: retry it from ServicePulse)"
        )


def database_owners(config: BridgeConfig, database: str) -> QueueOwners:
    """Who drains each queue of the forwarding database `database`."""
    settings = config.databases[database]
    return QueueOwners(
        database,
        dialect_for(settings.dialect).grammar,
        settings.schema,
        {
            f.name: forwarder_tables(config, f).queue
            for f in config.forwarders
            if f.database == database
        },
        default_catalog=database_catalog(settings),
    )


@dataclass(frozen=True)
class ErrorQueueCount:
    """One error queue of a forwarding database: its messages per forwarder that failed them
    (by `NServiceBus.FailedQ`), and how many failed in no forwarder's queue (`other`)."""

    database: str
    error_queue: str  # as rendered in the database's grammar
    exists: bool
    by_forwarder: dict[str, int] = field(default_factory=dict)
    other: int = 0

    @property
    def total(self) -> int:
        return sum(self.by_forwarder.values()) + self.other


def read_error_counts(
    config: BridgeConfig, database: str, connection: Connection
) -> list[ErrorQueueCount]:
    """Count every error queue the forwarders of `database` write to, each with one grouped
    read, in one read transaction. Raises the DatabaseError family (a missing error queue
    counts as empty, `exists` False)."""
    dialect = dialect_for(config.databases[database].dialect)
    owners = database_owners(config, database)
    queues: dict[str, TableAddress] = {}
    for forwarder in config.forwarders:
        if forwarder.database == database:
            address = forwarder_tables(config, forwarder).error_queue
            queues.setdefault(dialect.grammar.render(address), address)
    counts = []
    for name, address in queues.items():
        try:
            connection.begin_read()
            rows = connection.query_named(dialect.sql("error_queue_failed_queues", queue=address))
        except TableNotFound:
            counts.append(ErrorQueueCount(database, name, exists=False))
            continue
        finally:
            connection.rollback()
        by_forwarder: dict[str, int] = {}
        other = 0
        for row in rows:
            messages = int(row["messages"])
            owner, _ = owners.owner_of(_failed_queue(row))
            if owner is None:
                other += messages
            else:
                by_forwarder[owner] = by_forwarder.get(owner, 0) + messages
        counts.append(ErrorQueueCount(database, name, True, by_forwarder, other))
    return counts


def _failed_queue(row: Mapping[str, object]) -> str | None:
    """The FailedQ a grouped row names: decoded by the database (`failed_queue`), or as the
    JSON text holds it, escapes and all (`failed_queue_json`), decoded here."""
    if "failed_queue" in row:
        value = row["failed_queue"]
        return None if value is None else str(value)
    text = row["failed_queue_json"]
    if text is None:
        return None
    try:
        decoded = json.loads(f'"{text}"')
    except ValueError:
        return str(text)
    return decoded if isinstance(decoded, str) else str(text)
