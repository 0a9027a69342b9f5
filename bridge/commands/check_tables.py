"""What `check` finds of single tables: whether a table of the bridge is there (and, when
it is missing, who creates it), whether a queue table has the transport's shape and indexes,
and whether the bridge's login may write a destination queue. `bridge.commands.check` runs
them over the whole configuration."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from bridge.addressing import TableAddress
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import Connection
from bridge.exceptions import AddressError, DatabaseError
from bridge.routing import Destination, destination_of, first_matching_route
from bridge.storage.grants import missing_create_right, missing_insert_right


@dataclass(frozen=True)
class Finding:
    """One thing `check` found; a `warning` is ok (it does not fail the check) but worth a
    look."""

    ok: bool
    subject: str
    detail: str
    warning: bool = False
    missing_table: bool = False  # a table the bridge owns (and `install` creates) is missing
    # Missing, and the bridge's login may not create it: a DBA must (or grant the right).
    needs_dba: bool = False

    def __str__(self) -> str:
        label = "PROBLEM" if not self.ok else "WARNING" if self.warning else "ok     "
        return f"{label}  {self.subject}: {self.detail}"


# What a missing table of a forwarding database means until it is there.
CANNOT_FORWARD = "the daemon cannot forward from this database"


def table_columns(
    connection: Connection, dialect: Dialect, address: TableAddress
) -> dict[str, str]:
    """The table's columns (lower-cased name -> type); none when it does not exist, or when
    the login has no right on it (PostgreSQL shows a login only the columns it may use)."""
    # The address lets SQL Server read the catalog views of the table's own catalog.
    rows = connection.query(
        dialect.sql("table_columns", queue=address), (address.schema, address.table)
    )
    connection.commit()
    return {str(row[0]): str(row[1]) for row in rows}


def check_exists(
    config: BridgeConfig,
    connection: Connection,
    dialect: Dialect,
    address: TableAddress,
    subject: str,
    meanwhile: str = CANNOT_FORWARD,
) -> Iterator[Finding]:
    rendered = dialect.grammar.render(address)
    if table_columns(connection, dialect, address):
        yield Finding(True, subject, f"{rendered} exists")
        return
    yield missing_owned_table(config, connection, dialect, address, subject, meanwhile)


def missing_owned_table(
    config: BridgeConfig,
    connection: Connection,
    dialect: Dialect,
    address: TableAddress,
    subject: str,
    meanwhile: str = CANNOT_FORWARD,
) -> Finding:
    """A table the bridge owns is missing: fine when the daemon will create it, else say who
    must."""
    rendered = dialect.grammar.render(address)
    if not config.install.at_runtime:
        return Finding(
            False,
            subject,
            f"{rendered} is missing and install.at_runtime is false: run 'sfbridge install' "
            "(or have a DBA run 'sfbridge install --print-sql')",
            missing_table=True,
        )
    try:
        # What the daemon and `install` would run: the schema first where it is missing.
        lacking = missing_create_right(connection, dialect, address.schema)
    except DatabaseError as error:
        connection.rollback()
        return Finding(
            False,
            subject,
            f"{rendered} is missing ({error.detail}); run 'sfbridge install'",
            missing_table=True,
        )
    if lacking is not None:
        return Finding(
            False,
            subject,
            f"{rendered} is missing and {lacking.advice()}; until then {meanwhile}",
            missing_table=True,
            needs_dba=True,
        )
    return Finding(
        True,
        subject,
        f"{rendered} is missing; the daemon creates it when it first needs it "
        "(or run 'sfbridge install' now)",
        missing_table=True,
    )


def check_queue(
    config: BridgeConfig,
    connection: Connection,
    dialect: Dialect,
    address: TableAddress,
    subject: str,
) -> Iterator[Finding]:
    """The table exists with the queue's columns and indexes."""
    columns = table_columns(connection, dialect, address)
    yield from check_queue_shape(config, connection, dialect, address, subject, columns)


