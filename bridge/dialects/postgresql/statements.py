"""PostgreSQL's statements: what it says differently from the base (`BASE_STATEMENTS`), and
what only it has, by name."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from bridge.dialects.base.statements import BASE_STATEMENTS
from bridge.dialects.postgresql.error_groups import ERROR_GROUP_STATEMENTS

_NOW = "(now() AT TIME ZONE 'UTC')"
# What a row weighs for a batch's byte budget: its body and headers (lengths, which PostgreSQL
# reads without decompressing the values).
_SIZE = "COALESCE(octet_length(body), 0) + COALESCE(octet_length(headers), 0)"
# The same of a claimed row, returned with it: the batch knows it was cut by bytes, in the
# database's own measure.
_SIZE_OF = "COALESCE(octet_length({alias}body), 0) + COALESCE(octet_length({alias}headers), 0)"
_EXPIRED = (
    f"CASE WHEN {{alias}}expires IS NULL THEN 0 WHEN {{alias}}expires > {_NOW} THEN 0 ELSE 1 END"
)

# .NET's DateTime, from which NServiceBus writes Expires, spans the years 1 to 9999. A
# PostgreSQL timestamp also holds infinity, -infinity, BC dates and years up to 294276, which
# psycopg refuses to load and psqlODBC silently turns into other dates; a claim returns such a
# value as NULL, with its text beside it (`<column>_out_of_range`) to say what it was.
_IN_RANGE = "{column} BETWEEN '0001-01-01' AND '9999-12-31 23:59:59.999999'"


def _timestamp(column: str, name: str) -> str:
    in_range = _IN_RANGE.format(column=column)
    return (
        f"CASE WHEN {in_range} THEN {column} END AS {name}, "
        f"CASE WHEN NOT ({in_range}) THEN {column}::text END AS {name}_out_of_range"
    )


def _text(column: str, name: str, raw: bool) -> str:
    """A text column; `raw` returns its bytes as stored (`convert_to` into the database's own
    encoding converts nothing), for text the server cannot send in the client's encoding."""
    return f"convert_to({column}, getdatabaseencoding()) AS {name}" if raw else f"{column}"


# The claims, destructive and uncommitted: rows are deleted with row locks that skip what other
# receivers hold. ARRAY(...) evaluates the locking subquery exactly once; a plain IN or USING
# join can re-evaluate it under SKIP LOCKED and return more rows than the limit. Parameters end
# with the row limit, then the byte budget: rows are taken in order while the bytes before them
# are under it, so the first always goes. Rows locked but not taken stay locked until the batch
# commits, and other receivers skip them meanwhile. Each has a `_raw` form
# (`bridge.forwarding.claim`).   receive_batch: the head of the queue.
#   receive_range: a bulk drain's share, rows whose sequence lies in (first, last).
#   retry_claim_due: due retries of a forwarder (forwarder, due by, the databases waiting out
#     an outage as '|a|b|', whose messages stay put unless they waited past the give-up time
#     or expired, give up by).
CLAIM_STATEMENTS = ("receive_batch", "receive_range", "retry_claim_due")


def _claim(name: str, *, raw: bool = False) -> str:
    if name == "retry_claim_due":
        table, alias, order = "{retry}", "r.", "next_attempt_at, seq"
        where = f"""WHERE forwarder = ? AND next_attempt_at <= ?
                        AND (destination_database IS NULL
                             OR strpos(?, '|' || destination_database || '|') = 0
                             OR first_failure_at <= ? OR expires <= {_NOW})"""
        extra = (
            f", r.attempts, {_timestamp('r.first_failure_at', 'first_failure_at')}, "
            f"{_text('r.last_error', 'last_error', raw)}"
        )
        candidates = f"seq, next_attempt_at, {_SIZE.lower()} AS size"
    else:
        table, alias, order, extra = "{queue}", "q.", "seq", ""
        where = "WHERE seq BETWEEN ? AND ?" if name == "receive_range" else ""
        candidates = f"seq, {_SIZE} AS size"
    return f"""
        DELETE FROM {table} AS {alias[0]}
        WHERE {alias}seq = ANY(ARRAY(
            SELECT seq FROM (
                SELECT seq, sum(size) OVER (ORDER BY {order} ROWS UNBOUNDED PRECEDING) - size
                       AS before
                FROM (SELECT {candidates} FROM {table} {where}
                      ORDER BY {order} LIMIT ? FOR UPDATE SKIP LOCKED) AS locked
            ) AS sized WHERE before < ?))
        RETURNING {alias}id, {_EXPIRED.format(alias=alias)} AS expired,
                  {_timestamp(f"{alias}expires", "expires")},
                  {_text(f"{alias}headers", "headers", raw)}, {alias}body, {alias}seq{extra},
                  {_SIZE_OF.format(alias=alias)} AS claimed_size"""


