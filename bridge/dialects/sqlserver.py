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
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from bridge.addressing import AddressError, QueueAddress, check_characters, check_table
from bridge.dialects.base import Dialect
from bridge.drivers.base import (
    AlreadyExists,
    Connection,
    DatabaseError,
    DuplicateKey,
    PermissionDenied,
    QueueNotFound,
    Row,
    TransientDatabaseError,
)
from bridge.drivers.odbc import (
    NativeErrors,
    OdbcConnection,
    parse_connection_string,
    with_required_options,
)

if TYPE_CHECKING:
    from bridge.config.model import DatabaseConfig

# --------------------------------------------------------------------------------------------
# Queue addresses
# --------------------------------------------------------------------------------------------

SQLSERVER_DEFAULT_SCHEMA = "dbo"


class SqlServerGrammar:
    """`table@[schema]@[catalog]`; schema and catalog optional, bare or bracket-quoted."""

    dialect: str = "sqlserver"

    def parse(self, text: str) -> QueueAddress:
        table, at, rest = text.partition("@")
        check_table(table, text)
        if not at:
            return QueueAddress(table)
        parts: list[str | None] = []
        position = 0
        while True:
            value, position = self._read_part(rest, position, text, len(parts))
            parts.append(value)
            if position == len(rest):
                break
            if len(parts) == 2:
                raise AddressError(
                    f"too many '@'-separated parts in address {text!r}; expected at most "
                    "table@schema@catalog"
                )
            # _read_part stops on the separator; step over it to the next part.
            position += 1
        schema = parts[0]
        catalog = parts[1] if len(parts) > 1 else None
        address = QueueAddress(table, schema, catalog)
        self._validate(address, text)
        return address

    def resolve(
        self, address: QueueAddress, default_schema: str | None, default_catalog: str | None
    ) -> QueueAddress:
        resolved = QueueAddress(
            address.table,
            address.schema or default_schema or SQLSERVER_DEFAULT_SCHEMA,
            address.catalog or default_catalog or None,
        )
        self._validate(resolved, address)
        return resolved

    def render(self, address: QueueAddress) -> str:
        self._validate(address, address)
        schema = self.quote_identifier(address.schema or SQLSERVER_DEFAULT_SCHEMA)
        if not address.catalog:
            return f"{address.table}@{schema}"
        return f"{address.table}@{schema}@{self.quote_identifier(address.catalog)}"

    def qualified_name(self, address: QueueAddress) -> str:
        self._validate(address, address)
        names = [address.schema or SQLSERVER_DEFAULT_SCHEMA, address.table]
        if address.catalog:
            names.insert(0, address.catalog)
        return ".".join(self.quote_identifier(name) for name in names)

    def quote_identifier(self, name: str) -> str:
        return "[" + name.replace("]", "]]") + "]"

    @staticmethod
    def _validate(address: QueueAddress, source: object) -> None:
        check_table(address.table, source)
        if "@" in address.table:
            # The table part runs up to the first `@`, so such a name could never be read back.
            raise AddressError(
                f"table name {address.table!r} contains '@', which the SQL Server address "
                f"grammar cannot express (address {source!r})"
            )
        if address.schema:
            check_characters(address.schema, "schema", source)
        if address.catalog:
            check_characters(address.catalog, "catalog", source)

    @staticmethod
    def _read_part(rest: str, start: int, text: str, index: int) -> tuple[str | None, int]:
        """Read the schema (index 0) or catalog (index 1) part at `start`.

        Returns the unquoted name (None when empty) and the position of the `@` that ends it,
        or len(rest) when the part runs to the end.
        """
        what = ("schema", "catalog")[index]
        if not rest.startswith("[", start):
            end = rest.find("@", start)
            if end < 0:
                end = len(rest)
            return rest[start:end] or None, end
        chars: list[str] = []
        position = start + 1
        while position < len(rest):
            char = rest[position]
            if char != "]":
                chars.append(char)
                position += 1
            elif rest.startswith("]", position + 1):
                chars.append("]")
                position += 2
            else:
                position += 1
                if position < len(rest) and rest[position] != "@":
                    end = rest.find("@", position)
                    junk = rest[position:] if end < 0 else rest[position:end]
                    raise AddressError(
                        f"unexpected text {junk!r} after the closing ']' of the {what} in "
                        f"address {text!r}"
                    )
                return "".join(chars) or None, position
        raise AddressError(
            f"unterminated '[' in the {what} of address {text!r}; a ']' inside a bracketed "
            "name must be written as ']]'"
        )


