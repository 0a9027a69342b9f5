"""What `check` finds of the bridge's login in each database: rights it lacks on the tables it
works with (with the GRANTs), and what it has beyond its needs: superuser and other powers,
objects it owns that are not the bridge's, rights on endpoints' queues that let it change or
lose their messages (warnings, with the REVOKE). The needs are `install --print-grants`'s
(`bridge.commands.least_privilege`)."""

from __future__ import annotations

from collections.abc import Iterator

from bridge.commands.check_tables import Finding
from bridge.commands.least_privilege import (
    NOT_TOO_MUCH_ON_DESTINATIONS,
    DatabaseNeeds,
    needs_of,
)
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import Connection
from bridge.exceptions import DatabaseError
from bridge.storage.grants import (
    lacking_table_rights,
    login_powers,
    owned_objects,
    table_rights,
)

# How many names a finding lists before "and N more".
LISTED = 5
PRINT_GRANTS = "'sfbridge install --print-grants' prints what a dedicated login needs"


def check_logins(
    config: BridgeConfig, connections: Connections, reachable: set[str]
) -> Iterator[Finding]:
    """The findings of every reachable database whose dialect has logins."""
    for name, needs in needs_of(config).items():
        dialect = dialect_for(config.databases[name].dialect)
        if name not in reachable or "login_powers" not in dialect.statements:
            continue
        connection = connections.get(name)
        try:
            yield from _check_login(connection, dialect, needs)
        except DatabaseError as error:
            connection.rollback()
            yield Finding(True, f"database '{name}' login", f"rights unknown: {error.detail}", True)


def _check_login(
    connection: Connection, dialect: Dialect, needs: DatabaseNeeds
) -> Iterator[Finding]:
    powers = login_powers(connection, dialect)
    assert powers is not None
    subject = f"database '{needs.name}' login '{powers.login}'"
    if powers.severe:
        yield Finding(
            True,
            subject,
            f"is {' and '.join(powers.powers[:2])}: it may do anything in this database, and "
            f"a mistake or a hostile message could too; {PRINT_GRANTS}",
            warning=True,
        )
        return  # it has every right: nothing it lacks, and the rest is said
    if powers.powers:
        yield Finding(
            True,
            subject,
            f"has {', '.join(powers.powers)}, which the bridge never uses; {PRINT_GRANTS}",
            warning=True,
        )
    for need in needs.tables:
        if not need.own and "INSERT" in need.rights:
            continue  # destination queues: `check_destination` names the GRANTs
        lacking = lacking_table_rights(connection, dialect, need.table, need.rights)
        if lacking is not None:
            yield Finding(
                False,
                subject,
                f"lacks {lacking.what} ({need.what}): have a DBA run {lacking.grant}",
            )
    yield from _owned_beyond_needs(connection, dialect, needs, subject)
    yield from _rights_beyond_needs(connection, dialect, needs, subject)


def _owned_beyond_needs(
    connection: Connection, dialect: Dialect, needs: DatabaseNeeds, subject: str
) -> Iterator[Finding]:
    """The database, schemas and tables the login owns that are not the bridge's."""
    own_tables = {
        (need.table.schema or "", need.table.table.casefold()) for need in needs.tables if need.own
    }
    own_schemas = {schema or "" for schema in needs.own_schemas}
    quote = dialect.grammar.quote_identifier
    names: list[str] = []
    for owned in owned_objects(connection, dialect):
        if owned.kind == "database":
            names.append(f"the database {quote(owned.name)}")
        elif owned.kind == "schema" and owned.name not in own_schemas:
            names.append(f"schema {quote(owned.name)}")
        elif owned.kind == "table" and (owned.schema or "", owned.name.casefold()) not in (
            own_tables
        ):
            names.append(f"table {quote(owned.schema or '')}.{quote(owned.name)}")
    if names:
        more = f" and {len(names) - LISTED} more" if len(names) > LISTED else ""
        yield Finding(
            True,
            subject,
            f"owns {', '.join(names[:LISTED])}{more}, which are not the bridge's: an owner "
            "may drop or alter them and grant itself any right there; give them to their "
            f"owner (ALTER ... OWNER TO ...); {PRINT_GRANTS}",
            warning=True,
        )


def _rights_beyond_needs(
    connection: Connection, dialect: Dialect, needs: DatabaseNeeds, subject: str
) -> Iterator[Finding]:
    """Rights on the endpoints' queues beyond INSERT (and SELECT, which COPY uses)."""
    for need in needs.tables:
        if need.own or "INSERT" not in need.rights:
            continue
        held = table_rights(connection, dialect, need.table)
        extra = sorted((held or frozenset()) - NOT_TOO_MUCH_ON_DESTINATIONS)
        if not extra:
            continue
        table = dialect.grammar.qualified_name(need.table)
        revoke = dialect.grants.get("revoke", "")
        login = subject.split("login ", 1)[1].strip("'")
        statement = revoke.format(
            rights=", ".join(extra), table=table, login=dialect.grammar.quote_identifier(login)
        )
        yield Finding(
            True,
            subject,
            f"may {', '.join(extra)} on {table} ({need.what}), which the bridge never does: "
            f"a mistake could lose the endpoint's messages; {statement}; (if it has them "
            "through a role or PUBLIC, revoke them there)",
            warning=True,
        )
