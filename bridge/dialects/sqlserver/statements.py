"""The SQL Server dialect's statements: the transport's queue DDL, receive and send, and the
bridge's own tables (see the package docstring); the base's (`BASE_STATEMENTS`) where T-SQL
says the same."""

from __future__ import annotations

from bridge.dialects.base.statements import BASE_STATEMENTS
from bridge.dialects.sqlserver.bridge_tables import (
    LOOKUP_STATEMENTS,
    STATE_STATEMENTS,
    create_if_missing,
)
from bridge.dialects.sqlserver.error_groups import ERROR_GROUP_STATEMENTS

# --------------------------------------------------------------------------------------------
# SQL
# --------------------------------------------------------------------------------------------

_HEADERS = "CAST(? AS nvarchar(max))"
_BODY = "CAST(? AS varbinary(max))"
# What a row weighs for a batch's byte budget: its body and headers, in bytes (bigint, so the
# running sum cannot overflow).
_SIZE = "CAST(ISNULL(DATALENGTH(Body), 0) + ISNULL(DATALENGTH(Headers), 0) AS bigint)"
# The same of a claimed row, returned with it (the batch then knows it was cut by bytes).
_DELETED_SIZE = (
    "CAST(ISNULL(DATALENGTH(deleted.Body), 0) + ISNULL(DATALENGTH(deleted.Headers), 0) AS bigint)"
)
_EXPIRED_QUEUE = (
    "CASE WHEN deleted.Expires IS NULL THEN 0 WHEN deleted.Expires > GETUTCDATE() THEN 0 ELSE 1 END"
)
_EXPIRED_RETRY = (
    "CASE WHEN deleted.expires IS NULL THEN 0 WHEN deleted.expires > SYSUTCDATETIME() THEN 0 "
    "ELSE 1 END"
)


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