GRAMMAR = SqlServerGrammar()

# --------------------------------------------------------------------------------------------
# SQL
# --------------------------------------------------------------------------------------------

_HEADERS = "CAST(? AS nvarchar(max))"
_BODY = "CAST(? AS varbinary(max))"
_EXPIRED_QUEUE = (
    "CASE WHEN deleted.Expires IS NULL THEN 0 WHEN deleted.Expires > GETUTCDATE() THEN 0 ELSE 1 END"
)
_EXPIRED_RETRY = (
    "CASE WHEN deleted.expires IS NULL THEN 0 WHEN deleted.expires > SYSUTCDATETIME() THEN 0 "
    "ELSE 1 END"
)

# SQL Server errors the transport swallows when two installers create the same table.
_ALREADY_EXISTS = "2714, 1913"


def _create_if_missing(table: str, ddl: str) -> str:
    """One idempotent batch creating the table `{table}` with `ddl` (see the module docstring)."""
    name = "N{" + table + "_literal}"
    release = f"EXEC sp_releaseapplock @Resource = {name}, @LockOwner = 'Session'"
    body = "\n".join("                " + line for line in ddl.strip("\n").splitlines())
    return f"""
        IF OBJECT_ID({name}, N'U') IS NULL
        BEGIN
            EXEC sp_getapplock @Resource = {name}, @LockMode = 'Exclusive',
                @LockOwner = 'Session'
            BEGIN TRY
                IF OBJECT_ID({name}, N'U') IS NULL
                BEGIN
{body}
                END
            END TRY
            BEGIN CATCH
                IF ERROR_NUMBER() NOT IN ({_ALREADY_EXISTS})
                BEGIN
                    {release}; THROW
                END
            END CATCH
            {release}
        END"""


_QUEUE_DDL = """
    CREATE TABLE {queue} (
        Id uniqueidentifier NOT NULL,
        CorrelationId varchar(255),
        ReplyToAddress varchar(255),
        Recoverable bit NOT NULL,
        Expires datetime,
        Headers nvarchar(max) NOT NULL,
        Body varbinary(max),
        RowVersion bigint IDENTITY(1,1) NOT NULL
    )
    CREATE NONCLUSTERED INDEX [Index_RowVersion] ON {queue} (RowVersion)
    CREATE NONCLUSTERED INDEX [Index_Expires] ON {queue} (Expires) INCLUDE (Id, RowVersion)
        WHERE Expires IS NOT NULL"""

_RETRY_DDL = """
    CREATE TABLE {retry} (
        seq bigint IDENTITY(1,1) NOT NULL PRIMARY KEY,
        id uniqueidentifier NOT NULL,
        forwarder nvarchar(200) NOT NULL,
        destination nvarchar(1000) NOT NULL,
        destination_database nvarchar(200) NULL,
        expires datetime2,
        headers nvarchar(max) NOT NULL,
        body varbinary(max),
        attempts int NOT NULL,
        first_failure_at datetime2 NOT NULL,
        next_attempt_at datetime2 NOT NULL,
        last_error nvarchar(max) NOT NULL
    )
    CREATE INDEX {retry_index_due} ON {retry} (forwarder, next_attempt_at)"""

# The key stays within the 1700 bytes of a nonclustered index key (SQL Server 2016 and later);
# clustering on the time keeps the table compact while old entries are cleaned out.
_LEDGER_DDL = """
    CREATE TABLE {ledger} (
        message_id nvarchar(200) NOT NULL,
        destination nvarchar(600) NOT NULL,
        forwarded_at datetime2 NOT NULL,
        PRIMARY KEY NONCLUSTERED (message_id, destination)
    )
    CREATE CLUSTERED INDEX {ledger_index_forwarded} ON {ledger} (forwarded_at)"""

_COUNTERS_DDL = """
    CREATE TABLE {counters} (
        forwarder nvarchar(200) NOT NULL,
        counter nvarchar(100) NOT NULL,
        slot int NOT NULL,
        value bigint NOT NULL,
        PRIMARY KEY (forwarder, counter, slot)
    )"""

