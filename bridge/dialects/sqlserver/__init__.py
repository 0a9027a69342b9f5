"""SQL Server: the NServiceBus SQL Server transport's queue tables and runtime SQL, for pyodbc
with Microsoft's ODBC Driver 18 or FreeTDS.

- Addresses are `table@[schema]@[catalog]`: the table part raw, schema and catalog optional,
  bare or bracket-quoted (https://docs.particular.net/transports/sql/addressing).
- Names are `[catalog].[schema].[table]` when the address names a catalog, else
  `[schema].[table]`, resolved in the connection's database. A catalog on the same server is
  reached through the same connection, so delivering there from the forwarding database is one
  local transaction.
- Queue times are UTC wall-clock `datetime`, compared with `GETUTCDATE()` on the server as the
  transport does. The bridge's own tables use `datetime2`, so a retried message keeps its
  `Expires` to the microsecond.
- Headers and bodies are CAST to `nvarchar(max)` / `varbinary(max)` wherever they are bound.
  pyodbc binds a str of more than 2000 characters as SQL_WLONGVARCHAR (`ntext`) with data at
  execution, the only long form FreeTDS accepts, and a NULL whose type it cannot describe as
  `varchar`; with the CASTs the server sees max types either way, in every row of a multi-row
  INSERT.
- The install batches follow the transport's installer: look for the table, take an exclusive
  application lock, look again, create, and swallow errors 2714 / 1913 (object / index exists)
  from a racing installer. Each is one batch with no `;` at a line end, because the installer
  splits scripts there.
- Statements use no `SET NOCOUNT`: the driver keeps NOCOUNT off for the whole session (see
  `SESSION_SETUP`), so the single-row ledger insert reports 1 or 0 rows, and the driver skips
  row-count-only results in front of a result set.
- Connections: FreeTDS gets the options in `FREETDS_REQUIRED_OPTIONS`; the server's error
  numbers become the bridge's exceptions through `NATIVE_ERRORS`.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from bridge.dialects.base import ConfiguredDatabase, Dialect, decode_uuid, require_naive_utc
from bridge.dialects.sqlserver.grammar import GRAMMAR, SQLSERVER_DEFAULT_SCHEMA, SqlServerGrammar
from bridge.dialects.sqlserver.queue_tables import (
    PERMISSIONS_QUERY,
    RECOVERABLE_LOOKUP,
    RecoverableColumn,
    inspect_queue_table,
)
from bridge.dialects.sqlserver.statements import STATEMENTS, WITHOUT_RECOVERABLE
from bridge.drivers import odbc as odbc_driver
from bridge.drivers.base import Connection
from bridge.drivers.odbc import (
    NativeErrors,
    OdbcConnection,
    parse_connection_string,
    with_required_options,
)
from bridge.exceptions import (
    AlreadyExists,
    DatabaseError,
    DatabaseReadOnly,
    DatabaseUnavailable,
    DuplicateKey,
    LockTimeout,
    PermissionDenied,
    TableNotFound,
    TransientDatabaseError,
)

__all__ = [
    "DIALECT",
    "FREETDS_REQUIRED_OPTIONS",
    "FREETDS_TDS_VERSION",
    "GRAMMAR",
    "NATIVE_ERRORS",
    "PERMISSIONS_QUERY",
    "RECOVERABLE_LOOKUP",
    "SESSION_SETUP",
    "SQLSERVER_DEFAULT_SCHEMA",
    "STATEMENTS",
    "WITHOUT_RECOVERABLE",
    "RecoverableColumn",
    "SqlServerGrammar",
    "connect",
    "connection_catalog",
    "inspect_queue_table",
    "sqlserver_connection_string",
]

# Run on every new connection. ODBC drivers mostly connect with these options already, but a
# server's `user options` can change them: the filtered Index_Expires makes INSERT and DELETE
# fail (error 1934) without the first two lines; NOCOUNT must be off for the row counts the
# bridge reads; XACT_ABORT must be off so a failed statement leaves the transaction usable for
# a rollback to a savepoint.
SESSION_SETUP = (
    "SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, "
    "QUOTED_IDENTIFIER ON",
    "SET NUMERIC_ROUNDABORT OFF",
    "SET NOCOUNT OFF",
    "SET XACT_ABORT OFF",
)


def _decode_timestamp(value: Any) -> datetime | None:
    # FreeTDS below TDS 7.3 returns datetime2 as text.
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).strip())


# --------------------------------------------------------------------------------------------
# Connections
# --------------------------------------------------------------------------------------------

# FreeTDS options the bridge needs for correctness: a TDS version of at least 7.3 (below it,
# datetime2 arrives as text and the max types are sent as the old text types) and UTF-8 as
# the client character set (otherwise text outside the client's code page is lost). Microsoft's
# ODBC Driver 18 needs nothing added; its Encrypt / TrustServerCertificate settings are a
# security decision left to the connection string.
FREETDS_REQUIRED_OPTIONS = {"ClientCharset": "UTF-8"}
FREETDS_TDS_VERSION = "7.4"
_FREETDS_GOOD_TDS_VERSION = re.compile(r"^7\.([3-9])$")


def sqlserver_connection_string(text: str) -> str:
    """Return the SQL Server connection string with what its driver needs for correctness.

    Only a string that names the FreeTDS driver (`Driver={FreeTDS}` or a path to
    libtdsodbc.so) gets options added; with a DSN, set them in odbc.ini.
    """
    pairs = parse_connection_string(text)
    driver = next((value for key, value in pairs if key.strip().lower() == "driver"), "")
    if not any(name in driver.lower() for name in ("freetds", "tdsodbc")):
        return text
    required = dict(FREETDS_REQUIRED_OPTIONS)
    version = next((v for k, v in pairs if k.strip().lower() == "tds_version"), "")
    if not _FREETDS_GOOD_TDS_VERSION.match(version.strip()):
        required["TDS_Version"] = FREETDS_TDS_VERSION
    return with_required_options(text, required)


def connection_catalog(text: str) -> str | None:
    """The database a connection string opens (`Database=` or `Initial Catalog=`; braces
    around the value removed), None when it names none."""
    for key, value in parse_connection_string(text):
        if key.strip().lower() in ("database", "initial catalog"):
            value = value.strip()
            if value.startswith("{") and value.endswith("}"):
                value = value[1:-1].replace("}}", "}")
            return value or None
    return None


def _numbers(kind: type[DatabaseError], *numbers: int) -> dict[int, type[DatabaseError]]:
    return dict.fromkeys(numbers, kind)


# SQL Server error numbers, where they say more than the SQLSTATE (23000 is every integrity
# violation; FreeTDS reports many errors as 42000); the ODBC driver raises the mapped type.
NATIVE_ERRORS: NativeErrors = {
    # 208: invalid object name; 911: database (catalog) does not exist.
    **_numbers(TableNotFound, 208, 911),
    # 2601: duplicate key row in a unique index; 2627: violation of a PRIMARY KEY / UNIQUE
    # constraint.
    **_numbers(DuplicateKey, 2601, 2627),
    # 2714: there is already an object named ...; 1913: an index with that name exists;
    # 2759: CREATE SCHEMA failed because the schema exists.
    **_numbers(AlreadyExists, 2714, 1913, 2759),
    # 262: permission denied in database (CREATE TABLE); 2760: schema missing or no
    # permission; 1088: cannot find the object or no permission (CREATE INDEX); 229/230:
    # object permission.
    **_numbers(PermissionDenied, 262, 2760, 1088, 229, 230),
    # 1205: deadlock victim; 40197, 40501, 40613: Azure SQL's "try again".
    **_numbers(TransientDatabaseError, 1205, 40197, 40501, 40613),
    # 1222: lock request time out period exceeded (`SET LOCK_TIMEOUT`).
    **_numbers(LockTimeout, 1222),
    # A database that answers but takes no writes (an outage of it, `read-only`): 3906 failed
    # to update because the database is read-only (also a readable availability-group
    # secondary); 927 in the middle of a restore; 976 an availability-group secondary not
    # accessible for queries; 978 accessible only with ApplicationIntent=ReadOnly; 983 the
    # replica is in neither the PRIMARY nor the SECONDARY role (a failover under way).
    **_numbers(DatabaseReadOnly, 3906, 927, 976, 978, 983),
    # 942: the database is offline; 922: it is being recovered (after a restart or a
    # failover): unreachable for now.
    **_numbers(DatabaseUnavailable, 942, 922),
}


def lock_timeout_setup(query_timeout: float) -> str:
    """The server-side half of the connection's deadline: a statement waiting for a lock gives
    up after `query_timeout` (error 1222, the table is busy); the driver's query timeout, a
    second longer, bounds every statement on the client."""
    return f"SET LOCK_TIMEOUT {max(1, round(query_timeout * 1000))}"


def connect(database: ConfiguredDatabase, *, create: bool = False) -> Connection:
    """An ODBC connection with FreeTDS's options added, `SESSION_SETUP` run, the server's error
    numbers mapped by `NATIVE_ERRORS`, the row-count-only results of batches skipped, and every
    call bounded by `database.query_timeout` (`lock_timeout_setup` and the driver's query
    timeout). `create` has no effect: a server database is never created by the bridge. Raises
    ConnectionFailed."""
    assert database.connection is not None
    return OdbcConnection(
        database.name,
        sqlserver_connection_string(database.connection),
        timeout=database.connect_timeout,
        session_setup=(*SESSION_SETUP, lock_timeout_setup(database.query_timeout)),
        native_errors=NATIVE_ERRORS,
        drain_extra_results=True,
        query_timeout=database.query_timeout + 1,
    )


DIALECT = Dialect(
    name="sqlserver",
    title="SQL Server",
    grammar=GRAMMAR,
    connect=connect,
    load_driver=lambda database: odbc_driver.load_driver(),
    locator="connection",
    has_schemas=True,
    single_writer=False,
    statements=STATEMENTS,
    # Recoverable is not required: the transport works without it since 7.0.
    queue_columns=frozenset(
        {"id", "correlationid", "replytoaddress", "expires", "headers", "body", "rowversion"}
    ),
    queue_indexed_columns=("rowversion",),
    keep_destination_connections=True,
    encode_id=lambda value: value,
    decode_id=decode_uuid,
    encode_timestamp=require_naive_utc,
    decode_timestamp=_decode_timestamp,
    # SQL Server takes at most 2100 parameters per statement; leave room below it.
    max_parameters=2000,
    queue_shapes=RecoverableColumn(),
    # The `*_raw` claims return nvarchar text as varbinary: UTF-16, unpaired surrogates kept.
    raw_text_encoding="utf-16-le",
    inspect_queue_table=inspect_queue_table,
    connection_catalog=connection_catalog,
    cannot_prepare=(
        "SQL Server prepares a transaction only under a distributed transaction coordinator "
        "(MSDTC), never from T-SQL, and the bridge does not use one"
    ),
    grants={
        "create_tables": (
            "GRANT CREATE TABLE TO {login}; GRANT ALTER ON SCHEMA::{schema} TO {login}"
        ),
        # A schema the login creates is its own; its tables still need CREATE TABLE.
        "create_schemas": "GRANT CREATE SCHEMA, CREATE TABLE TO {login}",
        "insert": "GRANT INSERT ON {table} TO {login}",
        # A login belongs to the server (run in master, once); a user to each database.
        "create_login": "CREATE LOGIN {login} WITH PASSWORD = N'CHANGE-ME', CHECK_POLICY = ON",
        "login_note": "replace CHANGE-ME with the password the bridge's EnvironmentFile holds",
        "use_catalog": "USE {catalog}",
        "create_user": "CREATE USER {login} FOR LOGIN {login}",
        "rights": "GRANT {rights} ON {table} TO {login}",
        "revoke": "REVOKE {rights} ON {table} FROM {login}",
        "schema_insert": "GRANT INSERT ON SCHEMA::{schema} TO {login}",
    },
    read_only_advice=(
        "connect to the availability group's listener with MultiSubnetFailover=Yes (Microsoft's "
        "ODBC driver), which opens the primary replica, or with database mirroring name the "
        "mirror in Failover_Partner=...; or connect to the primary itself "
        '(see "Failover" in docs/sqlserver.md)'
    ),
)
