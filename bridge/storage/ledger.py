"""The dedup ledger: where ledgers live, their keys, their creation and their cleanup.

Every destination database that some forwarder delivers to from another database holds a
ledger table recording (message id, destination) for each delivered message, written in the
same destination transaction as the message. A redelivery after a crash between the
destination and source commits hits the ledger and is skipped.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import timedelta

from bridge.addressing import TableAddress
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import dialect_for
from bridge.dialects.base import LEDGER_TABLE
from bridge.drivers import Connection
from bridge.exceptions import DatabaseError, DatabaseUnavailable, PermissionDenied, TableNotFound
from bridge.messages import utcnow
from bridge.outages import OutageTracker
from bridge.storage.grants import MissingRight, lacking_right
from bridge.storage.tables import (
    TableStep,
    create_tables,
    owned_table,
    schema_steps,
    split_statements,
)

log = logging.getLogger(__name__)

LEDGER_DESCRIPTION = "dedup ledger"
# What the probe writes (and rolls back) to see that the login may insert into the ledger.
PROBE_KEY = ("$sfbridge-probe", "$sfbridge-probe")

# The ledger's message_id column holds 200 characters (SQL Server: 200 UTF-16 code units).
# NServiceBus lets an endpoint set any message id, so longer ones are stored as a digest.
MAX_STORED_KEY_BYTES = 200
DIGEST_PREFIX = "sha256:"


def ledger_key(message_id: str) -> str:
    """The value stored for `message_id` in the ledger: the id itself when it fits, else a digest.

    Fits: at most 200 bytes of UTF-8 (never more characters or UTF-16 code units than that)
    and no NUL character (which PostgreSQL text cannot hold). A digest is `sha256:` and 64
    hex digits of the id's UTF-8 bytes (unpaired surrogates kept as they are).
    """
    if len(message_id) <= MAX_STORED_KEY_BYTES // 4 and "\x00" not in message_id:
        return message_id  # at most 4 bytes a character: fits without encoding it to know
    encoded = message_id.encode("utf-8", "surrogatepass")
    if len(encoded) <= MAX_STORED_KEY_BYTES and "\x00" not in message_id:
        return message_id
    return DIGEST_PREFIX + hashlib.sha256(encoded).hexdigest()


def ledger_address(config: BridgeConfig, database: str) -> TableAddress:
    """The ledger table's address in `database`."""
    target = config.databases[database]
    return dialect_for(target.dialect).bridge_table(LEDGER_TABLE, target.schema)


def ledger_databases(config: BridgeConfig) -> list[str]:
    """Databases that hold a ledger: those some forwarder delivers to from another database
    with `transaction: ledger` (routes and proxy destinations). Two-phase and at-least-once
    destinations hold no bridge table."""
    return sorted({target for _, target, mode in config.crossings() if mode == "ledger"})


def ledger_steps(config: BridgeConfig, database: str) -> list[TableStep]:
    """Creating the ledger in `database`: its schema where needed, then the table."""
    dialect = dialect_for(config.databases[database].dialect)
    ledger = ledger_address(config, database)
    statements = split_statements(dialect.sql("create_ledger_table", ledger=ledger))
    return [
        *schema_steps(database, dialect, [ledger]),
        TableStep(database, LEDGER_DESCRIPTION, ledger, statements),
    ]


def cannot_create_advice(error_detail: str, lacking: MissingRight | None = None) -> str:
    """What to tell people when the bridge's login may not create (or use) a table it owns:
    the exact GRANT when `lacking` says which right is missing."""
    if lacking is not None:
        return f"{lacking.advice()} ({error_detail})"
    return (
        f"the bridge's login may not create or use it ({error_detail}): have a DBA create it "
        "with the DDL from 'sfbridge install --print-sql' and grant the login SELECT, INSERT "
        "and DELETE on it, or grant the login CREATE"
    )