_DESTINATION_STATES_DDL = """
    CREATE TABLE {destination_states} (
        destination_database nvarchar(200) NOT NULL PRIMARY KEY,
        state nvarchar(20) NOT NULL,
        since datetime2 NOT NULL,
        last_error nvarchar(max) NULL,
        next_probe_at datetime2 NULL,
        updated_at datetime2 NOT NULL,
        reported_by nvarchar(200) NOT NULL
    )"""

_EVENT_TYPES_DDL = """
    CREATE TABLE {event_types} (
        forwarder nvarchar(200) NOT NULL,
        event_type nvarchar(600) NOT NULL,
        last_seen_at datetime2 NOT NULL,
        subscribers nvarchar(max) NOT NULL,
        PRIMARY KEY NONCLUSTERED (forwarder, event_type)
    )"""

STATEMENTS: dict[str, str] = {
    "create_schema": """
        IF NOT EXISTS (SELECT 1 FROM sys.schemas WHERE QUOTENAME(name) = N{schema_literal})
        BEGIN
            BEGIN TRY
                EXEC (N'CREATE SCHEMA ' + N{schema_literal})
            END TRY
            BEGIN CATCH
                IF ERROR_NUMBER() <> 2714 THROW
            END CATCH
        END""",
    "create_queue": _create_if_missing("queue", _QUEUE_DDL),
    "create_retry_table": _create_if_missing("retry", _RETRY_DDL),
    "create_ledger_table": _create_if_missing("ledger", _LEDGER_DDL),
    "create_counters_table": _create_if_missing("counters", _COUNTERS_DDL),
    "create_event_types_table": _create_if_missing("event_types", _EVENT_TYPES_DDL),
    "create_destination_states_table": _create_if_missing(
        "destination_states", _DESTINATION_STATES_DDL
    ),
    # The transport's peek (6.2+): rows other receivers hold are skipped, not waited for.
    "peek": """
        SELECT COALESCE(MAX(RowVersion) - MIN(RowVersion) + 1, 0)
        FROM {queue} WITH (READPAST, READCOMMITTEDLOCK)""",
    # The transport's receive, TOP(?) rows at a time instead of one.
    "receive_batch": f"""
        WITH message AS (
            SELECT TOP (?) * FROM {{queue}} WITH (UPDLOCK, READPAST, ROWLOCK)
            ORDER BY RowVersion)
        DELETE FROM message
        OUTPUT deleted.Id, {_EXPIRED_QUEUE} AS expired, deleted.Expires, deleted.Headers,
               deleted.Body, deleted.RowVersion AS seq""",
    # A bulk drain's claim: the receive inside one RowVersion range; the caller binds (first,
    # last, limit) as for the other dialects, hence the variables.
    "receive_range": f"""
        DECLARE @first bigint = ?, @last bigint = ?, @limit int = ?;
        WITH message AS (
            SELECT TOP (@limit) * FROM {{queue}} WITH (UPDLOCK, READPAST, ROWLOCK)
            WHERE RowVersion BETWEEN @first AND @last
            ORDER BY RowVersion)
        DELETE FROM message
        OUTPUT deleted.Id, {_EXPIRED_QUEUE} AS expired, deleted.Expires, deleted.Headers,
               deleted.Body, deleted.RowVersion AS seq""",
    "queue_seq_bounds": """
        SELECT MIN(RowVersion), MAX(RowVersion), COUNT_BIG(*) FROM {queue} WITH (READPAST)""",
    # The transport's send with Recoverable = 1; tables without that column get the variants
    # in WITHOUT_RECOVERABLE. CorrelationId and ReplyToAddress stay NULL, as since 7.0.
    "send": f"""
        INSERT INTO {{queue}} (Id, Recoverable, Expires, Headers, Body)
        VALUES (?, 1, ?, {_HEADERS}, {_BODY})""",
    "send_many": "INSERT INTO {queue} (Id, Recoverable, Expires, Headers, Body) VALUES {rows}",
    "send_row": f"(?, 1, ?, {_HEADERS}, {_BODY})",
    "dead_letter": f"""
        INSERT INTO {{queue}} (Id, Recoverable, Expires, Headers, Body)
        VALUES (?, 1, NULL, {_HEADERS}, {_BODY})""",
    "retry_store": f"""
        INSERT INTO {{retry}} (id, forwarder, destination, destination_database, expires,
                             headers, body, attempts, first_failure_at, next_attempt_at,
                             last_error)
        VALUES (?, ?, ?, ?, ?, {_HEADERS}, {_BODY}, ?, ?, ?, {_HEADERS})""",
    # TOP must come first, the caller binds (forwarder, due by, '|waiting|databases|', give up
    # by, limit): hence the variables. Messages for a database waiting out an outage stay put
    # unless they waited past the give-up time or expired.
    "retry_claim_due": f"""
        DECLARE @forwarder nvarchar(200) = ?, @due_by datetime2 = ?, @waiting nvarchar(max) = ?,
                @give_up_by datetime2 = ?, @limit int = ?;
        WITH due AS (
            SELECT TOP (@limit) * FROM {{retry}} WITH (UPDLOCK, READPAST, ROWLOCK)
            WHERE forwarder = @forwarder AND next_attempt_at <= @due_by
              AND (destination_database IS NULL
                   OR CHARINDEX(N'|' + destination_database + N'|', @waiting) = 0
                   OR first_failure_at <= @give_up_by OR expires <= SYSUTCDATETIME())
            ORDER BY next_attempt_at, seq)
        DELETE FROM due
        OUTPUT deleted.id, {_EXPIRED_RETRY} AS expired, deleted.expires, deleted.headers,
               deleted.body, deleted.seq, deleted.attempts, deleted.first_failure_at,
               deleted.last_error""",
    "retry_summary": """
        SELECT r.destination, COUNT(*), MIN(r.first_failure_at), MIN(r.next_attempt_at),
               MAX(r.attempts),
               (SELECT TOP (1) r2.last_error FROM {retry} AS r2
                WHERE r2.forwarder = r.forwarder AND r2.destination = r.destination
                ORDER BY r2.seq DESC)
        FROM {retry} AS r WHERE r.forwarder = ?
        GROUP BY r.forwarder, r.destination ORDER BY r.destination""",
    # No ON CONFLICT in T-SQL: insert what is not there yet. UPDLOCK + HOLDLOCK lock the key
    # range, so a second daemon recording the same key waits for the first to commit and then
    # finds it, instead of both inserting (the primary key would stop that too, as an error).
    "ledger_record": """
        INSERT INTO {ledger} (message_id, destination, forwarded_at)
        SELECT v.message_id, v.destination, SYSUTCDATETIME()
        FROM (VALUES (?, ?)) AS v (message_id, destination)
        WHERE NOT EXISTS (
            SELECT 1 FROM {ledger} AS l WITH (UPDLOCK, HOLDLOCK)
            WHERE l.message_id = v.message_id AND l.destination = v.destination)""",
    "ledger_record_many": """
        INSERT INTO {ledger} (message_id, destination, forwarded_at)
        OUTPUT inserted.message_id, inserted.destination
        SELECT v.message_id, v.destination, SYSUTCDATETIME()
        FROM (VALUES {rows}) AS v (message_id, destination)
        WHERE NOT EXISTS (
            SELECT 1 FROM {ledger} AS l WITH (UPDLOCK, HOLDLOCK)
            WHERE l.message_id = v.message_id AND l.destination = v.destination)""",
    "ledger_record_row": "(?, ?)",
    "ledger_cleanup": "DELETE FROM {ledger} WHERE forwarded_at < ?",
    "counters_add": """
        MERGE {counters} WITH (HOLDLOCK) AS c
        USING (SELECT ? AS forwarder, ? AS counter, ? AS slot, ? AS value) AS v
        ON c.forwarder = v.forwarder AND c.counter = v.counter AND c.slot = v.slot
        WHEN MATCHED THEN UPDATE SET value = c.value + v.value
        WHEN NOT MATCHED THEN INSERT (forwarder, counter, slot, value)
            VALUES (v.forwarder, v.counter, v.slot, v.value);""",
    "counters_read": """
        SELECT counter, SUM(value) FROM {counters} WHERE forwarder = ?
        GROUP BY counter ORDER BY counter""",
    # NServiceBus's own subscriber lookup in its `SubscriptionRouting` table (native
    # publish/subscribe).
    "subscribers_many": "SELECT DISTINCT QueueAddress FROM {subscriptions} WHERE Topic IN ({rows})",
    "subscribers_row": "?",
    "event_type_seen": f"""
        MERGE {{event_types}} WITH (HOLDLOCK) AS e
        USING (SELECT ? AS forwarder, ? AS event_type, ? AS last_seen_at,
                      {_HEADERS} AS subscribers) AS v
        ON e.forwarder = v.forwarder AND e.event_type = v.event_type
        WHEN MATCHED THEN UPDATE SET last_seen_at = v.last_seen_at, subscribers = v.subscribers
        WHEN NOT MATCHED THEN INSERT (forwarder, event_type, last_seen_at, subscribers)
            VALUES (v.forwarder, v.event_type, v.last_seen_at, v.subscribers);""",
    "event_types_read": """
        SELECT event_type, last_seen_at, subscribers FROM {event_types} WHERE forwarder = ?
        ORDER BY event_type""",
    # SQL Server has no RELEASE SAVEPOINT: a savepoint lives until the transaction ends, and
    # ROLLBACK TRANSACTION goes back to the latest one of that name.
    "retry_add_destination_database": """
        IF COL_LENGTH({retry_literal}, 'destination_database') IS NULL
            ALTER TABLE {retry} ADD destination_database nvarchar(200) NULL""",
    "retry_waiting": """
        SELECT destination_database, COUNT(*), MIN(next_attempt_at) FROM {retry}
        WHERE destination_database IS NOT NULL GROUP BY destination_database""",
    "destination_state_save": """
        DECLARE @database nvarchar(200) = ?, @state nvarchar(20) = ?, @since datetime2 = ?,
                @last_error nvarchar(max) = ?, @next_probe_at datetime2 = ?,
                @updated_at datetime2 = ?, @reported_by nvarchar(200) = ?;
        UPDATE {destination_states} WITH (UPDLOCK, HOLDLOCK)
        SET state = @state, since = @since, last_error = @last_error,
            next_probe_at = @next_probe_at, updated_at = @updated_at, reported_by = @reported_by
        WHERE destination_database = @database;
        IF @@ROWCOUNT = 0
            INSERT INTO {destination_states} (destination_database, state, since, last_error,
                                              next_probe_at, updated_at, reported_by)
            VALUES (@database, @state, @since, @last_error, @next_probe_at, @updated_at,
                    @reported_by)""",
    "destination_states_read": """
        SELECT destination_database, state, since, last_error, next_probe_at, updated_at,
               reported_by
        FROM {destination_states} ORDER BY destination_database""",
    "table_probe": "SELECT 1 FROM {table} WHERE 1 = 0",
    "retry_read": """
        SELECT destination, attempts, first_failure_at, last_error FROM {retry}
        WHERE forwarder = ?""",
    "queue_read_headers": "SELECT Headers FROM {queue} WITH (READPAST)",
    "ledger_read_since": """
        SELECT message_id, destination, forwarded_at FROM {ledger} WHERE forwarded_at >= ?""",
    # CREATE TABLE in the database and ALTER on the schema, as CREATE TABLE needs.
    "can_create_tables": """
        SELECT CASE WHEN HAS_PERMS_BY_NAME(NULL, NULL, 'CREATE TABLE') = 1
                     AND HAS_PERMS_BY_NAME(?, 'SCHEMA', 'ALTER') = 1 THEN 1 ELSE 0 END""",
    "savepoint": "SAVE TRANSACTION sfbridge_local",
    "rollback_to_savepoint": "ROLLBACK TRANSACTION sfbridge_local",
    "release_savepoint": "",
    # Status reads skip rows that in-flight batches hold rather than wait for them.
    "queue_count": "SELECT COUNT_BIG(*) FROM {queue} WITH (READPAST)",
    "queue_oldest_headers": """
        SELECT TOP (1) Headers FROM {queue} WITH (READPAST) ORDER BY RowVersion""",
    # The catalog views of the queue's catalog (the connection's database without one).
    "list_tables": """
        SELECT s.name, t.name FROM {queue_catalog}sys.tables AS t
        JOIN {queue_catalog}sys.schemas AS s ON s.schema_id = t.schema_id""",
    "table_columns": """
        SELECT LOWER(c.name), ty.name
        FROM {queue_catalog}sys.columns AS c
        JOIN {queue_catalog}sys.types AS ty ON ty.user_type_id = c.user_type_id
        JOIN {queue_catalog}sys.tables AS t ON t.object_id = c.object_id
        JOIN {queue_catalog}sys.schemas AS s ON s.schema_id = t.schema_id
        WHERE s.name = ? AND t.name = ?""",
    # One row per index: its name and "<kind> (<key columns>)[ where <filter>]", lower case,
    # e.g. "nonclustered (expires) where ([expires] is not null)".
    "table_indexes": """
        SELECT i.name,
               LOWER(i.type_desc) + ' ('
               + STRING_AGG(LOWER(c.name), ', ') WITHIN GROUP (ORDER BY ic.key_ordinal) + ')'
               + COALESCE(' where ' + LOWER(MAX(i.filter_definition)), '')
        FROM {queue_catalog}sys.indexes AS i
        JOIN {queue_catalog}sys.tables AS t ON t.object_id = i.object_id
        JOIN {queue_catalog}sys.schemas AS s ON s.schema_id = t.schema_id
        JOIN {queue_catalog}sys.index_columns AS ic
            ON ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal > 0
        JOIN {queue_catalog}sys.columns AS c
            ON c.object_id = ic.object_id AND c.column_id = ic.column_id
        WHERE s.name = ? AND t.name = ?
        GROUP BY i.index_id, i.name, i.type_desc""",
}

