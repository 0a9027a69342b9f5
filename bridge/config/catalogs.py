"""SQL Server catalogs: which configured database the catalog of an address names. Pure.

An NServiceBus SQL Server endpoint (transport 7.0 and later) writes every address it puts on
the wire with a catalog, `table@[schema]@[catalog]`, and by default that catalog is its own
database's name. A configured database's catalog is its `catalog` key, else the database its
connection string opens (`Database=` / `Initial Catalog=`); only dialects whose addresses name
catalogs have one (`Dialect.has_catalogs`). Routing (`bridge.routing`), the reply addresses of
proxies (`bridge.forwarding.proxies`) and validation ask here. Names compare without case, as SQL
Server compares database names under its default collations.

It lives in the config package because validation needs it, and the data path's modules
import the config package.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from bridge.config.environment import UNSET_MARK, Unresolved
from bridge.config.model import DatabaseConfig
from bridge.dialects.registry import dialect_for

__all__ = ["database_catalog", "databases_of_catalog", "partial_catalog", "same_catalog"]


# Asked per message whose reply addresses cross databases: the answer is kept per database.
@lru_cache(maxsize=256)
def database_catalog(database: DatabaseConfig) -> str | None:
    """The catalog addresses name `database` by; None where its dialect has no catalogs or
    neither its `catalog` nor its connection string says (validation refuses the latter).
    Raises UnsetVariable when only the unset environment variables of its connection string
    could say."""
    reader = dialect_for(database.dialect).connection_catalog
    if reader is None:
        return None
    if database.catalog:
        return database.catalog
    database.require_environment(
        "cannot read its catalog from the connection string (or give it `catalog:`)"
    )
    return reader(database.connection) if database.connection else None


def partial_catalog(dialect: str, unresolved: Unresolved) -> str | None:
    """The catalog an `Unresolved` connection string opens, where it can be read without its
    unset variables; None otherwise, and where the dialect has no catalogs."""
    reader = dialect_for(dialect).connection_catalog
    if reader is None:
        return None
    catalog = reader(unresolved.partial)
    return None if catalog is None or UNSET_MARK in catalog else catalog


def same_catalog(first: str | None, second: str | None) -> bool:
    """Whether two catalog names name the same database (both given, case aside)."""
    return first is not None and second is not None and first.lower() == second.lower()


def databases_of_catalog(
    catalog: str, databases: Mapping[str, DatabaseConfig]
) -> tuple[DatabaseConfig, ...]:
    """The configured databases that `catalog` names, in config order: one as a rule, several
    when databases of one name on several servers are configured."""
    return tuple(
        database
        for database in databases.values()
        if same_catalog(catalog, database_catalog(database))
    )
