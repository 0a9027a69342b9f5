"""PostgreSQL: the NServiceBus PostgreSQL transport's queue tables, through psycopg 3 or psqlODBC.

- Addresses are `"schema"."table"`, split on the first dot outside double quotes
  (https://docs.particular.net/transports/postgresql/addressing); the address is also the
  SQL qualified name.
- Queue tables have the shape the transport's installer creates: `Id uuid`, `Expires
  timestamp`, `Headers text`, `Body bytea`, `Seq serial`. Column names are unquoted (folded to
  lower case, as the transport creates them); table names are quoted. Times are UTC
  wall-clock `timestamp without time zone`, compared with `now() AT TIME ZONE 'UTC'` on the
  server, as the transport does.
- Connections go through psycopg (the default), or through psqlODBC with the options in
  `POSTGRESQL_REQUIRED_OPTIONS` (`driver: odbc`).
"""

from __future__ import annotations

import re

from bridge.addressing import TableAddress
from bridge.dialects.base import ConfiguredDatabase, Dialect, decode_uuid, require_naive_utc
from bridge.dialects.postgresql.grammar import GRAMMAR, PostgreSqlGrammar
from bridge.dialects.postgresql.statements import STATEMENTS, _decode_timestamp
from bridge.drivers import odbc as odbc_driver
from bridge.drivers import psycopg as psycopg_driver
from bridge.drivers.base import Connection
from bridge.drivers.libpq import ConnectionProblem, connection_problems, odbc_connection_string
from bridge.drivers.odbc import OdbcConnection, with_default_options, with_required_options
from bridge.drivers.psycopg import PsycopgConnection, keepalive_parameters
from bridge.exceptions import ConnectionFailed

__all__ = ["DIALECT", "GRAMMAR", "POSTGRESQL_DEFAULT_OPTIONS", "STATEMENTS", "PostgreSqlGrammar"]

# --------------------------------------------------------------------------------------------
# Connections
# --------------------------------------------------------------------------------------------

# psqlODBC options the bridge needs for correctness, whatever the user's string or DSN says
# (https://odbc.postgresql.org/docs/config.html): Protocol=7.4-0 gives native rollback
# semantics (the default silently wraps every statement in a savepoint, 7.4-1 silently drops
# work); ByteaAsLongVarBinary=0 corrupts bodies over 255 bytes; BoolsAsChar=0 returns booleans
# as booleans.
POSTGRESQL_REQUIRED_OPTIONS = {
    "Protocol": "7.4-0",
    "ByteaAsLongVarBinary": "1",
    "BoolsAsChar": "0",
}


# Debian's odbcinst.ini turns psqlODBC's communication log on, which writes a file per process
# into /tmp (psqlodbc_<program>_<user><pid>.log) for as long as it runs: off unless the
# connection string asks for it.
POSTGRESQL_DEFAULT_OPTIONS = {"CommLog": "0", "Debug": "0"}


# What the server shows for the bridge's connections (`pg_stat_activity.application_name`),
# unless the connection string names another.
APPLICATION_NAME = "sfbridge"


# The `driver` config key's choices, the default first: psycopg 3 (PostgreSQL's own protocol,
# binary parameters, server-side prepared statements, no system packages) or psqlODBC.
DRIVERS = ("psycopg", "odbc")


def session_setup(query_timeout: float, *, per_transaction: bool = False) -> list[str]:
    """Server-side halves of the connection's deadline: a statement waiting for a lock gives
    up after `query_timeout` (SQLSTATE 55P03, the table is busy), any statement a second later
    (57014); the client waits a little longer still for their answer (`bridge.drivers`).

    `per_transaction`: the same as `SET LOCAL`, for a connection whose session does not
    outlive a transaction (behind a transaction pooler, the next transaction may run on
    another server connection, whose settings are someone else's)."""
    lock_ms = max(1, round(query_timeout * 1000))
    scope = "SET LOCAL" if per_transaction else "SET"
    return [
        f"{scope} lock_timeout = '{lock_ms}ms'",
        f"{scope} statement_timeout = '{lock_ms + 1000}ms'",
    ]


def connect(database: ConfiguredDatabase, *, create: bool = False) -> Connection:
    """A psycopg connection, or with `driver: odbc` an ODBC one with
    `POSTGRESQL_REQUIRED_OPTIONS` set and the `POSTGRESQL_DEFAULT_OPTIONS` the string does not
    set, both bounded by `database.query_timeout` (`session_setup`; psycopg also on the
    client, and with TCP keepalives; psqlODBC passes the keepalives to libpq through
    `pqopt`). Behind a transaction pooler (`pooler: transaction`, psycopg only: the config
    refuses ODBC there) the timeouts are set in every transaction and nothing is prepared on
    the server. `create` has no effect: a server database is never created by the bridge.
    Raises ConnectionFailed."""
    assert database.connection is not None
    driver = database.driver or DRIVERS[0]
    refused = [p for p in connection_problems(database.connection, driver) if p.error]
    if refused:
        # Config validation refuses these; here for a string whose variables were unset then.
        raise ConnectionFailed(
            database.name, "connection: " + "; ".join(f"{p.key} {p.message}" for p in refused)
        )
    if driver == "psycopg":
        transaction_pooled = database.pooler == "transaction"
        return PsycopgConnection(
            database.name,
            database.connection,
            timeout=database.connect_timeout,
            deadline=database.query_timeout,
            session_setup=session_setup(database.query_timeout, per_transaction=transaction_pooled),
            application_name=APPLICATION_NAME,
            transaction_pooled=transaction_pooled,
        )
    text = with_default_options(database.connection, POSTGRESQL_DEFAULT_OPTIONS)
    # psqlODBC passes `pqopt` to libpq as it is, and ignores the libpq keys it does not read
    # itself (target_session_attrs...): they go into pqopt with the keepalives.
    text = odbc_connection_string(
        text,
        {**keepalive_parameters(database.query_timeout), "application_name": APPLICATION_NAME},
    )
    return OdbcConnection(
        database.name,
        with_required_options(text, POSTGRESQL_REQUIRED_OPTIONS),
        timeout=database.connect_timeout,
        session_setup=session_setup(database.query_timeout),
    )


