"""The names of the statements a dialect defines: every dialect all of `STATEMENT_NAMES`,
and of each optional group all or none (a unit test holds them to it)."""

from __future__ import annotations

# Optional forms of multi-row statements that bind one array per column instead of one
# parameter per value (`Dialect.rows_statements`): a dialect defines all of them or none.
ARRAY_STATEMENT_NAMES = frozenset({"send_many_arrays", "ledger_record_many_arrays"})
# Optional, all or none: the transaction records of `bridge.forwarding.transactions` (durable
# in-flight records of at-least-once deliveries, two-phase decisions), and two-phase commit itself
# (PREPARE TRANSACTION in a destination; the `{gid}` placeholder takes a literal). A dialect
# with two-phase statements has the record statements too and `cannot_prepare` None.
TRANSACTION_RECORD_STATEMENT_NAMES = frozenset(
    {
        "create_transactions_table",
        "transaction_record",
        "transaction_forget",
        "transactions_orphaned",
        "transactions_summary",
    }
)
TWO_PHASE_STATEMENT_NAMES = frozenset(
    {
        "transaction_record_unless_decided",
        "transaction_read",
        "transactions_decided",
        "store_id_claim",
        "store_id_read",
        "lock_timeout",
        "prepare_transaction",
        "commit_prepared",
        "rollback_prepared",
        "prepared_transactions",
        "max_prepared_transactions",
    }
)
# Optional, all or none: `COPY ... FROM STDIN` into a queue and into the ledger, for drivers that
# stream rows (`Connection.copies_rows`); `Dialect.copy_types` names each column's type, and
# each `*_copy_columns` query returns the same columns of the table (no rows), to see that
# they have those types.
COPY_STATEMENT_NAMES = frozenset(
    {"send_copy", "send_copy_columns", "ledger_record_copy", "ledger_record_copy_columns"}
)
# Optional, all or none: each claim again, with its free-text columns (`headers`, retry
# storage's `last_error`) as the bytes the table stores, in `Dialect.raw_text_encoding`. For
# drivers that cannot hand back one value they fail to convert (`bridge.forwarding.claim` claims
# again with these when a claim raises ValueNotConvertible). Same parameters, same other columns.
RAW_CLAIM_STATEMENT_NAMES = frozenset(
    {"receive_batch_raw", "receive_range_raw", "retry_claim_due_raw"}
)
# Optional, all or none: push (`bridge.daemon.watcher`). `create_notify_trigger` makes an
# insert into `{queue}` notify its channel (`{queue_channel}`, see `notify_channel`) once per
# statement, through the function `{function}`; `notify_triggers` lists the tables of the
# database that have that trigger, enabled, as (schema, table) rows.
PUSH_STATEMENT_NAMES = frozenset({"create_notify_trigger", "notify_triggers"})
# Optional: what the server allows (`sfbridge check` compares the daemon's connections with
# it): one row of (connections the server accepts from ordinary logins, connections open now
# by other clients than the bridge, a text that tells servers apart).
CONNECTION_LIMIT_STATEMENT_NAMES = frozenset({"connection_limit"})
# Optional, all or none: what the connection's login may do beyond what the bridge needs
# (`bridge.storage.grants`, `sfbridge check`). `login_powers`: (power, severe) rows, severe 1
# for a superuser (PostgreSQL) or sysadmin / db_owner (SQL Server); `owned_objects`: (kind,
# schema, name) rows of the database, schemas and tables the login owns; `table_rights`:
# the rights it holds on the table `?` (its rendered name), one a row, from INSERT, SELECT,
# UPDATE, DELETE and the dialect's others that matter (TRUNCATE...).
LOGIN_RIGHTS_STATEMENT_NAMES = frozenset({"login_powers", "owned_objects", "table_rights"})
# Optional: where a connection landed (`bridge.connections.reached_server`, `check`, `install`):
# one row of (the server as host:port or its name, why it does not accept writes or '').
SERVER_ROLE_STATEMENT_NAMES = frozenset({"server_role"})
# Optional: the transactions of other sessions writing `{queue}` or `{retry}` now, one row each
# (an id of the database's), for `sfbridge pause` to wait for the batches in flight.
IN_FLIGHT_STATEMENT_NAMES = frozenset({"in_flight_writers"})
OPTIONAL_STATEMENT_GROUPS = (
    SERVER_ROLE_STATEMENT_NAMES,
    IN_FLIGHT_STATEMENT_NAMES,
    LOGIN_RIGHTS_STATEMENT_NAMES,
    ARRAY_STATEMENT_NAMES,
    PUSH_STATEMENT_NAMES,
    CONNECTION_LIMIT_STATEMENT_NAMES,
    COPY_STATEMENT_NAMES,
    RAW_CLAIM_STATEMENT_NAMES,
    TRANSACTION_RECORD_STATEMENT_NAMES,
    TWO_PHASE_STATEMENT_NAMES,
)
OPTIONAL_STATEMENT_NAMES = frozenset().union(*OPTIONAL_STATEMENT_GROUPS)

