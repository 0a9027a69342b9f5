"""Routing: from a destination header to a database and a queue address. Pure.

The header is written in the forwarding database's own address grammar (that is where the
sending endpoint lives). Routes match a glob on the destination's table name, first match
wins, unless a SQL Server catalog in the address names a configured database (see
`choose_route`); the address is then resolved and rendered for the destination database's
dialect.

Whoever can insert a row into a forwarding queue writes the header, so routing is where the
bridge decides what a sender may reach: only a database a route leads to, only the schemas and
catalogs that route allows (`resolve_for_target`), and never a table the bridge owns or reads
there (`OwnedTables`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bridge.addressing import TableAddress, folded_name
from bridge.config.catalogs import database_catalog, databases_of_catalog, same_catalog
from bridge.config.model import DatabaseConfig, RouteConfig, TransactionMode
from bridge.dialects.registry import grammar_for
from bridge.exceptions import AddressError


@dataclass(frozen=True)
class Destination:
    """Where a message goes: a configured database and a queue address in its grammar.

    `canonical` is the address rendered in the destination dialect's canonical form; it is
    the dedup ledger key (with the message id) and what `status` shows. `transaction` is how
    a message crosses into that database (`bridge.config.model.TransactionMode`). `match` is
    the glob of the route that led here (None for a proxy's destination): a hint at a table
    that exists names only tables it matches.
    """

    database: str
    address: TableAddress
    canonical: str
    transaction: TransactionMode = "ledger"
    # Not part of what the destination is: two routes to one queue lead to the same place.
    match: str | None = field(default=None, compare=False)


# Every table the bridge creates is called so, in every dialect (`bridge.dialects.base`).
BRIDGE_TABLE_PREFIX = "sfbridge_"

# Per configured database: (folded schema or "", folded table) -> what the table is,
# for the tables there that the bridge owns or reads (`bridge.storage.tables.owned_tables`).
OwnedTables = Mapping[str, Mapping[tuple[str, str], str]]


def owned_table_use(destination: Destination, owned: OwnedTables) -> str | None:
    """What the bridge uses `destination`'s table for, when it owns or reads it (so no
    message may be delivered into it); None for an endpoint's queue. Names compare folded
    (`folded_name`: case, full-width forms, trailing spaces), as loosely as any database
    compares them: a table a database could take for one of the bridge's is refused too."""
    address = destination.address
    if address.catalog is not None:
        return None  # another catalog on the server: not a configured database
    table = folded_name(address.table)
    if table.startswith(BRIDGE_TABLE_PREFIX):
        return "a table the bridge creates for itself"
    tables = owned.get(destination.database)
    if not tables:
        return None
    return tables.get((folded_name(address.schema or ""), table))


@dataclass(frozen=True)
class Unroutable:
    """No route for the message; `reason` says what to fix."""

    reason: str