# The `NServiceBus.MessageId` in a Headers text (a JSON string without escapes), or NULL:
# never an error, so an index on it cannot fail an insert whatever a row holds (a cast to
# jsonb would). `sfbridge where` finds retry storage's rows by it.
_MESSAGE_ID = r"""substring(headers from '"NServiceBus\.MessageId"\s*:\s*"([^"\\]*)"')"""

STATEMENTS: dict[str, str] = {
    **BASE_STATEMENTS,
    # `sfbridge where` (`bridge.storage.whereabouts`): indexed lookups in the bridge's tables,
    # and in a queue table by its key or, reading every row's headers, by MessageId.
    "create_retry_lookup_index": f"""
        CREATE INDEX IF NOT EXISTS {{retry_index_by_id}} ON {{retry}} (id);
        CREATE INDEX IF NOT EXISTS {{retry_index_by_message_id}} ON {{retry}} (({_MESSAGE_ID}))""",
    "retry_find": f"""
        SELECT seq, id, forwarder, destination, destination_database, attempts,
               first_failure_at, next_attempt_at, last_error, headers
        FROM {{retry}} WHERE id = ? OR ({_MESSAGE_ID} = ? AND strpos(headers, ?) > 0)
        ORDER BY seq""",
    "queue_find_id": "SELECT id, headers, seq FROM {queue} WHERE id = ?",
    "queue_find_headers": """
        SELECT id, headers, seq FROM {queue} WHERE id = ? OR strpos(headers, ?) > 0
        ORDER BY seq""",
    "create_archive_table": """
        CREATE TABLE IF NOT EXISTS {archive} (
            seq bigserial PRIMARY KEY,
            id varchar(200) NOT NULL,
            message_id varchar(200),
            error_queue varchar(1000) NOT NULL,
            archived_at timestamp NOT NULL,
            expires timestamp,
            headers text NOT NULL,
            body bytea
        );
        CREATE INDEX IF NOT EXISTS {archive_index_by_id} ON {archive} (id);
        CREATE INDEX IF NOT EXISTS {archive_index_by_message_id} ON {archive} (message_id);
        CREATE INDEX IF NOT EXISTS {archive_index_archived} ON {archive} (archived_at)""",
    "create_schema": "CREATE SCHEMA IF NOT EXISTS {schema}",
    "create_queue": """
        CREATE TABLE IF NOT EXISTS {queue} (
            Id uuid NOT NULL PRIMARY KEY,
            Expires timestamp,
            Headers text NOT NULL,
            Body bytea,
            Seq serial NOT NULL UNIQUE
        )""",
    "create_retry_table": """
        CREATE TABLE IF NOT EXISTS {retry} (
            seq bigserial PRIMARY KEY,
            id uuid NOT NULL,
            forwarder varchar(200) NOT NULL,
            destination text NOT NULL,
            destination_database varchar(200),
            expires timestamp,
            headers text NOT NULL,
            body bytea,
            attempts integer NOT NULL,
            first_failure_at timestamp NOT NULL,
            next_attempt_at timestamp NOT NULL,
            last_error text NOT NULL
        );
        CREATE INDEX IF NOT EXISTS {retry_index_due} ON {retry} (forwarder, next_attempt_at)""",
    # The key compares bytes (`COLLATE "C"`): every message recorded is an insert into its
    # index, and the database's locale (strcoll, ICU) made each comparison several times
    # dearer. Equality, all the ledger needs, is the same under any deterministic collation.
    "create_ledger_table": """
        CREATE TABLE IF NOT EXISTS {ledger} (
            message_id varchar(200) COLLATE "C" NOT NULL,
            destination varchar(1000) COLLATE "C" NOT NULL,
            forwarded_at timestamp NOT NULL,
            PRIMARY KEY (message_id, destination)
        );
        CREATE INDEX IF NOT EXISTS {ledger_index_forwarded} ON {ledger} (forwarded_at)""",
    "create_counters_table": """
        CREATE TABLE IF NOT EXISTS {counters} (
            forwarder varchar(200) NOT NULL,
            counter varchar(100) NOT NULL,
            slot integer NOT NULL,
            value bigint NOT NULL,
            PRIMARY KEY (forwarder, counter, slot)
        )""",
    **{name: _claim(name) for name in CLAIM_STATEMENTS},
    **{f"{name}_raw": _claim(name, raw=True) for name in CLAIM_STATEMENTS},
    "queue_seq_bounds": "SELECT min(seq), max(seq), count(*) FROM {queue}",
    "send": "INSERT INTO {queue} (id, expires, headers, body) VALUES (?, ?, ?, ?)",
    "dead_letter": "INSERT INTO {queue} (id, expires, headers, body) VALUES (?, NULL, ?, ?)",
    "retry_summary": """
        SELECT destination, count(*), min(first_failure_at), min(next_attempt_at),
               max(attempts), (array_agg(last_error ORDER BY seq DESC))[1],
               min(destination_database)
        FROM {retry} WHERE forwarder = ? GROUP BY destination ORDER BY destination""",
    "ledger_record": f"""
        INSERT INTO {{ledger}} (message_id, destination, forwarded_at)
        VALUES (?, ?, {_NOW}) ON CONFLICT DO NOTHING""",
    # Multi-row forms: one round trip per batch instead of one per message. RETURNING lists
    # the (message, destination) pairs recorded now; the others were delivered before.
    "ledger_record_many": """
        INSERT INTO {ledger} (message_id, destination, forwarded_at) VALUES {rows}
        ON CONFLICT DO NOTHING RETURNING message_id, destination""",
    "ledger_record_row": f"(?, ?, {_NOW})",
    "send_many": "INSERT INTO {queue} (id, expires, headers, body) VALUES {rows}",
    # The same with one array per column (drivers that bind arrays): one text, prepared once.
    "send_many_arrays": """
        INSERT INTO {queue} (id, expires, headers, body)
        SELECT * FROM unnest(?::uuid[], ?::timestamp[], ?::text[], ?::bytea[])""",
    "ledger_record_many_arrays": f"""
        INSERT INTO {{ledger}} (message_id, destination, forwarded_at)
        SELECT message_id, destination, {_NOW}
        FROM unnest(?::varchar[], ?::varchar[]) AS pairs(message_id, destination)
        ON CONFLICT DO NOTHING RETURNING message_id, destination""",
    "send_row": "(?, ?, ?, ?)",
    # The same rows streamed in PostgreSQL's binary COPY format (drivers that stream rows):
    # no statement to plan or execute per row. COPY cannot skip a conflict, so the ledger's
    # form fails on a message recorded before and the writer falls back to
    # `ledger_record_many_arrays`, which can. Binary values are not cast: each batch first
    # reads the columns' types with the `*_copy_columns` query, which also locks the table
    # against a DROP until the transaction ends, and a table with other types (varchar ids,
    # a timestamptz) is written with the statements above.
    "send_copy": "COPY {queue} (id, expires, headers, body) FROM STDIN (FORMAT BINARY)",
    "send_copy_columns": "SELECT id, expires, headers, body FROM {queue} LIMIT 0",
    "ledger_record_copy": """
        COPY {ledger} (message_id, destination, forwarded_at) FROM STDIN (FORMAT BINARY)""",
    "ledger_record_copy_columns": """
        SELECT message_id, destination, forwarded_at FROM {ledger} LIMIT 0""",
    "create_event_types_table": """
        CREATE TABLE IF NOT EXISTS {event_types} (
            forwarder varchar(200) NOT NULL,
            event_type text NOT NULL,
            last_seen_at timestamp NOT NULL,
            subscribers text NOT NULL,
            PRIMARY KEY (forwarder, event_type)
        )""",
    "event_type_seen": """
        INSERT INTO {event_types} AS e (forwarder, event_type, last_seen_at, subscribers)
        VALUES (?, ?, ?, ?) ON CONFLICT (forwarder, event_type)
        DO UPDATE SET last_seen_at = EXCLUDED.last_seen_at, subscribers = EXCLUDED.subscribers""",
    "counters_add": """
        INSERT INTO {counters} AS c (forwarder, counter, slot, value) VALUES (?, ?, ?, ?)
        ON CONFLICT (forwarder, counter, slot) DO UPDATE SET value = c.value + EXCLUDED.value""",
    # All of a batch's counters in one round trip.
    "counters_add_many": """
        INSERT INTO {counters} AS c (forwarder, counter, slot, value) VALUES {rows}
        ON CONFLICT (forwarder, counter, slot) DO UPDATE SET value = c.value + EXCLUDED.value""",
    "retry_add_destination_database": """
        ALTER TABLE {retry} ADD COLUMN IF NOT EXISTS destination_database varchar(200)""",
    "create_destination_states_table": """
        CREATE TABLE IF NOT EXISTS {destination_states} (
            destination_database varchar(200) NOT NULL PRIMARY KEY,
            state varchar(20) NOT NULL,
            since timestamp NOT NULL,
            last_error text,
            next_probe_at timestamp,
            updated_at timestamp NOT NULL,
            reported_by varchar(200) NOT NULL
        )""",
    "destination_state_save": """
        INSERT INTO {destination_states} AS d (destination_database, state, since, last_error,
                                               next_probe_at, updated_at, reported_by)
        VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (destination_database) DO UPDATE SET
            state = EXCLUDED.state, since = EXCLUDED.since, last_error = EXCLUDED.last_error,
            next_probe_at = EXCLUDED.next_probe_at, updated_at = EXCLUDED.updated_at,
            reported_by = EXCLUDED.reported_by""",
    # Whether each daemon's batches of a forwarder succeed (`bridge.daemon.forwarder_health`), one
    # row per forwarder and daemon.
    "create_forwarder_states_table": """
        CREATE TABLE IF NOT EXISTS {forwarder_states} (
            forwarder varchar(200) NOT NULL,
            reported_by varchar(200) NOT NULL,
            state varchar(20) NOT NULL,
            since timestamp NOT NULL,
            failures bigint NOT NULL,
            last_error text,
            updated_at timestamp NOT NULL,
            PRIMARY KEY (forwarder, reported_by)
        )""",
    "forwarder_state_save": """
        INSERT INTO {forwarder_states} AS f (forwarder, reported_by, state, since, failures,
                                             last_error, updated_at)
        VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (forwarder, reported_by) DO UPDATE SET
            state = EXCLUDED.state, since = EXCLUDED.since, failures = EXCLUDED.failures,
            last_error = EXCLUDED.last_error, updated_at = EXCLUDED.updated_at""",
    # Which daemons run on this forwarding database (`bridge.storage.daemons`): one row per
    # daemon process, its heartbeat, and whether it stopped cleanly.
    "create_daemons_table": """
        CREATE TABLE IF NOT EXISTS {daemons} (
            daemon varchar(200) NOT NULL PRIMARY KEY,
            host varchar(200) NOT NULL,
            pid bigint NOT NULL,
            started_at timestamp NOT NULL,
            heartbeat_at timestamp NOT NULL,
            heartbeat_seconds double precision NOT NULL,
            state varchar(20) NOT NULL,
            stopped_at timestamp,
            config_fingerprint varchar(64),
            forwarders text
        )""",
    # A daemons table made by an sfbridge before the daemons said what they serve.
    "daemons_add_identity": """
        ALTER TABLE {daemons} ADD COLUMN IF NOT EXISTS config_fingerprint varchar(64),
                              ADD COLUMN IF NOT EXISTS forwarders text""",
    "daemon_save": """
        INSERT INTO {daemons} AS d (daemon, host, pid, started_at, heartbeat_at,
                                    heartbeat_seconds, state, stopped_at, config_fingerprint,
                                    forwarders)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (daemon) DO UPDATE SET
            host = EXCLUDED.host, pid = EXCLUDED.pid, started_at = EXCLUDED.started_at,
            heartbeat_at = EXCLUDED.heartbeat_at, heartbeat_seconds = EXCLUDED.heartbeat_seconds,
            state = EXCLUDED.state, stopped_at = EXCLUDED.stopped_at,
            config_fingerprint = EXCLUDED.config_fingerprint, forwarders = EXCLUDED.forwarders""",
    # The batches in flight on a queue: a claim's DELETE holds RowExclusiveLock on the table
    # from before its snapshot to its commit (senders' short INSERTs show too). to_regclass:
    # NULL, not an error, for a table not made yet.
    "in_flight_writers": """
        SELECT DISTINCT virtualtransaction FROM pg_locks
        WHERE locktype = 'relation' AND mode = 'RowExclusiveLock' AND granted
          AND pid <> pg_backend_pid()
          AND relation IN (to_regclass({queue_literal}), to_regclass({retry_literal}))""",
    # Pauses: destination_database '' pauses the whole forwarder. Pausing again keeps the time
    # the pause began and takes the new reason.
    "create_pauses_table": """
        CREATE TABLE IF NOT EXISTS {pauses} (
            forwarder varchar(200) NOT NULL,
            destination_database varchar(200) NOT NULL,
            paused_at timestamp NOT NULL,
            reason text,
            PRIMARY KEY (forwarder, destination_database)
        )""",
    "pause_set": """
        INSERT INTO {pauses} AS p (forwarder, destination_database, paused_at, reason)
        VALUES (?, ?, ?, ?) ON CONFLICT (forwarder, destination_database) DO UPDATE SET
            reason = EXCLUDED.reason""",
    # The error-queue tools (`sfbridge errors`): read a page of rows after a sequence value,
    # one row in full, and take or delete chosen rows by sequence value. A row another
    # transaction is taking is waited for and then, gone, not returned: each row is moved once.
    "error_queue_page": "SELECT id, headers, seq FROM {queue} WHERE seq > ? ORDER BY seq LIMIT ?",
    "error_queue_row": "SELECT id, expires, headers, body, seq FROM {queue} WHERE seq = ?",
    "error_queue_claim_many": """
        DELETE FROM {queue} WHERE seq IN ({rows})
        RETURNING id, 0 AS expired, expires, headers, body, seq""",
    "error_queue_delete_many": "DELETE FROM {queue} WHERE seq IN ({rows})",
    # Error-queue counts per queue a message failed in (`NServiceBus.FailedQ`), one grouped
    # read per error queue: the header's value as JSON writes it (escapes and all, hence the
    # column's name; `bridge.storage.error_counts` decodes it), found by pattern rather than
    # parsed, so that a row whose headers are not JSON counts (under NULL) instead of failing
    # the read. The pattern writes `"` as `\x22` and has no `?`: a quote or a question mark
    # in a literal would puzzle readers of the SQL (drivers looking for parameters).
    "error_queue_failed_queues": r"""
        SELECT substring(headers
                         FROM '\x22NServiceBus\.FailedQ\x22\s*:\s*\x22(([^\x22\\]|\\.)*)\x22')
               AS failed_queue_json,
               count(*) AS messages
        FROM {queue} GROUP BY 1""",
    # The retry tools (`sfbridge retries`, whose page is the base's): make chosen rows due at
    # once (their first failure's time: earlier than any daemon's clock reads, so no skew
    # delays them); take chosen rows. Both lock as the daemon's claim does and skip the rows a
    # batch holds, so a row is never handled by two at once.
    "retry_due_now_many": """
        UPDATE {retry} SET next_attempt_at = first_failure_at
        WHERE seq = ANY(ARRAY(
            SELECT seq FROM {retry} WHERE seq IN ({rows}) FOR UPDATE SKIP LOCKED))""",
    "retry_take_many": """
        DELETE FROM {retry}
        WHERE seq = ANY(ARRAY(
            SELECT seq FROM {retry} WHERE seq IN ({rows}) FOR UPDATE SKIP LOCKED))
        RETURNING seq, id, forwarder, destination, expires, headers, body, attempts,
                  last_error""",
    # Operator commands recorded (`bridge.storage.audit`): one row each.
    "create_audit_table": """
        CREATE TABLE IF NOT EXISTS {audit} (
            seq bigserial PRIMARY KEY,
            recorded_at timestamp NOT NULL,
            operator varchar(200) NOT NULL,
            host varchar(200) NOT NULL,
            command varchar(100) NOT NULL,
            target text NOT NULL,
            affected bigint NOT NULL
        )""",
    # The connections the server accepts from ordinary logins (PostgreSQL 16 also keeps
    # reserved_connections for some roles), those other clients hold now, and the server.
    "connection_limit": """
        SELECT current_setting('max_connections')::integer
                 - current_setting('superuser_reserved_connections')::integer
                 - coalesce(current_setting('reserved_connections', true)::integer, 0),
               (SELECT count(*) FROM pg_stat_activity
                WHERE backend_type = 'client backend'
                  AND coalesce(application_name, '') <> 'sfbridge'),
               coalesce(host(inet_server_addr()), 'local') || ':' || current_setting('port')""",
    # Where the connection landed and why it may not write there (`bridge.connections.
    # reached_server`): a standby in recovery refuses every write, and so does a session
    # whose transactions are read-only by default (what a failover in progress may look like).
    "server_role": """
        SELECT coalesce(host(inet_server_addr()), 'a local socket') || ':'
                 || coalesce(inet_server_port(), current_setting('port')::integer),
               CASE WHEN pg_is_in_recovery()
                    THEN 'it is a standby in recovery (pg_is_in_recovery())'
                    WHEN current_setting('transaction_read_only') = 'on'
                    THEN 'its transactions are read-only (default_transaction_read_only)'
                    ELSE '' END""",
    # Push: a statement-level trigger notifies the table's channel once per INSERT statement
    # (NOTIFY is sent at commit, and several in one transaction are sent once). The function
    # lives in the table's schema, takes the channel as its argument and is created only where
    # missing (replacing one takes its owner). No line but a statement's last ends with a
    # semicolon: a script is split into statements there.
    "create_notify_trigger": """
        DO $do$BEGIN IF to_regprocedure({function_literal} || '()') IS NULL THEN
            CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql
            AS $f$BEGIN PERFORM pg_notify(TG_ARGV[0], ''); RETURN NULL; END$f$; END IF; END$do$;
        DROP TRIGGER IF EXISTS sfbridge_notify ON {queue};
        CREATE TRIGGER sfbridge_notify AFTER INSERT ON {queue}
            FOR EACH STATEMENT EXECUTE FUNCTION {function}({queue_channel})""",
    "notify_triggers": """
        SELECT n.nspname, c.relname FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE t.tgname = 'sfbridge_notify' AND t.tgenabled <> 'D'""",
    # The daemon's look for work (`Dialect.work_query`): whether a queue holds a row, and
    # when a forwarder's earliest retry is due. Parameters: the part's index (a forwarder).
    "work_queue": """
        SELECT CAST(? AS integer), CAST(EXISTS (SELECT 1 FROM {queue}) AS integer),
               CAST(NULL AS timestamp)""",
    "work_retry": """
        SELECT CAST(? AS integer), 0,
               (SELECT min(next_attempt_at) FROM {retry} WHERE forwarder = ?)""",
    # Reading a table in Spark tasks (`bridge.spark.partitions`): the key of every n-th row
    # (parameter: n), which cuts the table into ranges of n rows each, then one range page by
    # page in key order (exclusive lower bound, inclusive upper bound, page size).
    "queue_seq_boundaries": """
        SELECT seq FROM (SELECT seq, row_number() OVER (ORDER BY seq) AS n FROM {queue})
            AS numbered
        WHERE n % ? = 0 ORDER BY seq""",
    "queue_page": """
        SELECT seq, id, headers FROM {queue} WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?""",
    "retry_seq_boundaries": """
        SELECT seq FROM (SELECT seq, row_number() OVER (ORDER BY seq) AS n FROM {retry}
                         WHERE forwarder = ?) AS numbered
        WHERE n % ? = 0 ORDER BY seq""",
    "ledger_boundaries_since": """
        SELECT message_id, destination FROM (
            SELECT message_id, destination,
                   row_number() OVER (ORDER BY message_id, destination) AS n
            FROM {ledger} WHERE forwarded_at >= ?) AS numbered
        WHERE n % ? = 0 ORDER BY message_id, destination""",
    # Whether this login may create tables in the schema (PostgreSQL 15: only the owner may
    # create in `public` unless granted).
    "can_create_tables": "SELECT has_schema_privilege(?, 'CREATE')",
    # CREATE SCHEMA, even IF NOT EXISTS for a schema that exists, needs CREATE on the database.
    "can_create_schemas": "SELECT has_database_privilege(current_database(), 'CREATE')",
    "schema_exists": "SELECT count(*) FROM pg_namespace WHERE nspname = ?",
    "current_login": "SELECT current_user, current_database()",
    # Why the database takes no writes now, or NULL: the probe of a destination in trouble
    # asks, as a read-only database answers every connection. A session's
    # transaction_read_only is fixed when it starts, so only a new session's answer is current.
    "read_only_reason": """
        SELECT CASE
            WHEN pg_is_in_recovery()
                THEN 'it is a standby in recovery (read-only; has a failover moved the primary?)'
            WHEN current_setting('transaction_read_only') = 'on'
                THEN 'its sessions start read-only (default_transaction_read_only is on)'
        END""",
    # Whether this login may write rows into a queue: INSERT on the table, and the sequences of
    # its serial columns (the transport's Seq; an identity column needs no right of its own)
    # that it may not use, one a line.
    "can_insert": """
        WITH t AS (SELECT CAST(? AS regclass) AS r)
        SELECT has_table_privilege(t.r, 'INSERT'),
               (SELECT string_agg(s.name, E'\\n') FROM (
                    SELECT pg_get_serial_sequence(t.r::text, a.attname) AS name
                    FROM pg_attribute AS a
                    WHERE a.attrelid = t.r AND a.attnum > 0 AND NOT a.attisdropped
                      AND a.attidentity = '') AS s
                WHERE s.name IS NOT NULL AND NOT has_sequence_privilege(s.name, 'USAGE'))
        FROM t""",
    # What the login may do beyond the bridge's needs (LOGIN_RIGHTS_STATEMENT_NAMES). Role
    # attributes (superuser is not inherited; the others are worth a look) and membership in
    # the predefined roles that read, write or run anything, or in a superuser role.
    "login_powers": """
        SELECT p.power, p.severe FROM pg_roles AS r CROSS JOIN LATERAL (VALUES
                ('superuser', 1, r.rolsuper), ('CREATEROLE', 0, r.rolcreaterole),
                ('CREATEDB', 0, r.rolcreatedb), ('BYPASSRLS', 0, r.rolbypassrls))
            AS p (power, severe, held)
        WHERE r.rolname = current_user AND p.held
        UNION ALL
        SELECT 'member of ' || quote_ident(m.rolname), 0 FROM pg_roles AS m
        WHERE m.rolname <> current_user AND pg_has_role(current_user, m.oid, 'MEMBER')
          AND (m.rolsuper OR m.rolname IN ('pg_read_all_data', 'pg_write_all_data',
               'pg_execute_server_program', 'pg_read_server_files', 'pg_write_server_files',
               'pg_signal_backend'))""",
    "owned_objects": """
        WITH me AS (SELECT oid FROM pg_roles WHERE rolname = current_user)
        SELECT 'database', NULL, d.datname FROM pg_database AS d, me
        WHERE d.datname = current_database() AND d.datdba = me.oid
        UNION ALL
        SELECT 'schema', NULL, n.nspname FROM pg_namespace AS n, me WHERE n.nspowner = me.oid
        UNION ALL
        SELECT 'table', n.nspname, c.relname
        FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace, me
        WHERE c.relowner = me.oid AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
        ORDER BY 1, 2, 3""",
    "table_rights": """
        SELECT p.name FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE',
                                        'REFERENCES', 'TRIGGER']) AS p (name)
        WHERE has_table_privilege(CAST(? AS regclass), p.name)""",
    # Transaction records (`bridge.forwarding.transactions`), one table per forwarding database: a
    # two-phase commit decision ('C' commit, 'A' abort) under the prepared transaction's gid;
    # an at-least-once delivery in flight ('P', with its message ids); '$store' holds the
    # random id that this database's gids carry.
    "create_transactions_table": """
        CREATE TABLE IF NOT EXISTS {transactions} (
            gid varchar(200) NOT NULL PRIMARY KEY,
            outcome char(1) NOT NULL,
            forwarder varchar(200) NOT NULL,
            destination_database varchar(200) NOT NULL,
            recorded_at timestamp NOT NULL,
            message_ids text
        )""",
    "transaction_record": """
        INSERT INTO {transactions} (gid, outcome, forwarder, destination_database, recorded_at,
                                    message_ids)
        VALUES (?, ?, ?, ?, ?, ?)""",
    # The resolver's abort, recorded only where nothing is recorded yet. A decision another
    # transaction is inserting (a batch still running) makes this wait for that transaction,
    # at most the lock timeout set just before.
    "transaction_record_unless_decided": """
        INSERT INTO {transactions} (gid, outcome, forwarder, destination_database, recorded_at,
                                    message_ids)
        VALUES (?, ?, ?, ?, ?, NULL) ON CONFLICT (gid) DO NOTHING""",
    "transaction_read": "SELECT outcome FROM {transactions} WHERE gid = ?",
    "transaction_forget": "DELETE FROM {transactions} WHERE gid = ?",
    "transactions_decided": """
        SELECT gid, outcome FROM {transactions}
        WHERE destination_database = ? AND outcome IN ('C', 'A')""",
    # In-flight records older than a cutoff that no live batch holds (a batch locks its own
    # by deleting it before the destination commits): their batch died.
    "transactions_orphaned": """
        SELECT gid, forwarder, destination_database, message_ids FROM {transactions}
        WHERE outcome = 'P' AND recorded_at < ? FOR UPDATE SKIP LOCKED""",
    "transactions_summary": """
        SELECT outcome, destination_database, count(*), min(recorded_at) FROM {transactions}
        WHERE outcome <> 'S' GROUP BY outcome, destination_database""",
    "store_id_claim": """
        INSERT INTO {transactions} (gid, outcome, forwarder, destination_database, recorded_at,
                                    message_ids)
        VALUES ('$store', 'S', '', '', ?, ?) ON CONFLICT (gid) DO NOTHING""",
    "store_id_read": "SELECT message_ids FROM {transactions} WHERE gid = '$store'",
    "lock_timeout": "SET LOCAL lock_timeout = '200ms'",
    # Two-phase commit in a destination. A gid is a literal, never a parameter: the bridge's
    # gids are made of letters, digits, ':' and '-' only (`bridge.forwarding.transactions`).
    "prepare_transaction": "PREPARE TRANSACTION {gid}",
    "commit_prepared": "COMMIT PREPARED {gid}",
    "rollback_prepared": "ROLLBACK PREPARED {gid}",
    "prepared_transactions": """
        SELECT gid, EXTRACT(EPOCH FROM (now() - prepared)) FROM pg_prepared_xacts
        WHERE database = current_database() AND gid LIKE ?""",
    "max_prepared_transactions": "SELECT current_setting('max_prepared_transactions')::int",
    "queue_oldest_headers": "SELECT headers FROM {queue} ORDER BY seq LIMIT 1",
    "list_tables": """
        SELECT table_schema, table_name FROM information_schema.tables
        WHERE table_schema NOT IN ('pg_catalog', 'information_schema')""",
    "table_columns": """
        SELECT lower(column_name), data_type FROM information_schema.columns
        WHERE table_schema = ? AND table_name = ?""",
    "table_indexes": """
        SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = ? AND tablename = ?""",
    **ERROR_GROUP_STATEMENTS,
}


def _decode_timestamp(value: Any) -> datetime | None:
    return value if value is None or isinstance(value, datetime) else datetime.fromisoformat(value)
