"""Cross-key checks about SQL Server catalogs, and the databases as addressing sees them.

A database whose addresses name catalogs must know its own (its `catalog` key, or the
database its connection string opens), and the two must agree; a proxy's `destination.queue`
must not name another configured database's catalog; and a subscriber address is routed
without a route when its catalog chooses the database (see `bridge.routing.choose_route`).
"""

from __future__ import annotations

from collections.abc import Mapping

from bridge.addressing import TableAddress
from bridge.config.catalogs import (
    database_catalog,
    databases_of_catalog,
    partial_catalog,
    same_catalog,
)
from bridge.config.environment import Unresolved
from bridge.config.messages import join_path
from bridge.config.model import DatabaseConfig, FixedDestination
from bridge.config.problems import ProblemLog
from bridge.config.walker import Document, Entry
from bridge.dialects.registry import dialects, grammar_for
from bridge.exceptions import AddressError

__all__ = ["check_catalogs", "database_config", "database_configs", "where_routes_decide"]


def database_config(document: Document, name: object) -> DatabaseConfig | None:
    """What addressing needs of a database (its dialect and schema); None when unknown."""
    entry = document.databases.get(name) if isinstance(name, str) else None
    if entry is None or entry.values.get("dialect") is None:
        return None
    dialect = entry.values["dialect"]
    connection = entry.values.get("connection")
    catalog = entry.values.get("catalog")
    if isinstance(connection, Unresolved):
        # Checked when the variables are there (`run` needs them all); validation gets the
        # catalog the connection string names without them, else none (checks skipped).
        return DatabaseConfig(
            name=str(name),
            dialect=dialect,
            schema=entry.values.get("schema"),
            catalog=catalog or partial_catalog(dialect, connection),
        )
    return DatabaseConfig(
        name=str(name),
        dialect=dialect,
        connection=connection,
        schema=entry.values.get("schema"),
        catalog=catalog,
    )


def database_configs(document: Document) -> dict[str, DatabaseConfig]:
    """Every database whose dialect is known, as addressing needs it."""
    found = {name: database_config(document, name) for name in document.databases}
    return {name: database for name, database in found.items() if database is not None}


def check_catalogs(document: Document, log: ProblemLog) -> None:
    """A database whose addresses name catalogs (SQL Server) knows its own: from `catalog`
    or its connection string, and the two agree; a proxy's `destination.queue` names no
    catalog of another configured database."""
    databases = database_configs(document)
    for name, database in databases.items():
        reader = dialects()[database.dialect].connection_catalog
        if reader is None or database.connection is None:
            continue
        path = join_path(document.databases[name].path, "catalog")
        opened = reader(database.connection)
        if database.catalog is None and opened is None:
            log.error(
                path,
                "required when 'connection' names no database (Database= or Initial "
                "Catalog=): the database's name on its server, which NServiceBus endpoints "
                "write in every address (table@[schema]@[catalog]) and the bridge reads to "
                "route them and writes in NServiceBus.FailedQ",
            )
        elif opened is not None and not same_catalog(database.catalog or opened, opened):
            log.error(
                path,
                f"{database.catalog!r} is not the database the connection opens ({opened!r}), "
                "which is where the bridge works: correct it, or leave it out",
            )
    for entry in document.forwarders:
        fixed = None if entry is None else entry.values.get("destination")
        if entry is None or not isinstance(fixed, FixedDestination) or fixed.queue is None:
            continue
        _check_destination_catalog(log, entry, fixed, databases)


def _check_destination_catalog(
    log: ProblemLog, entry: Entry, fixed: FixedDestination, databases: dict[str, DatabaseConfig]
) -> None:
    target = databases.get(fixed.database)
    if target is None or fixed.queue is None:
        return
    try:
        catalog = grammar_for(target.dialect).parse(fixed.queue).catalog
    except AddressError:
        return  # reported by check_proxies
    if catalog is None or same_catalog(catalog, database_catalog(target)):
        return
    named = [d.name for d in databases_of_catalog(catalog, databases)]
    if named:
        log.error(
            join_path(join_path(entry.path, "destination"), "queue"),
            f"names catalog [{catalog}], which is database {named[0]!r}, but the proxy "
            f"delivers into database {target.name!r}: set 'destination.database: "
            f"{named[0]}' and leave the catalog out",
        )


def where_routes_decide(
    address: TableAddress,
    dialect: str,
    databases: Mapping[str, DatabaseConfig],
    forwarding: list[DatabaseConfig],
) -> str | None:
    """None when the address's catalog chooses its database from every forwarding database of
    `dialect` (see `bridge.routing.choose_route`); else what to add to a no-route message."""
    if address.catalog is None or not databases_of_catalog(address.catalog, databases):
        return ""
    own = [
        f.name
        for f in forwarding
        if f.dialect == dialect and same_catalog(address.catalog, database_catalog(f))
    ]
    if not own:
        return None
    return (
        f"; [{address.catalog}] is forwarding database {own[0]!r} itself, where routes decide "
        "(the catalog an endpoint writes by default)"
    )
