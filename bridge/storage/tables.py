"""The tables a forwarder works with, and creating the tables the bridge owns.

The bridge owns, in each forwarding database, the forwarding queue (its input queue, as an
endpoint owns its own), the error queue, retry storage, counters, event types, destination and
forwarder states, the daemons working on it, the audit log of operator commands, and where the
dialect keeps them the transaction records of `bridge.forwarding.transactions`; in each
destination database reached with `transaction: ledger`, the dedup ledger (see
`bridge.storage.ledger`). `sfbridge install` creates them all up front. The daemon creates one
it finds missing while it works (unless `install.at_runtime` is false), so a database that is
dropped and recreated heals.
Destination queues are never created by the bridge: they belong to the receiving endpoints.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from bridge.addressing import TableAddress, folded_name
from bridge.config.catalogs import database_catalog
from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.dialects import Dialect, dialect_for
from bridge.dialects.base import (
    ARCHIVE_TABLE,
    AUDIT_TABLE,
    COUNTERS_TABLE,
    DAEMONS_TABLE,
    DESTINATION_STATES_TABLE,
    EVENT_TYPES_TABLE,
    FORWARDER_STATES_TABLE,
    PAUSES_TABLE,
    RETRY_TABLE,
    TRANSACTIONS_TABLE,
)
from bridge.drivers import Connection
from bridge.exceptions import (
    AlreadyExists,
    BridgeTableMissing,
    DatabaseError,
    DuplicateKey,
    PermissionDenied,
    TableNotFound,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForwarderTables:
    """The resolved addresses a forwarder works with, all in its own database."""

    queue: TableAddress
    error_queue: TableAddress
    retry: TableAddress
    counters: TableAddress
    event_types: TableAddress
    destination_states: TableAddress
    forwarder_states: TableAddress
    daemons: TableAddress
    pauses: TableAddress
    queue_canonical: str
    # The queue as `NServiceBus.FailedQ` names it: with its catalog, where addresses have
    # catalogs, as NServiceBus writes it (`table@[schema]@[catalog]`).
    failed_queue: str
    # Two-phase decisions and at-least-once records (`bridge.forwarding.transactions`), where the
    # dialect keeps them.
    transactions: TableAddress
    # Operator commands recorded (`bridge.storage.audit`).
    audit: TableAddress
    # Failed messages archived by an operator (`bridge.storage.archive`).
    archive: TableAddress


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
        destination_states=dialect.bridge_table(DESTINATION_STATES_TABLE, database.schema),
        forwarder_states=dialect.bridge_table(FORWARDER_STATES_TABLE, database.schema),
        daemons=dialect.bridge_table(DAEMONS_TABLE, database.schema),
        pauses=dialect.bridge_table(PAUSES_TABLE, database.schema),
        queue_canonical=grammar.render(queue),
        failed_queue=grammar.render(
            TableAddress(queue.table, queue.schema, queue.catalog or database_catalog(database))
        ),
        transactions=dialect.bridge_table(TRANSACTIONS_TABLE, database.schema),
        audit=dialect.bridge_table(AUDIT_TABLE, database.schema),
        archive=dialect.bridge_table(ARCHIVE_TABLE, database.schema),
    )


def bridge_queue_names(config: BridgeConfig, database: str) -> frozenset[str]:
    """The casefolded table names of the queues the bridge owns in `database`: every
    forwarder's queue there (proxy queues too) and its error queue."""
    names: set[str] = set()
    for forwarder in config.forwarders:
        if forwarder.database == database:
            tables = forwarder_tables(config, forwarder)
            names.update((tables.queue.table.casefold(), tables.error_queue.table.casefold()))
    return frozenset(names)


