"""The outgoing message: what a destination queue receives, shaped and serialized here only.

A message crossing to a destination keeps every header the sender wrote but the routing
headers (`bridge.headers.ROUTING_HEADERS`), which are the bridge's business; its reply
addresses are rewritten for the database it enters (below); and the result is serialized
once per message, or once per destination database for the copies of a published event
(`bridge.forwarding.fan_out`). Routing (`bridge.routing`) says where a message goes; this
module says what arrives there. What the bridge keeps for itself (retry storage, the error
queue) keeps the headers as they came, routing headers included, so that a retry goes
through the bridge again.

Replies need the way back. An endpoint puts its own input queue in `NServiceBus.ReplyToAddress`,
written in *its* database's grammar; the replying endpoint sends to that address in *its own*
database. That works untouched when the replying side has a proxy with the same name and
schema. Where it does not (SQL Server addresses carry the sender's catalog since transport
7.0, schemas differ, the proxy has another name) the address is rewritten, on the copy that
crosses, to the proxy that leads back: the proxy in the receiving database whose destination is
the address's queue in the sending database. That is the address map the Messaging Bridge
keeps per endpoint (see `nsb-wire.md` §8.3 in the reference folder), built here from the
forwarders' config instead. An address no proxy leads back to is left as it is. The same
goes for the other headers that name the sender's queue for an answer: the v2-era callback
queue and a message-driven Subscribe's subscriber address.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bridge.addressing import TableAddress
from bridge.config.catalogs import database_catalog, same_catalog
from bridge.config.model import BridgeConfig, DatabaseConfig
from bridge.dialects.registry import grammar_for
from bridge.exceptions import AddressError
from bridge.forwarding.proxies import proxy_destination
from bridge.headers import REPLY_TO_ADDRESS_HEADER, ROUTING_HEADERS, Headers, serialize_headers
from bridge.messages import Forward
from bridge.routing import Destination

# Transport 6.x and older replaced ReplyToAddress with it on receive (v2-era callbacks).
CALLBACK_QUEUE_HEADER = "NServiceBus.SqlServer.CallbackQueue"
# A message-driven Subscribe names the subscriber's queue here (Core's
# Headers.SubscriberTransportAddress); the publisher sends its events there.
SUBSCRIBER_ADDRESS_HEADER = "NServiceBus.SubscriberAddress"
_REPLY_HEADERS = (REPLY_TO_ADDRESS_HEADER, CALLBACK_QUEUE_HEADER, SUBSCRIBER_ADDRESS_HEADER)


class Outgoing:
    """Shapes and serializes what destinations receive from one forwarding database.

    `replies` rewrites reply addresses for the database a message enters; None leaves them
    as they are (a config without proxies has nothing to rewrite them to).
    """

    def __init__(self, source_database: str, replies: ReplyAddresses | None = None) -> None:
        self._source_database = source_database
        self._replies = replies

    @classmethod
    def from_config(cls, config: BridgeConfig, database: str) -> Outgoing:
        """For messages forwarded from `database`, with the reply map of every proxy."""
        return cls(database, ReplyAddresses.from_config(config))

    def forward(self, headers: Headers, destination: Destination, message_id: str) -> Forward:
        """The decision to deliver a message with `headers` to `destination`, its outgoing
        headers serialized; deduplicated there by `message_id`."""
        return Forward(  # by position: once per message
            headers, destination, self.text(headers, destination.database), message_id
        )

    def text(self, headers: Headers, database: str) -> str:
        """The Headers column `database` receives for a message with `headers`."""
        return serialize_headers(self.headers(headers, database))

    def headers(self, headers: Headers, database: str) -> Headers:
        """What `database` receives: every header but the routing headers, with reply
        addresses rewritten for it."""
        outgoing = without_routing_headers(headers)
        if self._replies is None:
            return outgoing
        return self._replies.rewrite(outgoing, self._source_database, database)


def without_routing_headers(headers: Mapping[str, str | None]) -> Headers:
    """The headers without the routing headers."""
    outgoing = dict(headers)  # a copy in C, then three removals: cheaper than a filter per key
    for key in ROUTING_HEADERS:
        outgoing.pop(key, None)
    return outgoing


@dataclass(frozen=True)
class _WayBack:
    """A proxy seen from the reply side: in `database`, `queue` leads to `destination`."""

    database: str
    queue: TableAddress
    canonical: str
    destination: Destination


class ReplyAddresses:
    """Rewrites reply addresses on messages crossing from one database to another."""

    def __init__(self, databases: Mapping[str, DatabaseConfig], ways_back: list[_WayBack]) -> None:
        self._databases = databases
        # (destination database, destination table) -> the proxies leading there.
        self._by_target: dict[tuple[str, str], list[_WayBack]] = {}
        for way in ways_back:
            key = (way.destination.database, way.destination.address.table)
            self._by_target.setdefault(key, []).append(way)

    @classmethod
    def from_config(cls, config: BridgeConfig) -> ReplyAddresses:
        ways: list[_WayBack] = []
        for forwarder in config.forwarders:
            destination = proxy_destination(config, forwarder)
            if destination is None:
                continue
            database = config.databases[forwarder.database]
            grammar = grammar_for(database.dialect)
            queue = grammar.resolve(grammar.parse(forwarder.queue), database.schema, None)
            queue = TableAddress(queue.table, queue.schema, None)
            ways.append(_WayBack(database.name, queue, grammar.render(queue), destination))
        return cls(config.databases, ways)

    def rewrite(self, headers: Headers, from_database: str, to_database: str) -> Headers:
        """`headers` with each reply address that a proxy in `to_database` leads back to
        rewritten to that proxy; the same object when nothing changes."""
        if from_database == to_database or not self._by_target:
            return headers
        changed: Headers | None = None
        for name in _REPLY_HEADERS:
            value = headers.get(name)
            if not value:
                continue
            translated = self.translate(value, from_database, to_database)
            if translated is not None:
                changed = dict(headers) if changed is None else changed
                changed[name] = translated
        return headers if changed is None else changed

    def translate(self, address: str, from_database: str, to_database: str) -> str | None:
        """The address, in `to_database`, of the proxy leading back to `address` (a queue of
        `from_database`, in its grammar); None when there is none or `address` already names
        it there."""
        source = self._databases.get(from_database)
        target = self._databases.get(to_database)
        if source is None or target is None:
            return None
        try:
            grammar = grammar_for(source.dialect)
            queue = grammar.resolve(grammar.parse(address), source.schema, None)
        except AddressError:
            return None
        for way in self._by_target.get((from_database, queue.table), ()):
            if way.database == to_database and _same_queue(way.destination.address, queue, source):
                return None if _already_names(address, way, target) else way.canonical
        return None


def _same_queue(configured: TableAddress, seen: TableAddress, database: DatabaseConfig) -> bool:
    """Whether a reply address (`seen`, resolved in `database`) names the configured queue.

    Table and schema compare exactly, as the transports compare addresses. A catalog in the
    address (SQL Server, always since transport 7.0) must be the database's own
    (`bridge.config.catalogs`).
    """
    if (configured.table, configured.schema) != (seen.table, seen.schema):
        return False
    if seen.catalog is None:
        return True
    expected = configured.catalog or database_catalog(database)
    return expected is None or same_catalog(expected, seen.catalog)


def _already_names(address: str, way: _WayBack, target: DatabaseConfig) -> bool:
    """Whether `address`, read in the receiving database, already is the proxy's queue."""
    try:
        grammar = grammar_for(target.dialect)
        there = grammar.resolve(grammar.parse(address), target.schema, None)
    except AddressError:
        return False
    if there.catalog is not None and not same_catalog(there.catalog, database_catalog(target)):
        return False
    return (there.table, there.schema) == (way.queue.table, way.queue.schema)
