"""Who subscribes to a published event: the YAML `subscriptions` and NServiceBus's own
`SubscriptionRouting` tables (the SQL transports' native publish/subscribe).

Table lookups are cached per set of topics for `publish.cache` seconds (NServiceBus caches for
5 s), so a busy stream of events does not hammer the table; a subscription added to a table is
therefore seen at most that long after it was written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bridge.config.model import BridgeConfig, SubscriptionTableConfig
from bridge.connections import connect
from bridge.dialects import dialect_for
from bridge.exceptions import AuthenticationFailed, DatabaseError
from bridge.outages import OutageTracker

CONFIG_SOURCE = "config"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Subscriber:
    """A subscriber address, where it was found, and whose address grammar it is written in.

    `address_database` is the database whose grammar `address` uses: the forwarding database
    for YAML subscriptions, the table's database for subscription tables.
    """

    address: str
    source: str
    address_database: str


@dataclass(frozen=True)
class Lookup:
    """The subscribers for one event; `fresh` when a table was read (not from the cache)."""

    subscribers: tuple[Subscriber, ...]
    fresh: bool


def table_source(table: SubscriptionTableConfig) -> str:
    return f"table {table.table} in database '{table.database}'"


class SubscriberDirectory:
    """Finds subscribers for topics. One per worker thread (it uses the worker's connections).

    `logins`: a daemon's outage tracker. While it says a database refuses the bridge's login,
    its subscription table is not read (no login is tried: the daemon's probe alone does, see
    `bridge.outages`); a refusal met here is recorded there."""

    def __init__(
        self,
        config: BridgeConfig,
        forwarder_database: str,
        clock: Callable[[], float] = time.monotonic,
        logins: OutageTracker | None = None,
    ) -> None:
        self._config = config
        self._forwarder_database = forwarder_database
        self._clock = clock
        self._logins = logins
        self._cache: dict[tuple[int, frozenset[str]], tuple[float, tuple[str, ...]]] = {}

    def lookup(self, topics: Sequence[str]) -> Lookup:
        """Subscribers for any of `topics`, in a stable order.

        When a subscription table cannot be read, the last list read from it is used if there
        is one; otherwise raises DatabaseError (the event must then wait: its subscribers are
        unknown, and guessing could lose a copy).
        """
        found: list[Subscriber] = []
        for topic in topics:
            for address in self._config.subscriptions.get(topic, ()):
                found.append(Subscriber(address, CONFIG_SOURCE, self._forwarder_database))
        fresh = False
        for index, table in enumerate(self._config.subscription_tables):
            addresses, was_read = self._from_table(index, table, topics)
            fresh = fresh or was_read
            source = table_source(table)
            found.extend(Subscriber(address, source, table.database) for address in addresses)
        return Lookup(tuple(found), fresh)

    def _from_table(
        self, index: int, table: SubscriptionTableConfig, topics: Sequence[str]
    ) -> tuple[tuple[str, ...], bool]:
        key = (index, frozenset(topics))
        cached = self._cache.get(key)
        now = self._clock()
        if cached is not None and cached[0] > now:
            return cached[1], False
        try:
            self._refuse_while_refused(table.database)
            try:
                addresses = read_subscribers(self._config, table, topics)
            except AuthenticationFailed as refused:
                if self._logins is not None:
                    self._logins.record_trouble(
                        table.database, "auth-failed", str(refused), refused.login
                    )
                raise
        except DatabaseError as error:
            if cached is None:
                raise
            # The table's database is down, but we knew its subscribers a moment ago: the
            # copies for reachable subscribers should not wait for it.
            log.warning(
                "cannot read %s (%s); using the subscribers read %.0f s ago",
                table_source(table),
                error,
                now - (cached[0] - self._config.publish.cache),
            )
            return cached[1], False
        if len(self._cache) > 1000:
            self._cache.clear()  # bounded: event hierarchies are few, but never grow forever
        self._cache[key] = (now + self._config.publish.cache, addresses)
        return addresses, True

    def _refuse_while_refused(self, database: str) -> None:
        """Raise AuthenticationFailed, without logging in, while `database` refuses the login."""
        refused = None if self._logins is None else self._logins.refused_login(database)
        if refused is not None:
            raise AuthenticationFailed(
                database, f"its login is refused ({refused.last_error})", login=refused.login
            )


def read_subscribers(
    config: BridgeConfig, table: SubscriptionTableConfig, topics: Sequence[str]
) -> tuple[str, ...]:
    """`SELECT DISTINCT QueueAddress ... WHERE Topic IN (...)`, as NServiceBus does.

    On a connection of its own, never the worker's: the table may live in the forwarding
    database, whose connection holds the open source transaction. Lookups happen once per
    cache period, so opening a connection each time costs little.
    """
    database = config.databases[table.database]
    dialect = dialect_for(database.dialect)
    grammar = dialect.grammar
    address = grammar.resolve(grammar.parse(table.table), database.schema, None)
    connection = connect(database)
    try:
        connection.begin_read()
        rows = connection.query(
            dialect.sql("subscribers_many", rows=len(topics), subscriptions=address), list(topics)
        )
        connection.commit()
    finally:
        connection.rollback()
        connection.close()
    return tuple(sorted(str(row[0]) for row in rows if row[0]))