def check_queue_shape(
    config: BridgeConfig,
    connection: Connection,
    dialect: Dialect,
    address: TableAddress,
    subject: str,
    columns: dict[str, str],
) -> Iterator[Finding]:
    """`check_queue` with the table's `columns` read already (`table_columns`)."""
    rendered = dialect.grammar.render(address)
    if not columns:
        yield missing_owned_table(config, connection, dialect, address, subject)
        return
    missing = sorted(dialect.queue_columns - set(columns))
    if missing:
        yield Finding(
            False,
            subject,
            f"{rendered} is not an NServiceBus queue table: missing column(s) {', '.join(missing)}",
        )
        return
    indexes = connection.query(
        dialect.sql("table_indexes", queue=address), (address.schema, address.table)
    )
    connection.commit()
    definitions = [str(row[1] or "").lower() for row in indexes]
    for column in dialect.queue_indexed_columns:
        if not any(f"({column}" in d.replace('"', "") for d in definitions):
            yield Finding(
                False,
                subject,
                f"{rendered} has no index on {column}; receiving will scan the table "
                "(re-create it with the transport's DDL, or 'sfbridge install --print-sql')",
            )
            return
    problems = dialect_problems(connection, dialect, address, columns, definitions)
    for problem in problems:
        yield Finding(False, subject, f"{rendered}: {problem}")
    if not problems:
        yield Finding(True, subject, f"{rendered} has the NServiceBus queue shape")


def check_routed_queues(
    config: BridgeConfig, connections: Connections, reachable: set[str]
) -> Iterator[Finding]:
    """The queues routes name outright (a `match` without glob characters, and no earlier
    route matching it first), in the route's database and schema. Queues behind a glob are
    known only from the messages, and are checked when one comes."""
    for route in config.routes:
        if any(character in route.match for character in "*?["):
            continue
        if first_matching_route(route.match, config.routes) is not route:
            continue
        if route.database not in reachable:
            continue
        target = config.databases[route.database]
        subject = f"route '{route.match}' to database '{route.database}'"
        try:
            destination = destination_of(
                TableAddress(route.match),
                target,
                target,
                route,
                default_transaction=config.delivery.transaction,
            )
        except AddressError as error:
            yield Finding(False, subject, f"{route.match!r} cannot be a queue there ({error})")
            continue
        yield from check_destination(config, connections, destination, subject, "their")


def check_destination(
    config: BridgeConfig,
    connections: Connections,
    destination: Destination,
    subject: str,
    whose: str,
) -> Iterator[Finding]:
    """A destination queue exists with the queue shape, and the bridge's login may write
    rows into it (else the GRANTs a DBA must run)."""
    connection = connections.get(destination.database)
    dialect = dialect_for(config.databases[destination.database].dialect)
    # A login with no right at all on a table sees none of its columns (PostgreSQL's
    # information_schema), as if it did not exist; the rights are asked of the table itself.
    columns = table_columns(connection, dialect, destination.address)
    readable = bool(columns)
    lacking = missing_insert_right(connection, dialect, destination.address)
    connection.rollback()
    if not readable and lacking is None:
        yield Finding(
            False,
            subject,
            f"{destination.canonical} does not exist: the endpoint creates it when it is "
            f"installed; until then {whose} messages wait in retry storage",
        )
        return
    if readable:
        yield from check_queue_shape(
            config, connection, dialect, destination.address, subject, columns
        )
    if lacking is not None:
        grant = f": have a DBA run {lacking.grant}" if lacking.grant else ""
        unread = "" if readable else " (the login cannot see its columns: its shape is unchecked)"
        yield Finding(
            False,
            subject,
            f"the bridge's login may not {lacking.what}{grant}; until then {whose} messages "
            f"wait in retry storage{unread}",
        )


def dialect_problems(
    connection: Connection,
    dialect: Dialect,
    address: TableAddress,
    columns: dict[str, str],
    definitions: list[str],
) -> list[str]:
    """What the dialect's own inspection finds (SQL Server: what the transport warns about)."""
    if dialect.inspect_queue_table is None:
        return []
    try:
        return dialect.inspect_queue_table(connection, address, columns, definitions)
    except DatabaseError as error:
        connection.rollback()
        return [f"could not be inspected further: {error.detail}"]