# The writes into a queue table that has no `Recoverable` column.
WITHOUT_RECOVERABLE: dict[str, str] = {
    "send": f"""
        INSERT INTO {{queue}} (Id, Expires, Headers, Body)
        VALUES (?, ?, {_HEADERS}, {_BODY})""",
    "send_many": "INSERT INTO {queue} (Id, Expires, Headers, Body) VALUES {rows}",
    "send_row": f"(?, ?, {_HEADERS}, {_BODY})",
    "dead_letter": f"""
        INSERT INTO {{queue}} (Id, Expires, Headers, Body)
        VALUES (?, NULL, {_HEADERS}, {_BODY})""",
}

# -1: no such table; otherwise how many `Recoverable` columns it has (0 or 1). Parameters:
# the qualified name, twice. The transport asks the same of `[catalog].sys.columns`.
RECOVERABLE_LOOKUP = """
    SELECT CASE WHEN OBJECT_ID(?, N'U') IS NULL THEN -1 ELSE (
        SELECT COUNT(*) FROM {catalog}sys.columns
        WHERE object_id = OBJECT_ID(?, N'U') AND name = N'Recoverable') END"""

# Parameters: the qualified name, three times.
PERMISSIONS_QUERY = """
    SELECT HAS_PERMS_BY_NAME(?, N'OBJECT', N'SELECT'), HAS_PERMS_BY_NAME(?, N'OBJECT', N'INSERT'),
           HAS_PERMS_BY_NAME(?, N'OBJECT', N'DELETE')"""

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