class Router:
    """Routes destination headers for one forwarder. Decisions are cached.

    `proxy` is where a proxy forwarder delivers messages without a routing header (None for
    a forwarder that routes by headers only). What the destination receives is shaped by
    `bridge.forwarding.outgoing`.
    """

    def __init__(
        self,
        source: DatabaseConfig,
        routes: Sequence[RouteConfig],
        databases: Mapping[str, DatabaseConfig],
        *,
        proxy: Destination | None = None,
        default_transaction: TransactionMode = "ledger",
        owned: OwnedTables | None = None,
        address_databases: frozenset[str] | None = None,
    ) -> None:
        self._source = source
        self._owned: OwnedTables = owned or {}
        # The databases an address may be marked as written in (`route`): those whose
        # subscription table the bridge reads; None: any configured one.
        self._address_databases = address_databases
        self._default_transaction: TransactionMode = default_transaction
        self._routes = tuple(routes)
        self._databases = databases
        self._cache: dict[tuple[str, str | None], Destination | Unroutable] = {}
        self.proxy = proxy

    @property
    def source_database(self) -> str:
        return self._source.name

    def route(
        self, destination_header: str, address_database: str | None = None
    ) -> Destination | Unroutable:
        """Route one destination address.

        It is written in the forwarding database's grammar, or in `address_database`'s when
        given (a subscriber address read from that database's subscription table).
        """
        key = (destination_header, address_database)
        decision = self._cache.get(key)
        if decision is None:
            grammar_source = self._source
            if address_database is not None and address_database != self._source.name:
                if address_database not in self._databases or (
                    self._address_databases is not None
                    and address_database not in self._address_databases
                ):
                    return Unroutable(
                        f"the address {destination_header!r} is marked as written in database "
                        f"{address_database!r}, whose subscription table the bridge does not "
                        "read (only a subscriber's address read there carries that mark)"
                    )
                grammar_source = self._databases[address_database]
            decision = route_destination(
                destination_header,
                self._source,
                self._routes,
                self._databases,
                default_transaction=self._default_transaction,
                written_in=grammar_source,
                owned=self._owned,
            )
            # Bounded: a stream of distinct bogus destinations must not grow memory forever.
            if len(self._cache) < 10_000:
                self._cache[key] = decision
        return decision


@dataclass(frozen=True)
class RouteChoice:
    """How one destination address was routed, as `sfbridge route` explains it.

    `decision` is what the data path gets; `route` the index in `routes` of the route that
    matched (None when none did, or the address's catalog chose a database without one);
    `catalog` says what the address's catalog did, None when it named none.
    """

    decision: Destination | Unroutable
    route: int | None = None
    catalog: str | None = None


def route_destination(
    destination_header: str,
    source: DatabaseConfig,
    routes: Sequence[RouteConfig],
    databases: Mapping[str, DatabaseConfig],
    *,
    default_transaction: TransactionMode = "ledger",
    written_in: DatabaseConfig | None = None,
    owned: OwnedTables | None = None,
) -> Destination | Unroutable:
    """Route one destination header value; see `choose_route`."""
    return choose_route(
        destination_header,
        source,
        routes,
        databases,
        default_transaction=default_transaction,
        written_in=written_in,
        owned=owned,
    ).decision


def choose_route(
    destination_header: str,
    source: DatabaseConfig,
    routes: Sequence[RouteConfig],
    databases: Mapping[str, DatabaseConfig],
    *,
    default_transaction: TransactionMode = "ledger",
    written_in: DatabaseConfig | None = None,
    owned: OwnedTables | None = None,
) -> RouteChoice:
    """Route one destination header value from the forwarding database `source`.

    The address is read in the grammar of `written_in` (default: `source`). The first route
    whose glob matches its table wins, and its database receives the message, unless the
    address names a SQL Server catalog (see `bridge.config.catalogs`):

    - the forwarding database's own catalog (what an endpoint writes by default): the route
      decides, and the catalog is dropped;
    - the catalog of configured databases: the message goes there by the first matching
      route to one of them, and is unroutable without one (a catalog never chooses a database
      no route leads to); the catalog is dropped (the database's connection opens it);
    - any other catalog: the route decides, and only a catalog the route lists in `catalogs`
      is kept (a three-part name: that catalog on the route's database's server); any other
      is refused.

    The schema an address names must be the database's default or one the route lists in
    `schemas` (`resolve_for_target`). A table the bridge owns or reads there (`owned`, and
    every `sfbridge_*` table) is refused. The destination's transaction mode is the route's,
    else `default_transaction`.
    """
    grammar_source = written_in or source
    try:
        parsed = grammar_for(grammar_source.dialect).parse(destination_header)
    except AddressError as error:
        return RouteChoice(
            Unroutable(
                f"destination {destination_header!r} is not a valid {grammar_source.dialect} "
                f"address ({error}); fix the '$.store-and-forward.destination' header"
            )
        )
    allowed, catalog_note = _catalog_rule(parsed, source, databases)
    index, route = _first_route(parsed.table, routes, allowed)
    if route is None:
        reason = _no_route_reason(parsed.table, routes, allowed, parsed.catalog)
        return RouteChoice(Unroutable(reason), None, catalog_note)
    target = databases[route.database]
    try:
        destination = destination_of(
            parsed,
            grammar_source,
            target,
            route,
            forwarding=source,
            default_transaction=default_transaction,
        )
    except RouteRefused as refused:
        where = "" if index is None else f"routes[{index}] (match {route.match!r}) "
        return RouteChoice(
            Unroutable(
                f"destination {destination_header!r}: {where}does not allow {refused}; fix "
                "the destination header"
            ),
            index,
            catalog_note,
        )
    except AddressError as error:
        # e.g. '@' in a table bound for SQLite, or a name over PostgreSQL's length limit.
        return RouteChoice(
            Unroutable(
                f"destination {destination_header!r} cannot be a {target.dialect} queue in "
                f"database '{target.name}' ({error}); route it elsewhere or rename the queue"
            ),
            index,
            catalog_note,
        )
    use = owned_table_use(destination, owned or {})
    if use is not None:
        return RouteChoice(
            Unroutable(
                f"destination {destination_header!r} is {destination.canonical} in database "
                f"'{destination.database}', {use}: the bridge never delivers a message into "
                "its own tables; fix the destination header"
            ),
            index,
            catalog_note,
        )
    return RouteChoice(destination, index, catalog_note)