def owned_tables(config: BridgeConfig) -> dict[str, dict[tuple[str, str], str]]:
    """Per configured database, the tables there that the bridge owns or reads and that no
    message may therefore be delivered into (`bridge.routing.OwnedTables`): every forwarder's
    queue (a proxy queue among them) and error queue, and the subscription tables it reads.
    Its `sfbridge_*` tables are refused by name wherever they are.

    Worked out once per configuration and shared (callers only read it): a daemon builds a
    router per forwarder in every worker, and with 500 forwarders each build took 25-70 ms
    (every forwarder's tables resolved again), a first batch's pickup with it."""
    global _last_owned
    last = _last_owned
    if last is not None and last[0] is config:
        return last[1]
    owned = _owned_tables(config)
    _last_owned = (config, owned)  # one assignment: safe between threads
    return owned


# The last configuration's owned tables (a reload makes a new configuration object).
_last_owned: tuple[BridgeConfig, dict[str, dict[tuple[str, str], str]]] | None = None


def _owned_tables(config: BridgeConfig) -> dict[str, dict[tuple[str, str], str]]:
    owned: dict[str, dict[tuple[str, str], str]] = {}

    def add(database: str, address: TableAddress, use: str) -> None:
        key = (folded_name(address.schema or ""), folded_name(address.table))
        owned.setdefault(database, {}).setdefault(key, use)

    for forwarder in config.forwarders:
        tables = forwarder_tables(config, forwarder)
        kind = "proxy queue" if forwarder.destination is not None else "forwarding queue"
        add(forwarder.database, tables.queue, f"the {kind} of forwarder '{forwarder.name}'")
        add(
            forwarder.database,
            tables.error_queue,
            f"the error queue of forwarder '{forwarder.name}'",
        )
    for subscription in config.subscription_tables:
        database = config.databases[subscription.database]
        grammar = dialect_for(database.dialect).grammar
        address = grammar.resolve(grammar.parse(subscription.table), database.schema, None)
        add(subscription.database, address, "a subscription table the bridge reads")
    return owned


# The function the push triggers call, in each table's schema (see `PUSH_STATEMENT_NAMES`).
NOTIFY_FUNCTION = "sfbridge_notify"


@dataclass(frozen=True)
class TableStep:
    """Creating one table (or schema) in one database: idempotent statements, run in order.

    A schema step has `schema` and no `table`.
    """

    database: str
    description: str
    table: TableAddress | None
    statements: tuple[str, ...]
    schema: str | None = None
    # A step the bridge works without (push triggers: it polls instead), which a DBA may
    # refuse: run in a transaction of its own, a refusal logged as a warning.
    optional: bool = False


def split_statements(script: str) -> tuple[str, ...]:
    """Split a dialect template into single statements (drivers run one at a time)."""
    return tuple(part.strip() for part in script.split(";\n") if part.strip())


def forwarder_table_steps(config: BridgeConfig, forwarder: ForwarderConfig) -> list[TableStep]:
    """Every table one forwarder needs in its forwarding database, schemas first."""
    dialect = dialect_for(config.databases[forwarder.database].dialect)
    tables = forwarder_tables(config, forwarder)
    name = forwarder.database
    steps = schema_steps(
        name,
        dialect,
        (tables.queue, tables.error_queue, tables.retry, tables.destination_states, tables.pauses),
    )

    def step(description: str, table: TableAddress, template: str, key: str) -> None:
        statements = split_statements(dialect.sql(template, None, **{key: table}))
        steps.append(TableStep(name, description, table, statements))

    step(f"forwarding queue {tables.queue_canonical}", tables.queue, "create_queue", "queue")
    error_queue = dialect.grammar.render(tables.error_queue)
    step(f"error queue {error_queue}", tables.error_queue, "create_queue", "queue")
    step("retry storage", tables.retry, "create_retry_table", "retry")
    # Its own step, so that `install` adds the indexes `sfbridge where` looks up by to retry
    # storage made before them, as well as to a new one.
    step("retry storage lookup indexes", tables.retry, "create_retry_lookup_index", "retry")
    step("counters", tables.counters, "create_counters_table", "counters")
    step("event types seen", tables.event_types, "create_event_types_table", "event_types")
    step(
        "destination states",
        tables.destination_states,
        "create_destination_states_table",
        "destination_states",
    )
    step(
        "forwarder states",
        tables.forwarder_states,
        "create_forwarder_states_table",
        "forwarder_states",
    )
    step("daemons", tables.daemons, "create_daemons_table", "daemons")
    step("pauses", tables.pauses, "create_pauses_table", "pauses")
    step("audit log", tables.audit, "create_audit_table", "audit")
    step("error archive", tables.archive, "create_archive_table", "archive")
    if dialect.records_transactions:
        step("transactions table", tables.transactions, "create_transactions_table", "transactions")
    if dialect.pushes:
        for description, table in (
            (f"forwarding queue {tables.queue_canonical}", tables.queue),
            ("retry storage", tables.retry),
        ):
            function = TableAddress(NOTIFY_FUNCTION, table.schema, table.catalog)
            statements = split_statements(
                dialect.sql("create_notify_trigger", None, queue=table, function=function)
            )
            steps.append(
                TableStep(name, f"push trigger on {description}", table, statements, optional=True)
            )
    return steps