# Errors that show a remembered queue shape is stale: 207 invalid column name (Recoverable was
# dropped), 515 NULL into a NOT NULL column (Recoverable was added).
_STALE_SHAPE_ERRORS = frozenset({207, 515})


def _catalog_prefix(address: QueueAddress) -> str:
    return GRAMMAR.quote_identifier(address.catalog) + "." if address.catalog else ""


class RecoverableColumn:
    """Whether a queue table still has the legacy `Recoverable` column: the variants to use.

    The transport looks this up once per table since 7.0: an endpoint may have dropped the
    column, and an INSERT naming it would then fail. A send that fails with error 207 or 515
    about `Recoverable` means the table changed since. Pure: the data path's QueueWriter runs
    the lookup and remembers the answer.
    """

    def lookup(self, queue: QueueAddress) -> tuple[str, tuple[Any, ...]]:
        qualified = GRAMMAR.qualified_name(queue)
        return RECOVERABLE_LOOKUP.format(catalog=_catalog_prefix(queue)), (qualified, qualified)

    def variants(self, rows: Sequence[Row]) -> Mapping[str, str] | None:
        found = int(rows[0][0]) if rows and rows[0][0] is not None else -1
        if found < 0:
            return None  # no such table (yet): the INSERT itself reports it
        return {} if found > 0 else WITHOUT_RECOVERABLE

    def is_stale(self, error: DatabaseError) -> bool:
        return error.native_error in _STALE_SHAPE_ERRORS and "recoverable" in error.detail.lower()