class RouteRefused(AddressError):
    """The address names a schema or catalog its route does not allow; the text says which
    and the key that would allow it."""


def destination_of(
    parsed: TableAddress,
    source: DatabaseConfig,
    target: DatabaseConfig,
    route: RouteConfig,
    *,
    forwarding: DatabaseConfig | None = None,
    default_transaction: TransactionMode = "ledger",
) -> Destination:
    """Where `route` takes the address `parsed` (read in `source`'s grammar): the queue in
    `target` (`resolve_for_target`), rendered canonically, with the route's transaction mode
    or `default_transaction`. Raises RouteRefused for a schema or catalog the route does not
    allow, AddressError for a name `target` cannot hold."""
    address = resolve_for_target(parsed, source, target, route, forwarding=forwarding)
    return Destination(
        database=target.name,
        address=address,
        canonical=grammar_for(target.dialect).render(address),
        transaction=route.transaction or default_transaction,
        match=route.match,
    )


def _catalog_rule(
    parsed: TableAddress, source: DatabaseConfig, databases: Mapping[str, DatabaseConfig]
) -> tuple[tuple[str, ...] | None, str | None]:
    """(the databases the address's catalog allows, None for any; what the catalog did)."""
    catalog = parsed.catalog
    if catalog is None:
        return None, None
    if same_catalog(catalog, database_catalog(source)):
        return None, (
            f"[{catalog}] is the forwarding database '{source.name}' itself, which endpoints "
            "write by default: the route decides"
        )
    named = databases_of_catalog(catalog, databases)
    if not named:
        return None, (
            f"[{catalog}] is no configured database's: the route decides, and only a route "
            "that lists it in `catalogs` reaches the queue in that catalog on its server"
        )
    names = tuple(database.name for database in named)
    listed = ", ".join(f"'{name}'" for name in names)
    return names, f"[{catalog}] is database {listed}: a route to it decides"


def _first_route(
    table: str, routes: Sequence[RouteConfig], allowed: tuple[str, ...] | None
) -> tuple[int | None, RouteConfig | None]:
    for index, route in enumerate(routes):
        if (allowed is None or route.database in allowed) and route.matches(table):
            return index, route
    return None, None


def first_matching_route(table: str, routes: Sequence[RouteConfig]) -> RouteConfig | None:
    """The first route whose glob matches the table name (case-sensitive, like NServiceBus)."""
    return _first_route(table, routes, None)[1]