def schema_steps(
    database: str, dialect: Dialect, addresses: Sequence[TableAddress]
) -> list[TableStep]:
    """`CREATE SCHEMA` steps for the schemas of `addresses` (none where the dialect has none)."""
    steps: list[TableStep] = []
    for schema in dict.fromkeys(address.schema for address in addresses):
        statement = dialect.create_schema_sql(schema)
        if statement:
            steps.append(TableStep(database, f"schema {schema}", None, (statement,), schema=schema))
    return steps


def upgrade_retry_table(
    connection: Connection, dialect: Dialect, retry: TableAddress, *, allowed: bool
) -> bool:
    """Add `destination_database` to retry storage made by an earlier sfbridge; True if added.

    Reads the catalog first (no DDL right needed when the column is there). `connection`
    must have no transaction open; none is left open. Raises TableNotFound when retry storage
    does not exist, BridgeTableMissing when the column is missing and `allowed` is False,
    PermissionDenied and the DatabaseError family.
    """
    connection.begin()
    columns = {
        str(row[0]).lower()
        for row in connection.query(
            dialect.sql("table_columns", queue=retry), (retry.schema, retry.table)
        )
    }
    connection.commit()
    if not columns:
        raise TableNotFound(connection.database, f"{dialect.grammar.render(retry)} does not exist")
    if "destination_database" in columns:
        return False
    statement = dialect.sql("retry_add_destination_database", retry=retry)
    missing = TableNotFound(connection.database, "column destination_database is missing")

    def person_must(why: str) -> BridgeTableMissing:
        return BridgeTableMissing(
            missing,
            "retry storage column destination_database in",
            dialect.grammar.render(retry),
            f"{why}: run 'sfbridge install', or have a DBA run: {' '.join(statement.split())}",
        )

    if not allowed:
        raise person_must("install.at_runtime is false")
    connection.begin()
    try:
        connection.execute(statement)
        connection.commit()
    except PermissionDenied as error:
        connection.rollback()
        raise person_must(f"the bridge's login may not add it ({error.detail})") from None
    except BaseException:
        connection.rollback()
        raise
    return True


@contextmanager
def owned_table(description: str, table: str) -> Iterator[None]:
    """Turn a missing-table error inside the block into BridgeTableMissing naming `table`."""
    try:
        yield
    except BridgeTableMissing:
        raise
    except TableNotFound as error:
        raise BridgeTableMissing(error, description, table) from None


# Racing creators: `IF NOT EXISTS` is not atomic in PostgreSQL, so two daemons (or a daemon
# and `sfbridge install`) can both pass the check and one then fails on the catalog's unique
# index. Running the steps again finds the table and does nothing.
CREATE_ATTEMPTS = 3


