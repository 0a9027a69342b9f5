"""The statements every dialect shares unless it overrides them: plain SQL that PostgreSQL,
SQLite and SQL Server run as written (or two of them do, and the third overrides it).

A dialect's statements are `{**BASE_STATEMENTS, <its own>}`: its own entries replace these by
name, as a SQLAlchemy dialect's compiler overrides only what its database says differently.
Templates follow the rules of `bridge.dialects.base`: quoted table names in braces, `?` for
parameters.
"""

from __future__ import annotations

BASE_STATEMENTS: dict[str, str] = {
    "queue_count": "SELECT count(*) FROM {queue}",
    "table_probe": "SELECT 1 FROM {table} WHERE 1 = 0",
    "savepoint": "SAVEPOINT sfbridge_local",
    "rollback_to_savepoint": "ROLLBACK TO SAVEPOINT sfbridge_local",
    "release_savepoint": "RELEASE SAVEPOINT sfbridge_local",
    # Retry storage.
    "retry_store": """
        INSERT INTO {retry} (id, forwarder, destination, destination_database, expires, headers,
                             body, attempts, first_failure_at, next_attempt_at, last_error)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
    "retry_waiting": """
        SELECT destination_database, count(*), min(next_attempt_at) FROM {retry}
        WHERE destination_database IS NOT NULL GROUP BY destination_database""",
    # NServiceBus's own subscriber lookup in its `SubscriptionRouting` table (native
    # publish/subscribe); its columns are unquoted, so lower case.
    "subscribers_many": "SELECT DISTINCT QueueAddress FROM {subscriptions} WHERE Topic IN ({rows})",
    "subscribers_row": "?",
    # `check`: has an endpoint of this name subscribed from this database?
    "subscribers_by_endpoint": """
        SELECT COUNT(*) FROM {subscriptions} WHERE Endpoint = ? OR QueueAddress = ?""",
    "event_types_read": """
        SELECT event_type, last_seen_at, subscribers FROM {event_types} WHERE forwarder = ?
        ORDER BY event_type""",
    "ledger_cleanup": "DELETE FROM {ledger} WHERE forwarded_at < ?",
    # `sfbridge where`: a message's rows in a ledger, by the ledger's key's leading column.
    "ledger_find": """
        SELECT message_id, destination, forwarded_at FROM {ledger} WHERE message_id = ?
        ORDER BY forwarded_at""",
    # The error archive (`bridge.storage.archive`): one row per archived message.
    "archive_store": """
        INSERT INTO {archive} (id, message_id, error_queue, archived_at, expires, headers, body)
        VALUES (?, ?, ?, ?, ?, ?, ?)""",
    "archive_take_row": "?",
    "archive_page": """
        SELECT seq, id, message_id, error_queue, archived_at, headers FROM {archive}
        WHERE seq > ? ORDER BY seq LIMIT ?""",
    "archive_take_many": """
        DELETE FROM {archive} WHERE seq IN ({rows})
        RETURNING seq, id, error_queue, expires, headers, body""",
    "archive_expire": "DELETE FROM {archive} WHERE archived_at < ?",
    "archive_find": """
        SELECT seq, id, message_id, error_queue, archived_at, headers FROM {archive}
        WHERE id = ? OR message_id = ? ORDER BY seq""",
    "counters_add_row": "(?, ?, ?, ?)",
    "counters_read": """
        SELECT counter, sum(value) FROM {counters} WHERE forwarder = ?
        GROUP BY counter ORDER BY counter""",
    "destination_states_read": """
        SELECT destination_database, state, since, last_error, next_probe_at, updated_at,
               reported_by
        FROM {destination_states} ORDER BY destination_database""",
    "forwarder_states_read": """
        SELECT forwarder, reported_by, state, since, failures, last_error, updated_at
        FROM {forwarder_states} ORDER BY forwarder, reported_by""",
    "daemons_read": """
        SELECT daemon, host, pid, started_at, heartbeat_at, heartbeat_seconds, state, stopped_at,
               config_fingerprint, forwarders
        FROM {daemons} ORDER BY started_at, daemon""",
    # The same from a daemons table an earlier sfbridge made, which `status` reads as it is.
    "daemons_read_without_identity": """
        SELECT daemon, host, pid, started_at, heartbeat_at, heartbeat_seconds, state, stopped_at,
               NULL, NULL
        FROM {daemons} ORDER BY started_at, daemon""",
    # `sfbridge daemons forget`: one entry, unless it wrote a heartbeat since it was read (it
    # runs again, and stays).
    "daemon_delete": "DELETE FROM {daemons} WHERE daemon = ? AND heartbeat_at = ?",
    # A daemon starting forgets daemons not heard from for long, and its own host's earlier
    # runs that ended (cleanly, or so long ago they are missing): nothing left to tell.
    "daemons_forget": """
        DELETE FROM {daemons}
        WHERE heartbeat_at < ?
           OR (host = ? AND daemon <> ? AND (state = 'stopped' OR heartbeat_at < ?))""",
    "pause_clear": "DELETE FROM {pauses} WHERE forwarder = ? AND destination_database = ?",
    "pauses_read": """
        SELECT destination_database, paused_at, reason FROM {pauses} WHERE forwarder = ?
        ORDER BY destination_database""",
    # The rows of the error-queue and retry tools' multi-row statements: one sequence value.
    "error_queue_claim_row": "?",
    "error_queue_delete_row": "?",
    "error_queue_read_row": "?",
    # How many rows an error queue holds (`sfbridge errors list`, which pages in the database).
    "error_queue_count": "SELECT count(*) AS messages FROM {queue}",
    "retry_due_now_row": "?",
    "retry_take_row": "?",
    # The retry tools (`sfbridge retries`): a page of retry storage after a sequence value.
    "retry_list_page": """
        SELECT seq, id, forwarder, destination, destination_database, attempts,
               first_failure_at, next_attempt_at, last_error, headers
        FROM {retry} WHERE seq > ? ORDER BY seq LIMIT ?""",
    # Operator commands recorded (`bridge.storage.audit`): one row each.
    "audit_record": """
        INSERT INTO {audit} (recorded_at, operator, host, command, target, affected)
        VALUES (?, ?, ?, ?, ?, ?)""",
    # A command of several transactions: its row first (affected 0), its seq back; each
    # transaction then adds what it moved.
    "audit_open": """
        INSERT INTO {audit} (recorded_at, operator, host, command, target, affected)
        VALUES (?, ?, ?, ?, ?, 0) RETURNING seq""",
    "audit_add": "UPDATE {audit} SET affected = affected + ? WHERE seq = ?",
    "audit_read": """
        SELECT recorded_at, operator, host, command, target, affected FROM {audit}
        ORDER BY seq DESC LIMIT ?""",
    # Reading retry storage and the ledger in Spark tasks (`bridge.spark.partitions`): bounds,
    # then one range page by page in key order (exclusive lower bound, inclusive upper bound,
    # page size).
    "retry_seq_bounds": """
        SELECT min(seq), max(seq), count(*) FROM {retry} WHERE forwarder = ?""",
    "retry_page": """
        SELECT seq, destination, attempts, first_failure_at, last_error FROM {retry}
        WHERE forwarder = ? AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?""",
    # The ledger's key is (message_id, destination); a range runs from one key (exclusive) to
    # another (inclusive), each given as its two columns, written out (not as row values) so
    # that the leading column bounds the index scan.
    "ledger_destinations_since": """
        SELECT destination, count(*) FROM {ledger} WHERE forwarded_at >= ?
        GROUP BY destination ORDER BY destination""",
    "ledger_last_since": """
        SELECT message_id, destination FROM {ledger} WHERE forwarded_at >= ?
        ORDER BY message_id DESC, destination DESC LIMIT 1""",
    "ledger_page_since": """
        SELECT message_id, destination FROM {ledger}
        WHERE forwarded_at >= ?
          AND message_id >= ? AND (message_id > ? OR destination > ?)
          AND message_id <= ? AND (message_id < ? OR destination <= ?)
        ORDER BY message_id, destination LIMIT ?""",
}