def resolve_for_target(
    parsed: TableAddress,
    source: DatabaseConfig,
    target: DatabaseConfig,
    route: RouteConfig,
    *,
    forwarding: DatabaseConfig | None = None,
) -> TableAddress:
    """Fill in schema and catalog for the destination database, within what `route` allows.

    Schema: the route's override, then the address's own schema (only when source and target
    speak the same dialect: a PostgreSQL schema means nothing to SQL Server), then the target
    database's default schema, then the dialect default. The address's own schema must be that
    default or one of the route's `schemas`. The catalog travels only between databases of the
    same dialect too, and not when it is the target's own or the forwarding database's
    (`forwarding`, default `source`): those are the connection's database; any other must be
    one of the route's `catalogs`.

    Raises RouteRefused for a schema or catalog the route does not allow, AddressError for a
    name the target cannot hold.
    """
    same_dialect = source.dialect == target.dialect
    catalog = parsed.catalog if same_dialect else None
    if same_catalog(catalog, database_catalog(target)) or same_catalog(
        catalog, database_catalog(forwarding or source)
    ):
        catalog = None
    if catalog is not None and not any(same_catalog(catalog, c) for c in route.catalogs):
        raise RouteRefused(
            f"catalog [{catalog}] (another database on the server of '{target.name}'); list it "
            "in that route's `catalogs` to deliver there"
        )
    grammar = grammar_for(target.dialect)
    schema = route.schema
    if schema is None and same_dialect and parsed.schema is not None:
        default = grammar.resolve(TableAddress(parsed.table), target.schema, None).schema

        def fold(name: str | None) -> str | None:
            return name.casefold() if name is not None and grammar.names_ignore_case else name

        allowed = {fold(default), *(fold(name) for name in route.schemas)}
        if fold(parsed.schema) not in allowed:
            raise RouteRefused(
                f"schema {parsed.schema!r} (only {_schemas_allowed(default, route)}); list "
                "it in that route's `schemas` to deliver there"
            )
        schema = parsed.schema
    carried = TableAddress(table=parsed.table, schema=schema, catalog=catalog)
    return grammar.resolve(carried, target.schema, None)


def _schemas_allowed(default: str | None, route: RouteConfig) -> str:
    """The schemas an address may name on `route`, for a refusal: the database's default and
    the route's `schemas`."""
    names = [name for name in (default, *route.schemas) if name]
    return ", ".join(repr(name) for name in dict.fromkeys(names)) or "none"


def _no_route_reason(
    table: str,
    routes: Sequence[RouteConfig],
    allowed: tuple[str, ...] | None = None,
    catalog: str | None = None,
) -> str:
    if allowed is not None and len(allowed) == 1:
        return (
            f"catalog [{catalog}] names database '{allowed[0]}', and no route for table "
            f"{table!r} leads to it. Add a route for it to that database, or fix the "
            "destination header."
        )
    if allowed is not None:
        listed = ", ".join(f"'{name}'" for name in allowed)
        return (
            f"catalog [{catalog}] names databases {listed} (databases of one name on several "
            f"servers), and no route for table {table!r} leads to one of them. Add a route "
            "for it to the database meant."
        )
    patterns = [route.match for route in routes]
    hint = ""
    close = difflib.get_close_matches(table, patterns, n=1, cutoff=0.6)
    if close:
        hint = f" (did you mean a destination matching {close[0]!r}?)"
    listed = ", ".join(repr(p) for p in patterns) or "none"
    return (
        f"no route matches destination table {table!r}{hint}; routes: {listed}. "
        "Add a route for it in the config, or fix the destination header."
    )


def nearest_table(table: str, existing: Sequence[str]) -> str | None:
    """The existing table name closest to `table`, for 'did you mean' hints."""
    close = difflib.get_close_matches(table, list(existing), n=1, cutoff=0.6)
    if close:
        return close[0]
    lowered = {name.lower(): name for name in existing}
    return lowered.get(table.lower())