def inspect_queue_table(
    connection: Connection,
    queue: QueueAddress,
    columns: Mapping[str, str],
    indexes: Sequence[str],
) -> list[str]:
    """What the transport warns about at startup (a CLUSTERED RowVersion index, no index on
    Expires, a non-Unicode Headers column), plus missing permissions."""
    problems: list[str] = []
    qualified = GRAMMAR.qualified_name(queue)
    definitions = [definition.lower() for definition in indexes]
    clustered = any(d.startswith("clustered (rowversion") for d in definitions)
    nonclustered = any(d.startswith("nonclustered (rowversion") for d in definitions)
    if clustered and not nonclustered:
        problems.append(
            "its RowVersion index is CLUSTERED, so every receiver contends for the same page "
            "(PAGELATCH_EX); since transport 6.0.1 it is NONCLUSTERED: re-create Index_RowVersion "
            "as in NServiceBus's 'non-clustered index' upgrade guide"
        )
    if not any(d.split(" (", 1)[-1].startswith("expires") for d in definitions):
        problems.append(
            "it has no index on Expires, so purging expired messages scans the table: "
            f"CREATE NONCLUSTERED INDEX [Index_Expires] ON {qualified} (Expires) "
            "INCLUDE (Id, RowVersion) WHERE Expires IS NOT NULL"
        )
    if columns.get("headers") in ("varchar", "text", "char"):
        problems.append(
            f"its Headers column is {columns['headers']}, which loses header text outside the "
            f"database's code page: ALTER TABLE {qualified} ALTER COLUMN Headers "
            "nvarchar(max) NOT NULL"
        )
    rows = connection.query(PERMISSIONS_QUERY, (qualified, qualified, qualified))
    connection.commit()
    granted = rows[0] if rows else (None, None, None)
    missing = [
        permission
        for permission, allowed in zip(("SELECT", "INSERT", "DELETE"), granted, strict=True)
        if allowed != 1
    ]
    if missing:
        problems.append(
            f"the bridge's login lacks {', '.join(missing)} permission on it: "
            f"GRANT {', '.join(missing)} ON {qualified} TO <the bridge's user>"
        )
    return problems


