"""The SQL Server dialect's DDL helper for the bridge's own tables, and the statements of the
tables in which daemons tell `sfbridge status` what they see: destination and forwarder
states, and the daemons themselves (`bridge.storage.daemons`)."""

from __future__ import annotations

# SQL Server errors the transport swallows when two installers create the same table.
_ALREADY_EXISTS = "2714, 1913"


def create_if_missing(table: str, ddl: str) -> str:
    """One idempotent batch creating the table `{table}` with `ddl` (see the package docstring)."""
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

_FORWARDER_STATES_DDL = """
    CREATE TABLE {forwarder_states} (
        forwarder nvarchar(200) NOT NULL,
        reported_by nvarchar(200) NOT NULL,
        state nvarchar(20) NOT NULL,
        since datetime2 NOT NULL,
        failures bigint NOT NULL,
        last_error nvarchar(max) NULL,
        updated_at datetime2 NOT NULL,
        PRIMARY KEY (forwarder, reported_by)
    )"""

_DAEMONS_DDL = """
    CREATE TABLE {daemons} (
        daemon nvarchar(200) NOT NULL PRIMARY KEY,
        host nvarchar(200) NOT NULL,
        pid bigint NOT NULL,
        started_at datetime2 NOT NULL,
        heartbeat_at datetime2 NOT NULL,
        heartbeat_seconds float NOT NULL,
        state nvarchar(20) NOT NULL,
        stopped_at datetime2 NULL,
        config_fingerprint nvarchar(64) NULL,
        forwarders nvarchar(max) NULL
    )"""

STATE_STATEMENTS: dict[str, str] = {
    "create_destination_states_table": create_if_missing(
        "destination_states", _DESTINATION_STATES_DDL
    ),
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
    # Whether each daemon's batches of a forwarder succeed (`bridge.daemon.forwarder_health`), one
    # row per forwarder and daemon.
    "create_forwarder_states_table": create_if_missing("forwarder_states", _FORWARDER_STATES_DDL),
    "forwarder_state_save": """
        DECLARE @forwarder nvarchar(200) = ?, @reported_by nvarchar(200) = ?,
                @state nvarchar(20) = ?, @since datetime2 = ?, @failures bigint = ?,
                @last_error nvarchar(max) = ?, @updated_at datetime2 = ?;
        UPDATE {forwarder_states} WITH (UPDLOCK, HOLDLOCK)
        SET state = @state, since = @since, failures = @failures, last_error = @last_error,
            updated_at = @updated_at
        WHERE forwarder = @forwarder AND reported_by = @reported_by;
        IF @@ROWCOUNT = 0
            INSERT INTO {forwarder_states} (forwarder, reported_by, state, since, failures,
                                            last_error, updated_at)
            VALUES (@forwarder, @reported_by, @state, @since, @failures, @last_error,
                    @updated_at)""",
    # Which daemons run on this forwarding database (`bridge.storage.daemons`): one row per
    # daemon process, its heartbeat, and whether it stopped cleanly.
    "create_daemons_table": create_if_missing("daemons", _DAEMONS_DDL),
    # A daemons table made by an sfbridge before the daemons said what they serve.
    "daemons_add_identity": """
        IF COL_LENGTH(N{daemons_literal}, 'config_fingerprint') IS NULL
            ALTER TABLE {daemons} ADD config_fingerprint nvarchar(64) NULL,
                                      forwarders nvarchar(max) NULL""",
    "daemon_save": """
        DECLARE @daemon nvarchar(200) = ?, @host nvarchar(200) = ?, @pid bigint = ?,
                @started_at datetime2 = ?, @heartbeat_at datetime2 = ?,
                @heartbeat_seconds float = ?, @state nvarchar(20) = ?,
                @stopped_at datetime2 = ?, @config_fingerprint nvarchar(64) = ?,
                @forwarders nvarchar(max) = ?;
        UPDATE {daemons} WITH (UPDLOCK, HOLDLOCK)
        SET host = @host, pid = @pid, started_at = @started_at, heartbeat_at = @heartbeat_at,
            heartbeat_seconds = @heartbeat_seconds, state = @state, stopped_at = @stopped_at,
            config_fingerprint = @config_fingerprint, forwarders = @forwarders
        WHERE daemon = @daemon;
        IF @@ROWCOUNT = 0
            INSERT INTO {daemons} (daemon, host, pid, started_at, heartbeat_at,
                                   heartbeat_seconds, state, stopped_at, config_fingerprint,
                                   forwarders)
            VALUES (@daemon, @host, @pid, @started_at, @heartbeat_at, @heartbeat_seconds,
                    @state, @stopped_at, @config_fingerprint, @forwarders)""",
}