def ledger_grant_advice(
    config: BridgeConfig, connections: Connections, database: str, error: PermissionDenied
) -> str:
    """What to do about a ledger of `database` the login may not create: the exact GRANT it
    lacks, when that can be read."""
    dialect = dialect_for(config.databases[database].dialect)
    schema = ledger_address(config, database).schema
    try:
        lacking = lacking_right(connections.get(database), dialect, [schema])
    except DatabaseError:
        lacking = None
    return cannot_create_advice(error.detail, lacking)


RUNTIME_DDL_OFF_ADVICE = (
    "install.at_runtime is false, so the bridge does not create it: run 'sfbridge install', "
    "or have a DBA run 'sfbridge install --print-sql'"
)


def ledger_problem(config: BridgeConfig, database: str, advice: str) -> str:
    """A sentence saying the ledger of `database` is missing or unusable, and what to do."""
    dialect = dialect_for(config.databases[database].dialect)
    table = dialect.grammar.render(ledger_address(config, database))
    return (
        f"the bridge's {LEDGER_DESCRIPTION} {table} in database '{database}' is missing or "
        f"unusable; {advice}"
    )


def ensure_ledger(
    connection: Connection, config: BridgeConfig, database: str, *, create: bool
) -> bool:
    """Make sure `database` has its ledger; True when this call created it.

    `connection` must have no transaction open; none is left open. With `create` False a
    missing ledger raises BridgeTableMissing. Raises PermissionDenied when the login may not
    create it or may not insert into it (tried and rolled back), and the DatabaseError family
    (an unreachable database among them).
    """
    dialect = dialect_for(config.databases[database].dialect)
    ledger = ledger_address(config, database)
    try:
        connection.begin()
        with owned_table(LEDGER_DESCRIPTION, dialect.grammar.render(ledger)):
            connection.query(dialect.sql("table_probe", table=ledger))
            # Delivery writes the ledger: a login that may read it but not insert is not
            # ready either. The probe row is rolled back.
            connection.execute(dialect.sql("ledger_record", ledger=ledger), PROBE_KEY)
        connection.rollback()
        return False
    except TableNotFound:
        connection.rollback()
        if not create:
            raise
    except BaseException:
        connection.rollback()
        raise
    created = create_tables(connection, dialect, ledger_steps(config, database), only_missing=True)
    if created:
        log.warning(
            "created the %s %s in database '%s' (it was missing)",
            LEDGER_DESCRIPTION,
            dialect.grammar.render(ledger),
            database,
        )
    return bool(created)


def cleanup_ledgers(config: BridgeConfig, outages: OutageTracker | None = None) -> int:
    """Delete ledger rows older than the retention. Returns rows deleted; logs failures.

    A missing ledger has nothing to clean: it is skipped quietly (delivery creates it). So is
    a database `outages` knows to be in trouble, or that cannot be reached: the outage is
    logged where it is tracked, not once a minute here.
    """
    cutoff = utcnow() - timedelta(seconds=config.ledger.retention)
    connections = Connections(config.databases)
    deleted = 0
    try:
        for database in ledger_databases(config):
            if outages is not None and outages.in_trouble(database):
                continue
            dialect = dialect_for(config.databases[database].dialect)
            ledger = ledger_address(config, database)
            try:
                connection = connections.get(database)
                connection.begin()
                deleted += connection.execute(
                    dialect.sql("ledger_cleanup", ledger=ledger),
                    (dialect.encode_timestamp(cutoff),),
                )
                connection.commit()
            except TableNotFound:
                connections.discard(database)
                log.debug("no ledger in database '%s' yet; nothing to clean up", database)
            except DatabaseUnavailable as error:
                connections.discard(database)
                log.debug("ledger cleanup skipped for database '%s': %s", database, error)
            except DatabaseError as error:
                connections.discard(database)
                log.warning("ledger cleanup skipped for database '%s': %s", database, error)
    finally:
        connections.close()
    return deleted