def connection_string_problems(connection: str, driver: str | None) -> list[ConnectionProblem]:
    """What `connect` would refuse in (or warn of) this connection string with `driver`."""
    return connection_problems(connection, driver or DRIVERS[0])


def load_driver(database: ConfiguredDatabase) -> None:
    """Import the driver `connect` opens `database` with."""
    if (database.driver or DRIVERS[0]) == "psycopg":
        psycopg_driver.load_driver()
    else:
        odbc_driver.load_driver()


# PostgreSQL's longest identifier, in bytes (NAMEDATALEN - 1).
MAX_IDENTIFIER_BYTES = 63
_SERIAL_COLUMN = re.compile(r"^\s*(\w+)\s+(?:small|big)?serial\b", re.IGNORECASE | re.MULTILINE)


def serial_sequences(table: TableAddress, create_table: str) -> tuple[TableAddress, ...]:
    """The sequences PostgreSQL makes for the `serial` columns of `create_table` (the DDL of
    `table`), named as it names them: `<table>_<column>_seq`, the longer part cut first to fit
    63 bytes (`ChooseRelationName`). A name taken already gets a number instead, which only
    the catalog knows: `check` reads the real one."""
    sequences = []
    for match in _SERIAL_COLUMN.finditer(create_table):
        name = _object_name(table.table, match.group(1).lower(), "seq")
        sequences.append(TableAddress(name, table.schema, table.catalog))
    return tuple(sequences)


def _object_name(first: str, second: str, label: str) -> str:
    """PostgreSQL's `makeObjectName(first, second, label)`."""
    first_bytes, second_bytes = first.encode(), second.encode()
    room = MAX_IDENTIFIER_BYTES - len(label.encode()) - 2
    first_length, second_length = len(first_bytes), len(second_bytes)
    while first_length + second_length > room:
        if first_length > second_length:
            first_length -= 1
        else:
            second_length -= 1
    return "_".join((_clip(first_bytes, first_length), _clip(second_bytes, second_length), label))


def _clip(text: bytes, length: int) -> str:
    """The first `length` bytes of UTF-8 `text`, less a character cut in two."""
    return text[:length].decode("utf-8", errors="ignore")


DIALECT = Dialect(
    name="postgresql",
    title="PostgreSQL",
    grammar=GRAMMAR,
    connect=connect,
    locator="connection",
    has_schemas=True,
    single_writer=False,
    statements=STATEMENTS,
    queue_columns=frozenset({"id", "expires", "headers", "body", "seq"}),
    queue_indexed_columns=("seq",),
    keep_destination_connections=True,
    encode_id=lambda value: value,
    decode_id=decode_uuid,
    encode_timestamp=require_naive_utc,
    decode_timestamp=_decode_timestamp,
    drivers=DRIVERS,
    poolers=("session", "transaction"),
    load_driver=load_driver,
    max_parameters=65535,
    cannot_prepare=None,
    copy_types={
        "send_copy": ("uuid", "timestamp", "text", "bytea"),
        "ledger_record_copy": ("varchar", "varchar", "timestamp"),
    },
    grants={
        "create_tables": "GRANT CREATE ON SCHEMA {schema} TO {login}",
        "create_schemas": "GRANT CREATE ON DATABASE {database} TO {login}",
        "insert": "GRANT INSERT ON {table} TO {login}",
        "use_sequence": "GRANT USAGE ON SEQUENCE {sequence} TO {login}",
        # Roles belong to the cluster: once per server.
        "create_login": (
            "CREATE ROLE {login} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS"
        ),
        "login_note": (
            "give it a password (psql: \\password {login}), or let pg_hba.conf authenticate "
            "it otherwise"
        ),
        "connect": "GRANT CONNECT ON DATABASE {database} TO {login}",
        "use_schema": "GRANT USAGE ON SCHEMA {schema} TO {login}",
        "create_schema": "CREATE SCHEMA IF NOT EXISTS {schema}",
        "rights": "GRANT {rights} ON {table} TO {login}",
        "revoke": "REVOKE {rights} ON {table} FROM {login}",
        "schema_insert": (
            "GRANT INSERT ON ALL TABLES IN SCHEMA {schema} TO {login}; "
            "GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {login}"
        ),
    },
    serial_sequences=serial_sequences,
    connection_problems=connection_string_problems,
    read_only_advice=(
        "list every server of the primary and its standbys in the connection (Server=h1,h2; "
        "Port=5432,5432 or postgresql://h1,h2/db) and add target_session_attrs=read-write, so "
        'that it opens the primary (see "Failover and standbys" in docs/operating.md)'
    ),
)