_AUDIT_DDL = """
    CREATE TABLE {audit} (
        seq bigint IDENTITY(1,1) NOT NULL PRIMARY KEY,
        recorded_at datetime2 NOT NULL,
        operator nvarchar(200) NOT NULL,
        host nvarchar(200) NOT NULL,
        command nvarchar(100) NOT NULL,
        target nvarchar(max) NOT NULL,
        affected bigint NOT NULL
    )"""

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
# Binary collation: the database default is usually case- and trailing-space-insensitive, and
# message ids `Order-1` and `order-1` (NServiceBus allows any) must stay two messages.
_LEDGER_DDL = """
    CREATE TABLE {ledger} (
        message_id nvarchar(200) COLLATE Latin1_General_100_BIN2 NOT NULL,
        destination nvarchar(600) COLLATE Latin1_General_100_BIN2 NOT NULL,
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

_PAUSES_DDL = """
    CREATE TABLE {pauses} (
        forwarder nvarchar(200) NOT NULL,
        destination_database nvarchar(200) NOT NULL,
        paused_at datetime2 NOT NULL,
        reason nvarchar(max) NULL,
        PRIMARY KEY (forwarder, destination_database)
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
    **BASE_STATEMENTS,
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
    "create_queue": create_if_missing("queue", _QUEUE_DDL),
    "create_retry_table": create_if_missing("retry", _RETRY_DDL),
    "create_ledger_table": create_if_missing("ledger", _LEDGER_DDL),
    "create_counters_table": create_if_missing("counters", _COUNTERS_DDL),
    "create_event_types_table": create_if_missing("event_types", _EVENT_TYPES_DDL),
    # The transport's receive, TOP(@limit) rows at a time instead of one, and only while the
    # bytes before a row are under @budget (the first row always goes). A CTE with a window
    # function cannot be deleted through, hence the join, whose target takes the receive's
    # hints too: reading it, the server may meet rows other receivers (endpoints, daemons)
    # hold, and must skip them as the transport's receive does, not wait for them. Rows
    # locked but not taken stay locked until the batch commits; other receivers read past
    # them.
    "receive_batch": f"""
        DECLARE @limit int = ?, @budget bigint = ?;
        WITH locked AS (
            SELECT TOP (@limit) RowVersion, {_SIZE} AS size
            FROM {{queue}} WITH (UPDLOCK, READPAST, ROWLOCK)
            ORDER BY RowVersion),
        taken AS (
            SELECT RowVersion FROM (
                SELECT RowVersion, SUM(size) OVER (ORDER BY RowVersion
                                                   ROWS UNBOUNDED PRECEDING) - size AS before
                FROM locked) AS sized
            WHERE before < @budget)
        DELETE message
        OUTPUT deleted.Id, {_EXPIRED_QUEUE} AS expired, deleted.Expires, deleted.Headers,
               deleted.Body, deleted.RowVersion AS seq,
               deleted.ReplyToAddress AS legacy_reply_to,
               {_DELETED_SIZE} AS claimed_size
        FROM {{queue}} AS message WITH (UPDLOCK, READPAST, ROWLOCK)
        INNER JOIN taken ON taken.RowVersion = message.RowVersion""",
    # A bulk drain's claim: the receive inside one RowVersion range; the caller binds (first,
    # last, limit) as for the other dialects, hence the variables.
    "receive_range": f"""
        DECLARE @first bigint = ?, @last bigint = ?, @limit int = ?, @budget bigint = ?;
        WITH locked AS (
            SELECT TOP (@limit) RowVersion, {_SIZE} AS size
            FROM {{queue}} WITH (UPDLOCK, READPAST, ROWLOCK)
            WHERE RowVersion BETWEEN @first AND @last
            ORDER BY RowVersion),
        taken AS (
            SELECT RowVersion FROM (
                SELECT RowVersion, SUM(size) OVER (ORDER BY RowVersion
                                                   ROWS UNBOUNDED PRECEDING) - size AS before
                FROM locked) AS sized
            WHERE before < @budget)
        DELETE message
        OUTPUT deleted.Id, {_EXPIRED_QUEUE} AS expired, deleted.Expires, deleted.Headers,
               deleted.Body, deleted.RowVersion AS seq,
               deleted.ReplyToAddress AS legacy_reply_to,
               {_DELETED_SIZE} AS claimed_size
        FROM {{queue}} AS message WITH (UPDLOCK, READPAST, ROWLOCK)
        INNER JOIN taken ON taken.RowVersion = message.RowVersion""",
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
                @give_up_by datetime2 = ?, @limit int = ?, @budget bigint = ?;
        WITH locked AS (
            SELECT TOP (@limit) seq, next_attempt_at, {_SIZE.lower()} AS size
            FROM {{retry}} WITH (UPDLOCK, READPAST, ROWLOCK)
            WHERE forwarder = @forwarder AND next_attempt_at <= @due_by
              AND (destination_database IS NULL
                   OR CHARINDEX(N'|' + destination_database + N'|', @waiting) = 0
                   OR first_failure_at <= @give_up_by OR expires <= SYSUTCDATETIME())
            ORDER BY next_attempt_at, seq),
        taken AS (
            SELECT seq FROM (
                SELECT seq, SUM(size) OVER (ORDER BY next_attempt_at, seq
                                            ROWS UNBOUNDED PRECEDING) - size AS before
                FROM locked) AS sized
            WHERE before < @budget)
        DELETE due
        OUTPUT deleted.id, {_EXPIRED_RETRY} AS expired, deleted.expires, deleted.headers,
               deleted.body, deleted.seq, deleted.attempts, deleted.first_failure_at,
               deleted.last_error, {_DELETED_SIZE.lower()} AS claimed_size
        FROM {{retry}} AS due WITH (UPDLOCK, READPAST, ROWLOCK)
        INNER JOIN taken ON taken.seq = due.seq""",
    "retry_summary": """
        SELECT r.destination, COUNT(*), MIN(r.first_failure_at), MIN(r.next_attempt_at),
               MAX(r.attempts),
               (SELECT TOP (1) r2.last_error FROM {retry} AS r2
                WHERE r2.forwarder = r.forwarder AND r2.destination = r.destination
                ORDER BY r2.seq DESC),
               MIN(r.destination_database)
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
    "counters_add": """
        MERGE {counters} WITH (HOLDLOCK) AS c
        USING (SELECT ? AS forwarder, ? AS counter, ? AS slot, ? AS value) AS v
        ON c.forwarder = v.forwarder AND c.counter = v.counter AND c.slot = v.slot
        WHEN MATCHED THEN UPDATE SET value = c.value + v.value
        WHEN NOT MATCHED THEN INSERT (forwarder, counter, slot, value)
            VALUES (v.forwarder, v.counter, v.slot, v.value);""",
    "counters_add_many": """
        MERGE {counters} WITH (HOLDLOCK) AS c
        USING (VALUES {rows}) AS v (forwarder, counter, slot, value)
        ON c.forwarder = v.forwarder AND c.counter = v.counter AND c.slot = v.slot
        WHEN MATCHED THEN UPDATE SET value = c.value + v.value
        WHEN NOT MATCHED THEN INSERT (forwarder, counter, slot, value)
            VALUES (v.forwarder, v.counter, v.slot, v.value);""",
    "counters_add_row": "(CAST(? AS nvarchar(200)), CAST(? AS nvarchar(100)), ?, ?)",
    "counters_read": """
        SELECT counter, SUM(value) FROM {counters} WHERE forwarder = ?
        GROUP BY counter ORDER BY counter""",
    "event_type_seen": f"""
        MERGE {{event_types}} WITH (HOLDLOCK) AS e
        USING (SELECT ? AS forwarder, ? AS event_type, ? AS last_seen_at,
                      {_HEADERS} AS subscribers) AS v
        ON e.forwarder = v.forwarder AND e.event_type = v.event_type
        WHEN MATCHED THEN UPDATE SET last_seen_at = v.last_seen_at, subscribers = v.subscribers
        WHEN NOT MATCHED THEN INSERT (forwarder, event_type, last_seen_at, subscribers)
            VALUES (v.forwarder, v.event_type, v.last_seen_at, v.subscribers);""",
    # SQL Server has no RELEASE SAVEPOINT: a savepoint lives until the transaction ends, and
    # ROLLBACK TRANSACTION goes back to the latest one of that name.
    "retry_add_destination_database": """
        IF COL_LENGTH({retry_literal}, 'destination_database') IS NULL
            ALTER TABLE {retry} ADD destination_database nvarchar(200) NULL""",
    "retry_waiting": """
        SELECT destination_database, COUNT(*), MIN(next_attempt_at) FROM {retry}
        WHERE destination_database IS NOT NULL GROUP BY destination_database""",
    # Pauses: destination_database '' pauses the whole forwarder. Pausing again keeps the time
    # the pause began and takes the new reason.
    "create_pauses_table": create_if_missing("pauses", _PAUSES_DDL),
    "pause_set": """
        DECLARE @forwarder nvarchar(200) = ?, @database nvarchar(200) = ?,
                @paused_at datetime2 = ?, @reason nvarchar(max) = ?;
        UPDATE {pauses} WITH (UPDLOCK, HOLDLOCK) SET reason = @reason
        WHERE forwarder = @forwarder AND destination_database = @database;
        IF @@ROWCOUNT = 0
            INSERT INTO {pauses} (forwarder, destination_database, paused_at, reason)
            VALUES (@forwarder, @database, @paused_at, @reason)""",
    # The error-queue tools (`sfbridge errors`): a page of rows after a RowVersion, one row in
    # full, and taking or deleting chosen rows by RowVersion with the receive's locks, so rows
    # another transaction holds are skipped, never taken twice.
    "error_queue_page": """
        DECLARE @after bigint = ?, @limit int = ?;
        SELECT TOP (@limit) Id AS id, Headers AS headers, RowVersion AS seq
        FROM {queue} WITH (READPAST)
        WHERE RowVersion > @after ORDER BY RowVersion""",
    "error_queue_row": """
        SELECT Id AS id, Expires AS expires, Headers AS headers, Body AS body,
               RowVersion AS seq
        FROM {queue} WITH (READPAST) WHERE RowVersion = ?""",
    "error_queue_claim_many": """
        WITH message AS (
            SELECT * FROM {queue} WITH (UPDLOCK, READPAST, ROWLOCK)
            WHERE RowVersion IN ({rows}))
        DELETE FROM message
        OUTPUT deleted.Id, 0 AS expired, deleted.Expires, deleted.Headers, deleted.Body,
               deleted.RowVersion AS seq, deleted.ReplyToAddress AS legacy_reply_to""",
    "error_queue_delete_many": """
        WITH message AS (
            SELECT * FROM {queue} WITH (UPDLOCK, READPAST, ROWLOCK)
            WHERE RowVersion IN ({rows}))
        DELETE FROM message""",
    # Error-queue counts per `NServiceBus.FailedQ` (see the PostgreSQL dialect); headers that
    # are not JSON count under NULL. Rows batches hold are read past, as by `queue_count`.
    "error_queue_failed_queues": """
        SELECT failed_queue, COUNT_BIG(*) AS messages FROM (
            SELECT CASE WHEN ISJSON(Headers) = 1
                        THEN JSON_VALUE(Headers, '$."NServiceBus.FailedQ"') END AS failed_queue
            FROM {queue} WITH (READPAST)) AS failed
        GROUP BY failed_queue""",
    # The retry tools (see the PostgreSQL dialect): the writes lock as the claim does and read
    # past the rows a batch holds.
    "retry_list_page": """
        DECLARE @after bigint = ?, @limit int = ?;
        SELECT TOP (@limit) seq, id, forwarder, destination, destination_database, attempts,
               first_failure_at, next_attempt_at, last_error, headers
        FROM {retry} WITH (READPAST) WHERE seq > @after ORDER BY seq""",
    "retry_due_now_many": """
        WITH due AS (
            SELECT * FROM {retry} WITH (UPDLOCK, READPAST, ROWLOCK) WHERE seq IN ({rows}))
        UPDATE due SET next_attempt_at = first_failure_at""",
    "retry_take_many": """
        WITH taken AS (
            SELECT * FROM {retry} WITH (UPDLOCK, READPAST, ROWLOCK) WHERE seq IN ({rows}))
        DELETE FROM taken
        OUTPUT deleted.seq, deleted.id, deleted.forwarder, deleted.destination,
               deleted.expires, deleted.headers, deleted.body, deleted.attempts,
               deleted.last_error""",
    "create_audit_table": create_if_missing("audit", _AUDIT_DDL),
    # A command of several transactions: its row first (affected 0), its seq back; each
    # transaction then adds what it moved.
    "audit_open": """
        INSERT INTO {audit} (recorded_at, operator, host, command, target, affected)
        OUTPUT inserted.seq VALUES (?, ?, ?, ?, ?, 0)""",
    "audit_read": """
        SELECT TOP (?) recorded_at, operator, host, command, target, affected FROM {audit}
        ORDER BY seq DESC""",
    # The daemon's look for work (`Dialect.work_query`): whether a queue holds a row (the
    # transport's peek hints: rows receivers hold are skipped, never waited for), and when a
    # forwarder's earliest retry is due. Parameters: the part's index (a forwarder).
    "work_queue": """
        SELECT CAST(? AS int), CASE WHEN EXISTS (
                   SELECT 1 FROM {queue} WITH (READPAST, READCOMMITTEDLOCK)) THEN 1 ELSE 0 END,
               CAST(NULL AS datetime2)""",
    "work_retry": """
        SELECT CAST(? AS int), 0,
               (SELECT MIN(next_attempt_at) FROM {retry} WITH (READPAST) WHERE forwarder = ?)""",
    # Reading a table in Spark tasks: see the PostgreSQL dialect. Rows other sessions hold
    # are read past, as by `queue_count`.
    "queue_seq_boundaries": """
        DECLARE @step bigint = ?;
        SELECT RowVersion FROM (
            SELECT RowVersion, ROW_NUMBER() OVER (ORDER BY RowVersion) AS n
            FROM {queue} WITH (READPAST)) AS numbered
        WHERE n % @step = 0 ORDER BY RowVersion""",
    "queue_page": """
        DECLARE @after bigint = ?, @last bigint = ?, @limit int = ?;
        SELECT TOP (@limit) RowVersion AS seq, Id AS id, Headers AS headers
        FROM {queue} WITH (READPAST)
        WHERE RowVersion > @after AND RowVersion <= @last ORDER BY RowVersion""",
    "retry_seq_bounds": """
        SELECT MIN(seq), MAX(seq), COUNT_BIG(*) FROM {retry} WITH (READPAST)
        WHERE forwarder = ?""",
    "retry_seq_boundaries": """
        DECLARE @forwarder nvarchar(200) = ?, @step bigint = ?;
        SELECT seq FROM (
            SELECT seq, ROW_NUMBER() OVER (ORDER BY seq) AS n FROM {retry} WITH (READPAST)
            WHERE forwarder = @forwarder) AS numbered
        WHERE n % @step = 0 ORDER BY seq""",
    "retry_page": """
        DECLARE @forwarder nvarchar(200) = ?, @after bigint = ?, @last bigint = ?,
                @limit int = ?;
        SELECT TOP (@limit) seq, destination, attempts, first_failure_at, last_error
        FROM {retry} WITH (READPAST)
        WHERE forwarder = @forwarder AND seq > @after AND seq <= @last ORDER BY seq""",
    "ledger_destinations_since": """
        SELECT destination, COUNT_BIG(*) FROM {ledger} WHERE forwarded_at >= ?
        GROUP BY destination ORDER BY destination""",
    "ledger_last_since": """
        SELECT TOP (1) message_id, destination FROM {ledger} WHERE forwarded_at >= ?
        ORDER BY message_id DESC, destination DESC""",
    "ledger_boundaries_since": """
        DECLARE @since datetime2 = ?, @step bigint = ?;
        SELECT message_id, destination FROM (
            SELECT message_id, destination,
                   ROW_NUMBER() OVER (ORDER BY message_id, destination) AS n
            FROM {ledger} WHERE forwarded_at >= @since) AS numbered
        WHERE n % @step = 0 ORDER BY message_id, destination""",
    "ledger_page_since": """
        DECLARE @since datetime2 = ?, @after_id nvarchar(200) = ?, @after_id_2 nvarchar(200) = ?,
                @after_destination nvarchar(600) = ?, @last_id nvarchar(200) = ?,
                @last_id_2 nvarchar(200) = ?, @last_destination nvarchar(600) = ?,
                @limit int = ?;
        SELECT TOP (@limit) message_id, destination FROM {ledger}
        WHERE forwarded_at >= @since
          AND message_id >= @after_id
          AND (message_id > @after_id_2 OR destination > @after_destination)
          AND message_id <= @last_id
          AND (message_id < @last_id_2 OR destination <= @last_destination)
        ORDER BY message_id, destination""",
    # CREATE TABLE in the database and ALTER on the schema, as CREATE TABLE needs.
    "can_create_tables": """
        SELECT CASE WHEN HAS_PERMS_BY_NAME(NULL, NULL, 'CREATE TABLE') = 1
                     AND HAS_PERMS_BY_NAME(?, 'SCHEMA', 'ALTER') = 1 THEN 1 ELSE 0 END""",
    "can_create_schemas": "SELECT HAS_PERMS_BY_NAME(DB_NAME(), 'DATABASE', 'CREATE SCHEMA')",
    "schema_exists": "SELECT COUNT(*) FROM sys.schemas WHERE name = ?",
    "current_login": "SELECT USER_NAME(), DB_NAME()",
    # Why the database takes no writes now, or NULL (a readable availability-group secondary
    # is READ_ONLY too; one that is not readable refuses the connection instead).
    "read_only_reason": """
        SELECT CASE
            WHEN CAST(DATABASEPROPERTYEX(DB_NAME(), 'Updateability') AS nvarchar(20))
                 <> N'READ_WRITE'
                THEN N'it is read-only (DATABASEPROPERTYEX Updateability is not READ_WRITE)'
        END""",
    # Whether this login may write rows into a queue (an IDENTITY column needs no right of
    # its own).
    "can_insert": "SELECT HAS_PERMS_BY_NAME(?, 'OBJECT', 'INSERT'), CAST(NULL AS nvarchar(1))",
    # What the login may do beyond the bridge's needs (LOGIN_RIGHTS_STATEMENT_NAMES).
    "login_powers": """
        SELECT 'sysadmin', 1 WHERE IS_SRVROLEMEMBER('sysadmin') = 1
        UNION ALL SELECT 'db_owner', 1 WHERE IS_MEMBER('db_owner') = 1
        UNION ALL SELECT 'member of ' + r.name, 0
            FROM (VALUES ('securityadmin'), ('serveradmin'), ('dbcreator')) AS r (name)
            WHERE IS_SRVROLEMEMBER(r.name) = 1
        UNION ALL SELECT 'member of ' + r.name, 0
            FROM (VALUES ('db_ddladmin'), ('db_securityadmin'), ('db_accessadmin'),
                         ('db_datawriter')) AS r (name)
            WHERE IS_MEMBER(r.name) = 1""",
    "owned_objects": """
        SELECT 'database', NULL, DB_NAME() FROM sys.databases
        WHERE database_id = DB_ID() AND owner_sid = SUSER_SID()
        UNION ALL SELECT 'schema', NULL, s.name FROM sys.schemas AS s
        WHERE s.principal_id = USER_ID() AND s.name <> 'dbo'
        UNION ALL SELECT 'table', s.name, t.name FROM sys.tables AS t
        JOIN sys.schemas AS s ON s.schema_id = t.schema_id
        WHERE COALESCE(t.principal_id, s.principal_id) = USER_ID() AND USER_ID() <> 1""",
    "table_rights": """
        SELECT p.name FROM (VALUES ('SELECT'), ('INSERT'), ('UPDATE'), ('DELETE'), ('ALTER'),
                                   ('CONTROL'), ('REFERENCES')) AS p (name)
        WHERE HAS_PERMS_BY_NAME(?, 'OBJECT', p.name) = 1""",
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
    # Where the connection landed (`bridge.connections.reached_server`): the server's name and
    # TCP port (CONNECTIONPROPERTY needs no VIEW SERVER STATE), and why its database may not
    # take writes (read-only, restoring, an availability group's secondary).
    "server_role": """
        SELECT CAST(@@SERVERNAME AS nvarchar(256))
                 + COALESCE(N',' + CAST(CONNECTIONPROPERTY('local_tcp_port') AS nvarchar(10)),
                            N''),
               CASE WHEN CAST(DATABASEPROPERTYEX(DB_NAME(), 'Status') AS nvarchar(60))
                         <> N'ONLINE'
                    THEN N'its database is not online (DATABASEPROPERTYEX Status '
                         + CAST(DATABASEPROPERTYEX(DB_NAME(), 'Status') AS nvarchar(60)) + N')'
                    WHEN CAST(DATABASEPROPERTYEX(DB_NAME(), 'Updateability') AS nvarchar(60))
                         <> N'READ_WRITE'
                    THEN N'its database is read-only (DATABASEPROPERTYEX Updateability '
                         + CAST(DATABASEPROPERTYEX(DB_NAME(), 'Updateability')
                                AS nvarchar(60)) + N')'
                    ELSE N'' END""",
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


def _raw_claim(statement: str) -> str:
    """A claim with its free-text columns as the UTF-16LE bytes SQL Server stores, for a driver
    that cannot decode them (`RAW_CLAIM_STATEMENT_NAMES` in `bridge.dialects.base`): .NET
    strings, and so headers, may hold unpaired surrogates, which are not valid UTF-16."""
    raw = statement
    for column in ("Headers", "headers", "last_error"):
        raw = raw.replace(
            f"deleted.{column},", f"CAST(deleted.{column} AS varbinary(max)) AS {column.lower()},"
        )
    assert raw != statement, "a claim returns deleted.Headers or deleted.headers"
    return raw


STATEMENTS.update(STATE_STATEMENTS)
STATEMENTS.update(LOOKUP_STATEMENTS)
STATEMENTS.update(ERROR_GROUP_STATEMENTS)
STATEMENTS.update(
    {
        f"{name}_raw": _raw_claim(STATEMENTS[name])
        for name in ("receive_batch", "receive_range", "retry_claim_due")
    }
)