# Every dialect defines exactly these statements.
STATEMENT_NAMES = frozenset(
    {
        # `sfbridge where` and the error archive (`bridge.storage.whereabouts`, `.archive`):
        # `retry_find` takes (row Id or NULL, MessageId, its header as JSON writes it).
        "create_retry_lookup_index",
        "retry_find",
        "ledger_find",
        "queue_find_id",
        "queue_find_headers",
        "create_archive_table",
        "archive_store",
        "archive_page",
        "archive_take_many",
        "archive_take_row",
        "archive_expire",
        "archive_find",
        "create_queue",
        "create_retry_table",
        "create_ledger_table",
        "create_counters_table",
        "receive_batch",
        "send",
        "dead_letter",
        "retry_store",
        "retry_claim_due",
        "retry_summary",
        "ledger_record",
        "ledger_record_many",
        "subscribers_many",
        "subscribers_row",
        "subscribers_by_endpoint",
        "create_event_types_table",
        "event_type_seen",
        "event_types_read",
        "ledger_record_row",
        "send_many",
        "send_row",
        "ledger_cleanup",
        "counters_add",
        "counters_add_many",
        "counters_add_row",
        "counters_read",
        "queue_count",
        "queue_oldest_headers",
        "list_tables",
        "create_schema",
        "savepoint",
        "rollback_to_savepoint",
        "release_savepoint",
        "table_columns",
        "table_indexes",
        "table_probe",
        "queue_seq_boundaries",
        "queue_page",
        "retry_seq_bounds",
        "retry_seq_boundaries",
        "retry_page",
        "ledger_destinations_since",
        "ledger_last_since",
        "ledger_boundaries_since",
        "ledger_page_since",
        "receive_range",
        "queue_seq_bounds",
        "can_create_tables",
        "can_create_schemas",
        "schema_exists",
        "current_login",
        "read_only_reason",
        "can_insert",
        "retry_add_destination_database",
        "retry_waiting",
        "create_destination_states_table",
        "create_forwarder_states_table",
        "forwarder_state_save",
        "forwarder_states_read",
        "destination_state_save",
        "destination_states_read",
        "create_daemons_table",
        "daemon_save",
        "daemons_read",
        "daemons_forget",
        "daemons_add_identity",
        "daemons_read_without_identity",
        "daemon_delete",
        "create_pauses_table",
        "pause_set",
        "pause_clear",
        "pauses_read",
        "error_queue_page",
        "error_queue_row",
        "error_queue_claim_many",
        "error_queue_claim_row",
        "error_queue_delete_many",
        "error_queue_delete_row",
        "error_queue_failed_queues",
        "error_queue_groups",
        "error_queue_groups_checked",
        "error_queue_read_many",
        "error_queue_read_row",
        "error_queue_count",
        "retry_list_page",
        "retry_due_now_many",
        "retry_due_now_row",
        "retry_take_many",
        "retry_take_row",
        "create_audit_table",
        "audit_record",
        "audit_open",
        "audit_add",
        "audit_read",
        "work_queue",
        "work_retry",
    }
)