def create_tables(
    connection: Connection, dialect: Dialect, steps: Sequence[TableStep], *, only_missing: bool
) -> list[TableStep]:
    """Run `steps` in one transaction on `connection` (which must have none open) and commit.

    With `only_missing`, steps whose table the database already lists are left out, and
    schema steps run only when some table is to be created: a login without the right to
    create tables gets "permission denied" even from `CREATE TABLE IF NOT EXISTS` for an
    existing table. A schema that exists is never created again, in either mode: PostgreSQL
    asks for CREATE on the database even for `CREATE SCHEMA IF NOT EXISTS` of an existing
    schema (`bridge.storage.grants` says what each step needs). Returns the steps that ran.
    Raises PermissionDenied when the login may not create them, and the DatabaseError family.
    Optional steps (push triggers) run after
    the commit, each in a transaction of its own; one refused is logged as a warning and left
    out of the steps returned.
    """
    for attempt in range(CREATE_ATTEMPTS):
        try:
            connection.begin()
            chosen = _missing_steps(connection, dialect, steps) if only_missing else list(steps)
            chosen = [
                step
                for step in chosen
                if step.table is not None or not _schema_exists(connection, dialect, step.schema)
            ]
            for step in chosen:
                if not step.optional:
                    for statement in step.statements:
                        connection.execute(statement)
            connection.commit()
            return [step for step in chosen if not step.optional or _run_optional(connection, step)]
        except (DuplicateKey, AlreadyExists):
            connection.rollback()
            if attempt == CREATE_ATTEMPTS - 1:
                raise
        except BaseException:
            connection.rollback()
            raise
    raise AssertionError("unreachable")


def log_created(forwarder: str, database: str, created: Sequence[TableStep]) -> None:
    """Warn about each table `create_tables` created at run time (whoever in the daemon found
    it missing first: a batch, the heartbeat, the state publisher): it was gone."""
    # One line for all: a first start without 'sfbridge install' creates a dozen at once.
    # A schema is left out: created only if absent, and only with a table.
    tables = [step.description for step in created if step.table is not None]
    if tables:
        log.warning(
            "forwarder '%s': created what was missing in database '%s': %s",
            forwarder,
            database,
            "; ".join(tables),
        )


def _schema_exists(connection: Connection, dialect: Dialect, schema: str | None) -> bool:
    rows = connection.query(dialect.sql("schema_exists"), (schema or "",))
    return bool(rows and rows[0][0])


def _run_optional(connection: Connection, step: TableStep) -> bool:
    """Run an optional step in a transaction of its own; a refusal is a warning (False)."""
    try:
        connection.begin()
        for statement in step.statements:
            connection.execute(statement)
        connection.commit()
        return True
    except DatabaseError as error:
        connection.rollback()
        log.warning(
            "%s not created in database '%s': %s; the bridge polls that table instead "
            "(a DBA may create it: 'sfbridge install --print-sql' shows the statements)",
            step.description,
            step.database,
            error.detail,
        )
        return False


def _missing_steps(
    connection: Connection, dialect: Dialect, steps: Sequence[TableStep]
) -> list[TableStep]:
    tables = [step for step in steps if step.table is not None]
    existing: set[tuple[str, str]] = set()
    for catalog in dict.fromkeys(step.table.catalog for step in tables if step.table):
        probe = next(step.table for step in tables if step.table and step.table.catalog == catalog)
        for schema, table in connection.query(dialect.sql("list_tables", queue=probe)):
            existing.add(((schema or "").casefold(), str(table).casefold()))
    missing = [
        step
        for step in tables
        if step.table
        and ((step.table.schema or "").casefold(), step.table.table.casefold()) not in existing
        # SQLite lists no schema; the other dialects always resolve one.
        and ("", step.table.table.casefold()) not in existing
    ]
    if not missing:
        return []
    schemas = {step.table.schema for step in missing if step.table}
    return [
        step for step in steps if step in missing or (step.table is None and step.schema in schemas)
    ]