def _decode_id(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def _naive_utc(value: datetime | None) -> datetime | None:
    # datetime / datetime2 hold UTC wall-clock time; bind naive UTC datetimes.
    if value is not None and value.tzinfo is not None:
        raise ValueError("timestamps must be naive UTC")
    return value


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


def _numbers(kind: type[DatabaseError], *numbers: int) -> dict[int, type[DatabaseError]]:
    return dict.fromkeys(numbers, kind)


# SQL Server error numbers, where they say more than the SQLSTATE (23000 is every integrity
# violation; FreeTDS reports many errors as 42000); the ODBC driver raises the mapped type.
NATIVE_ERRORS: NativeErrors = {
    # 208: invalid object name; 911: database (catalog) does not exist.
    **_numbers(QueueNotFound, 208, 911),
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
    # 1205: deadlock victim; 1222: lock request timed out; 40197, 40501, 40613: Azure SQL's
    # "try again".
    **_numbers(TransientDatabaseError, 1205, 1222, 40197, 40501, 40613),
}


def connect(database: DatabaseConfig, *, create: bool = False) -> Connection:
    """An ODBC connection with FreeTDS's options added, `SESSION_SETUP` run, the server's error
    numbers mapped by `NATIVE_ERRORS`, and the row-count-only results of batches skipped.
    `create` has no effect: a server database is never created by the bridge. Raises
    ConnectionFailed."""
    assert database.connection is not None
    return OdbcConnection(
        database.name,
        sqlserver_connection_string(database.connection),
        timeout=database.connect_timeout,
        session_setup=SESSION_SETUP,
        native_errors=NATIVE_ERRORS,
        drain_extra_results=True,
    )


DIALECT = Dialect(
    name="sqlserver",
    title="SQL Server",
    grammar=GRAMMAR,
    connect=connect,
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
    decode_id=_decode_id,
    encode_timestamp=_naive_utc,
    decode_timestamp=_decode_timestamp,
    queue_shapes=RecoverableColumn(),
    inspect_queue_table=inspect_queue_table,
)
