"""SQLite: the SQL Server transport's queue table shape in an embedded file, through the
standard library's sqlite3.

- Addresses are the bare table name (SQLite has no schemas); SQL Server addresses
  (`table@[schema]@[catalog]`) are accepted and reduced to their table, so a SQLite database
  can stand in for a SQL Server one without rewriting addresses.
- Queue tables have the SQL Server transport's columns (`Id`, `CorrelationId`,
  `ReplyToAddress`, `Recoverable`, `Expires`, `Headers`, `Body`, `RowVersion`). Times are
  stored as UTC text `YYYY-MM-DD HH:MM:SS.ffffff`, which sorts and compares correctly as text
  against `strftime('%Y-%m-%d %H:%M:%f', 'now')`.
- SQLite serialises writers, so each forwarder gets one worker (`single_writer`), and a
  connection is opened per delivery (an open handle would keep writing into a file that was
  moved away).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from bridge.addressing import TableAddress, check_table
from bridge.dialects.base import ConfiguredDatabase, Dialect
from bridge.dialects.base.statements import BASE_STATEMENTS
from bridge.dialects.sqlserver import GRAMMAR as SQLSERVER_GRAMMAR
from bridge.drivers.base import Connection
from bridge.drivers.sqlite import SqliteConnection
from bridge.exceptions import AddressError

# --------------------------------------------------------------------------------------------
# Queue addresses
# --------------------------------------------------------------------------------------------


class SqliteGrammar:
    """The bare table name; SQL Server addresses are accepted and reduced to their table."""

    dialect: str = "sqlite"
    # SQLite compares table names without (ASCII) case.
    names_ignore_case: bool = True

    def parse(self, text: str) -> TableAddress:
        if "@" in text:
            # Lets a SQLite database stand in for a SQL Server one without rewriting addresses.
            table = SQLSERVER_GRAMMAR.parse(text).table
        else:
            table = text
            check_table(table, text)
        return TableAddress(table)

    def resolve(
        self, address: TableAddress, default_schema: str | None, default_catalog: str | None
    ) -> TableAddress:
        resolved = TableAddress(address.table)
        self._validate(resolved, address)
        return resolved

    def render(self, address: TableAddress) -> str:
        self._validate(address, address)
        return address.table

    def qualified_name(self, address: TableAddress) -> str:
        self._validate(address, address)
        return self.quote_identifier(address.table)

    def quote_identifier(self, name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    @staticmethod
    def _validate(address: TableAddress, source: object) -> None:
        check_table(address.table, source)
        if "@" in address.table:
            # parse() treats any `@` as the start of SQL Server syntax, so it would not round-trip.
            raise AddressError(
                f"table name {address.table!r} contains '@', which the SQLite address grammar "
                f"reserves for SQL Server form (address {source!r})"
            )


GRAMMAR = SqliteGrammar()

# --------------------------------------------------------------------------------------------
# SQL
# --------------------------------------------------------------------------------------------

_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
# Not `CASE WHEN Expires IS NULL ...`: SQLite 3.40 evaluates `IS NULL` wrongly inside the
# RETURNING clause of these tables (it answered 0 for a NULL Expires, so every message
# looked expired). The comparison yields NULL for NULL, which coalesce turns into 0.
# What a row weighs for a batch's byte budget: its body's bytes and its headers' characters
# (bytes for ASCII). length() of a stored value is read from the record header, without
# loading the value; a CAST would read every candidate's body.
_SIZE = "COALESCE(length(Body), 0) + COALESCE(length(Headers), 0)"
_EXPIRED = f"coalesce(Expires <= {_NOW}, 0)"

# A row `errors summary` groups in the database (see "error_queue_groups" below); CASE, so
# that json_each never sees text that is not JSON.
_READABLE = """CASE
    WHEN coalesce(json_valid(Headers), 0) = 0 OR json_type(Headers) <> 'object' THEN 0
    WHEN length(Id) <> 36 OR length(replace(Id, '-', '')) <> 32
         OR lower(replace(Id, '-', '')) GLOB '*[^0-9a-f]*' THEN 0
    WHEN lower(Headers) GLOB '*\\u0000*' OR lower(Headers) GLOB '*\\ud[89abcdef]*' THEN 0
    ELSE (SELECT count(*) = count(DISTINCT key)
              AND coalesce(sum(type NOT IN ('text', 'null')), 0) = 0
          FROM json_each(Headers))
    END"""

STATEMENTS: dict[str, str] = {
    **BASE_STATEMENTS,
    "create_schema": "",  # SQLite has no schemas
    "create_queue": """
        CREATE TABLE IF NOT EXISTS {queue} (
            Id TEXT NOT NULL,
            CorrelationId TEXT,
            ReplyToAddress TEXT,
            Recoverable INTEGER NOT NULL,
            Expires TEXT,
            Headers TEXT NOT NULL,
            Body BLOB,
            RowVersion INTEGER PRIMARY KEY AUTOINCREMENT
        );
        CREATE INDEX IF NOT EXISTS {queue_index_expires} ON {queue} (Expires)
            WHERE Expires IS NOT NULL""",
    # `sfbridge where` (see the PostgreSQL dialect). SQLite has no regular expressions to
    # index a MessageId in the headers by: retry storage is found by its Id with the index, by
    # a MessageId with a scan (a SQLite bridge's tables are small).
    "create_retry_lookup_index": """
        CREATE INDEX IF NOT EXISTS {retry_index_by_id} ON {retry} (id)""",
    "retry_find": """
        SELECT seq, id, forwarder, destination, destination_database, attempts,
               first_failure_at, next_attempt_at, last_error, headers
        FROM {retry} WHERE id = ? OR (? IS NOT NULL AND instr(headers, ?) > 0) ORDER BY seq""",
    "queue_find_id": """
        SELECT Id AS id, Headers AS headers, RowVersion AS seq FROM {queue} WHERE Id = ?""",
    "queue_find_headers": """
        SELECT Id AS id, Headers AS headers, RowVersion AS seq FROM {queue}
        WHERE Id = ? OR instr(Headers, ?) > 0 ORDER BY RowVersion""",
    "create_archive_table": """
        CREATE TABLE IF NOT EXISTS {archive} (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL,
            message_id TEXT,
            error_queue TEXT NOT NULL,
            archived_at TEXT NOT NULL,
            expires TEXT,
            headers TEXT NOT NULL,
            body BLOB
        );
        CREATE INDEX IF NOT EXISTS {archive_index_by_id} ON {archive} (id);
        CREATE INDEX IF NOT EXISTS {archive_index_by_message_id} ON {archive} (message_id);
        CREATE INDEX IF NOT EXISTS {archive_index_archived} ON {archive} (archived_at)""",
    "create_retry_table": """
        CREATE TABLE IF NOT EXISTS {retry} (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL,
            forwarder TEXT NOT NULL,
            destination TEXT NOT NULL,
            destination_database TEXT,
            expires TEXT,
            headers TEXT NOT NULL,
            body BLOB,
            attempts INTEGER NOT NULL,
            first_failure_at TEXT NOT NULL,
            next_attempt_at TEXT NOT NULL,
            last_error TEXT NOT NULL
        );
        CREATE INDEX IF NOT EXISTS {retry_index_due} ON {retry} (forwarder, next_attempt_at)""",
    "create_ledger_table": """
        CREATE TABLE IF NOT EXISTS {ledger} (
            message_id TEXT NOT NULL,
            destination TEXT NOT NULL,
            forwarded_at TEXT NOT NULL,
            PRIMARY KEY (message_id, destination)
        );
        CREATE INDEX IF NOT EXISTS {ledger_index_forwarded} ON {ledger} (forwarded_at)""",
    "create_counters_table": """
        CREATE TABLE IF NOT EXISTS {counters} (
            forwarder TEXT NOT NULL,
            counter TEXT NOT NULL,
            slot INTEGER NOT NULL,
            value INTEGER NOT NULL,
            PRIMARY KEY (forwarder, counter, slot)
        )""",
    # The caller holds BEGIN IMMEDIATE, so no other writer can see or take these rows.
    # Parameters: the row limit, then the byte budget (see PostgreSQL's receive_batch).
    "receive_batch": f"""
        DELETE FROM {{queue}} WHERE RowVersion IN (
            SELECT RowVersion FROM (
                SELECT RowVersion, sum(size) OVER (ORDER BY RowVersion
                                                   ROWS UNBOUNDED PRECEDING) - size AS before
                FROM (SELECT RowVersion, {_SIZE} AS size FROM {{queue}}
                      ORDER BY RowVersion LIMIT ?))
            WHERE before < ?)
        RETURNING Id, {_EXPIRED} AS expired, Expires, Headers, Body, RowVersion AS seq,
                  ReplyToAddress AS legacy_reply_to,
                  {_SIZE} AS claimed_size""",
    "receive_range": f"""
        DELETE FROM {{queue}} WHERE RowVersion IN (
            SELECT RowVersion FROM (
                SELECT RowVersion, sum(size) OVER (ORDER BY RowVersion
                                                   ROWS UNBOUNDED PRECEDING) - size AS before
                FROM (SELECT RowVersion, {_SIZE} AS size FROM {{queue}}
                      WHERE RowVersion BETWEEN ? AND ? ORDER BY RowVersion LIMIT ?))
            WHERE before < ?)
        RETURNING Id, {_EXPIRED} AS expired, Expires, Headers, Body, RowVersion AS seq,
                  ReplyToAddress AS legacy_reply_to,
                  {_SIZE} AS claimed_size""",
    "queue_seq_bounds": "SELECT min(RowVersion), max(RowVersion), count(*) FROM {queue}",
    "send": """
        INSERT INTO {queue} (Id, Recoverable, Expires, Headers, Body) VALUES (?, 1, ?, ?, ?)""",
    "dead_letter": """
        INSERT INTO {queue} (Id, Recoverable, Expires, Headers, Body) VALUES (?, 1, NULL, ?, ?)""",
    # Parameters as in PostgreSQL's: forwarder, due by, '|waiting|databases|', give up by, limit.
    "retry_claim_due": f"""
        DELETE FROM {{retry}} WHERE seq IN (
            SELECT seq FROM (
                SELECT seq, sum(size) OVER (ORDER BY next_attempt_at, seq
                                            ROWS UNBOUNDED PRECEDING) - size AS before
                FROM (SELECT seq, next_attempt_at, {_SIZE.lower()} AS size FROM {{retry}}
                      WHERE forwarder = ? AND next_attempt_at <= ?
                        AND (destination_database IS NULL
                             OR instr(?, '|' || destination_database || '|') = 0
                             OR first_failure_at <= ? OR expires <= {_NOW})
                      ORDER BY next_attempt_at, seq LIMIT ?))
            WHERE before < ?)
        RETURNING id, {_EXPIRED.replace("Expires", "expires")} AS expired, expires, headers, body,
                  seq, attempts, first_failure_at, last_error,
                  {_SIZE.lower()} AS claimed_size""",
    "retry_summary": """
        SELECT destination, count(*), min(first_failure_at), min(next_attempt_at),
               max(attempts),
               (SELECT r2.last_error FROM {retry} r2 WHERE r2.forwarder = r.forwarder
                  AND r2.destination = r.destination ORDER BY r2.seq DESC LIMIT 1),
               min(destination_database)
        FROM {retry} r WHERE forwarder = ? GROUP BY destination ORDER BY destination""",
    "ledger_record": f"""
        INSERT OR IGNORE INTO {{ledger}} (message_id, destination, forwarded_at)
        VALUES (?, ?, {_NOW})""",
    "ledger_record_many": """
        INSERT OR IGNORE INTO {ledger} (message_id, destination, forwarded_at) VALUES {rows}
        RETURNING message_id, destination""",
    "ledger_record_row": f"(?, ?, {_NOW})",
    "send_many": "INSERT INTO {queue} (Id, Recoverable, Expires, Headers, Body) VALUES {rows}",
    "send_row": "(?, 1, ?, ?, ?)",
    "create_event_types_table": """
        CREATE TABLE IF NOT EXISTS {event_types} (
            forwarder TEXT NOT NULL,
            event_type TEXT NOT NULL,
            last_seen_at TEXT NOT NULL,
            subscribers TEXT NOT NULL,
            PRIMARY KEY (forwarder, event_type)
        )""",
    "event_type_seen": """
        INSERT INTO {event_types} (forwarder, event_type, last_seen_at, subscribers)
        VALUES (?, ?, ?, ?) ON CONFLICT (forwarder, event_type)
        DO UPDATE SET last_seen_at = excluded.last_seen_at, subscribers = excluded.subscribers""",
    "counters_add": """
        INSERT INTO {counters} (forwarder, counter, slot, value) VALUES (?, ?, ?, ?)
        ON CONFLICT (forwarder, counter, slot) DO UPDATE SET value = value + excluded.value""",
    "counters_add_many": """
        INSERT INTO {counters} (forwarder, counter, slot, value) VALUES {rows}
        ON CONFLICT (forwarder, counter, slot) DO UPDATE SET value = value + excluded.value""",
    # No ADD COLUMN IF NOT EXISTS in SQLite: run only after `table_columns` shows it missing.
    "retry_add_destination_database": "ALTER TABLE {retry} ADD COLUMN destination_database TEXT",
    "create_destination_states_table": """
        CREATE TABLE IF NOT EXISTS {destination_states} (
            destination_database TEXT NOT NULL PRIMARY KEY,
            state TEXT NOT NULL,
            since TEXT NOT NULL,
            last_error TEXT,
            next_probe_at TEXT,
            updated_at TEXT NOT NULL,
            reported_by TEXT NOT NULL
        )""",
    "destination_state_save": """
        INSERT INTO {destination_states} (destination_database, state, since, last_error,
                                          next_probe_at, updated_at, reported_by)
        VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (destination_database) DO UPDATE SET
            state = excluded.state, since = excluded.since, last_error = excluded.last_error,
            next_probe_at = excluded.next_probe_at, updated_at = excluded.updated_at,
            reported_by = excluded.reported_by""",
    # Whether each daemon's batches of a forwarder succeed (`bridge.daemon.forwarder_health`), one
    # row per forwarder and daemon.
    "create_forwarder_states_table": """
        CREATE TABLE IF NOT EXISTS {forwarder_states} (
            forwarder TEXT NOT NULL,
            reported_by TEXT NOT NULL,
            state TEXT NOT NULL,
            since TEXT NOT NULL,
            failures INTEGER NOT NULL,
            last_error TEXT,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (forwarder, reported_by)
        )""",
    "forwarder_state_save": """
        INSERT INTO {forwarder_states} (forwarder, reported_by, state, since, failures,
                                        last_error, updated_at)
        VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (forwarder, reported_by) DO UPDATE SET
            state = excluded.state, since = excluded.since, failures = excluded.failures,
            last_error = excluded.last_error, updated_at = excluded.updated_at""",
    # Which daemons run on this forwarding database (`bridge.storage.daemons`): one row per
    # daemon process, its heartbeat, and whether it stopped cleanly.
    "create_daemons_table": """
        CREATE TABLE IF NOT EXISTS {daemons} (
            daemon TEXT NOT NULL PRIMARY KEY,
            host TEXT NOT NULL,
            pid INTEGER NOT NULL,
            started_at TEXT NOT NULL,
            heartbeat_at TEXT NOT NULL,
            heartbeat_seconds REAL NOT NULL,
            state TEXT NOT NULL,
            stopped_at TEXT,
            config_fingerprint TEXT,
            forwarders TEXT
        )""",
    # A daemons table made by an sfbridge before the daemons said what they serve (SQLite adds
    # one column per statement).
    "daemons_add_identity": """
        ALTER TABLE {daemons} ADD COLUMN config_fingerprint TEXT;
        ALTER TABLE {daemons} ADD COLUMN forwarders TEXT""",
    "daemon_save": """
        INSERT INTO {daemons} (daemon, host, pid, started_at, heartbeat_at,
                               heartbeat_seconds, state, stopped_at, config_fingerprint,
                               forwarders)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (daemon) DO UPDATE SET
            host = excluded.host, pid = excluded.pid, started_at = excluded.started_at,
            heartbeat_at = excluded.heartbeat_at, heartbeat_seconds = excluded.heartbeat_seconds,
            state = excluded.state, stopped_at = excluded.stopped_at,
            config_fingerprint = excluded.config_fingerprint, forwarders = excluded.forwarders""",
    # Pauses: destination_database '' pauses the whole forwarder. Pausing again keeps the time
    # the pause began and takes the new reason.
    "create_pauses_table": """
        CREATE TABLE IF NOT EXISTS {pauses} (
            forwarder TEXT NOT NULL,
            destination_database TEXT NOT NULL,
            paused_at TEXT NOT NULL,
            reason TEXT,
            PRIMARY KEY (forwarder, destination_database)
        )""",
    "pause_set": """
        INSERT INTO {pauses} (forwarder, destination_database, paused_at, reason)
        VALUES (?, ?, ?, ?) ON CONFLICT (forwarder, destination_database) DO UPDATE SET
            reason = excluded.reason""",
    # The error-queue tools (`sfbridge errors`); the caller holds BEGIN IMMEDIATE for the
    # claim and the delete, so no other writer can take the same rows.
    "error_queue_page": """
        SELECT Id AS id, Headers AS headers, RowVersion AS seq FROM {queue}
        WHERE RowVersion > ? ORDER BY RowVersion LIMIT ?""",
    "error_queue_row": """
        SELECT Id AS id, Expires AS expires, Headers AS headers, Body AS body,
               RowVersion AS seq
        FROM {queue} WHERE RowVersion = ?""",
    "error_queue_claim_many": """
        DELETE FROM {queue} WHERE RowVersion IN ({rows})
        RETURNING Id, 0 AS expired, Expires, Headers, Body, RowVersion AS seq,
                  ReplyToAddress AS legacy_reply_to""",
    "error_queue_delete_many": "DELETE FROM {queue} WHERE RowVersion IN ({rows})",
    # Error-queue counts per `NServiceBus.FailedQ` (see the PostgreSQL dialect); headers that
    # are not JSON count under NULL.
    "error_queue_failed_queues": """
        SELECT CASE WHEN json_valid(Headers)
                    THEN json_extract(Headers, '$."NServiceBus.FailedQ"') END AS failed_queue,
               count(*) AS messages
        FROM {queue} GROUP BY 1""",
    # `errors summary` and `errors list` (see bridge/dialects/postgresql/error_groups.py).
    # SQLite reads JSON without failing a statement, so one form does: a row is grouped when
    # its Headers are a JSON object of distinct keys with string or null values and no escape
    # that json_extract decodes otherwise than the tools (NUL, surrogates), and its Id is a
    # UUID (as the tools require of a row they replay); the tools read the others themselves.
    "error_queue_groups": f"""
        SELECT readable, failed_queue, value, other_value, count(*) AS messages,
               min(tof) FILTER (WHERE wire) AS first_failure,
               max(tof) FILTER (WHERE wire) AS last_failure,
               json_group_array(DISTINCT tof) FILTER (WHERE NOT wire) AS other_times,
               json_group_array(seq) FILTER (WHERE NOT readable) AS unreadable
        FROM (
            SELECT seq, readable, failed_queue, value, other_value, tof,
                   length(tof) = 28 AND substr(tof, -2) = ' Z' AS wire
            FROM (
                SELECT seq, readable,
                       CASE WHEN readable
                            THEN json_extract(h, '$."NServiceBus.FailedQ"') END AS failed_queue,
                       CASE WHEN readable THEN json_extract(h, '$."' || ? || '"') END AS value,
                       CASE WHEN readable
                            THEN json_extract(h, '$."' || ? || '"') END AS other_value,
                       CASE WHEN readable
                            THEN json_extract(h, '$."NServiceBus.TimeOfFailure"') END AS tof
                FROM (SELECT RowVersion AS seq, Headers AS h, {_READABLE} AS readable
                      FROM {{queue}}) AS checked) AS row_values) AS grouped
        GROUP BY readable, failed_queue, value, other_value""",
    "error_queue_read_many": """
        SELECT Id AS id, Headers AS headers, RowVersion AS seq FROM {queue}
        WHERE RowVersion IN ({rows})""",
    # The retry tools (see the PostgreSQL dialect) without its locks: SQLite has one writer at
    # a time, so a row a batch has taken is already gone when these run.
    "retry_due_now_many": """
        UPDATE {retry} SET next_attempt_at = first_failure_at WHERE seq IN ({rows})""",
    "retry_take_many": """
        DELETE FROM {retry} WHERE seq IN ({rows})
        RETURNING seq, id, forwarder, destination, expires, headers, body, attempts,
                  last_error""",
    "create_audit_table": """
        CREATE TABLE IF NOT EXISTS {audit} (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            recorded_at TEXT NOT NULL,
            operator TEXT NOT NULL,
            host TEXT NOT NULL,
            command TEXT NOT NULL,
            target TEXT NOT NULL,
            affected INTEGER NOT NULL
        )""",
    # The daemon's look for work (`Dialect.work_query`): whether a queue holds a row, and
    # when a forwarder's earliest retry is due. Parameters: the part's index (a forwarder).
    "work_queue": "SELECT ?, EXISTS (SELECT 1 FROM {queue}), NULL",
    "work_retry": "SELECT ?, 0, (SELECT min(next_attempt_at) FROM {retry} WHERE forwarder = ?)",
    # Reading a table in Spark tasks: see the PostgreSQL dialect.
    "queue_seq_boundaries": """
        SELECT RowVersion FROM (
            SELECT RowVersion, row_number() OVER (ORDER BY RowVersion) AS n FROM {queue})
        WHERE n % ? = 0 ORDER BY RowVersion""",
    "queue_page": """
        SELECT RowVersion AS seq, Id AS id, Headers AS headers FROM {queue}
        WHERE RowVersion > ? AND RowVersion <= ? ORDER BY RowVersion LIMIT ?""",
    "retry_seq_boundaries": """
        SELECT seq FROM (SELECT seq, row_number() OVER (ORDER BY seq) AS n FROM {retry}
                         WHERE forwarder = ?)
        WHERE n % ? = 0 ORDER BY seq""",
    "ledger_boundaries_since": """
        SELECT message_id, destination FROM (
            SELECT message_id, destination,
                   row_number() OVER (ORDER BY message_id, destination) AS n
            FROM {ledger} WHERE forwarded_at >= ?)
        WHERE n % ? = 0 ORDER BY message_id, destination""",
    # Whoever may write the file may create tables; the schema parameter is unused.
    "can_create_tables": "SELECT coalesce(?1, '') = coalesce(?1, '')",
    # No schemas, no grants: whoever may write the file may create tables in it.
    "can_create_schemas": "SELECT 1",
    "schema_exists": "SELECT coalesce(?1, '') = coalesce(?1, '')",
    "current_login": "SELECT '', 'main'",
    # A file the bridge opens is writable, or opening it fails; `PRAGMA query_only` aside.
    "read_only_reason": """
        SELECT CASE WHEN query_only THEN 'PRAGMA query_only is on' END FROM pragma_query_only""",
    # No grants: whoever may write the file may write every table (?1, the table, is unused).
    "can_insert": "SELECT coalesce(?1, '') = coalesce(?1, ''), NULL",
    "queue_oldest_headers": "SELECT Headers FROM {queue} ORDER BY RowVersion LIMIT 1",
    "list_tables": "SELECT NULL, name FROM sqlite_master WHERE type = 'table'",
    # pragma_table_info takes the table name as a value, so no quoting is involved.
    # Both take (schema, table) like the other dialects; SQLite has no schema, so ?1 is unused
    # but still referenced, because SQLite insists every bound parameter appears.
    "table_columns": """
        SELECT lower(name), type FROM pragma_table_info(?2)
        WHERE coalesce(?1, '') = coalesce(?1, '')""",
    "table_indexes": """
        SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ?2
        AND coalesce(?1, '') = coalesce(?1, '')""",
}
# SQLite reads any text as JSON without failing the statement: nothing to check first.
STATEMENTS["error_queue_groups_checked"] = STATEMENTS["error_queue_groups"]

_TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f"


def _encode_timestamp(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is not None:
        raise ValueError("timestamps must be naive UTC")
    return value.strftime(_TIMESTAMP_FORMAT)


def _decode_timestamp(value: Any) -> datetime | None:
    """Naive UTC, also from text an application wrote with an offset (SQLite columns are
    untyped, so `2099-01-01T00:00:00+00:00` is as possible as the transport's own format)."""
    if value is None:
        return None
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment


# --------------------------------------------------------------------------------------------
# Connections
# --------------------------------------------------------------------------------------------


def connect(database: ConfiguredDatabase, *, create: bool = False) -> Connection:
    """The database file through the standard library's sqlite3 (not ODBC: the SQLite ODBC
    driver drops the rows of `DELETE ... RETURNING`). A missing file is an unavailable
    database unless `create`. Raises ConnectionFailed."""
    assert database.path is not None
    return SqliteConnection(
        database.name, database.path, create=create, deadline=database.query_timeout
    )


DIALECT = Dialect(
    name="sqlite",
    title="SQLite",
    grammar=GRAMMAR,
    connect=connect,
    locator="path",
    has_schemas=False,
    single_writer=True,
    statements=STATEMENTS,
    queue_columns=frozenset(
        {
            "id",
            "correlationid",
            "replytoaddress",
            "recoverable",
            "expires",
            "headers",
            "body",
            "rowversion",
        }
    ),
    queue_indexed_columns=("expires",),
    keep_destination_connections=False,
    encode_id=str,
    decode_id=lambda value: uuid.UUID(str(value)),
    encode_timestamp=_encode_timestamp,
    decode_timestamp=_decode_timestamp,
    # SQLITE_MAX_VARIABLE_NUMBER's default since SQLite 3.32.
    max_parameters=32766,
    cannot_prepare="SQLite has no prepared (two-phase) transactions",
)
