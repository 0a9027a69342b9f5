"""SQLSTATEs -> the bridge's exception types, for every driver that reports them (pyodbc for
any ODBC database, psycopg for PostgreSQL)."""

from __future__ import annotations

import re

from bridge.exceptions import (
    AlreadyExists,
    AuthenticationFailed,
    ConnectionFailed,
    ConnectionLost,
    DatabaseError,
    DatabaseReadOnly,
    DuplicateKey,
    LockTimeout,
    MalformedValue,
    NotSupported,
    PermissionDenied,
    QueryTimeout,
    TableNotFound,
    TransientDatabaseError,
    UndefinedObject,
    ValueNotConvertible,
)

# 08001 mid-session: Driver 18's connection resiliency failed to reconnect a broken link.
_CONNECTION_LOST_STATES = {
    "08S01",
    "08001",
    "08003",
    "08007",
    "57P01",
    "57P02",
    "57P03",
    "HYT01",
}
# Class 28: 28000 invalid_authorization_specification (PostgreSQL: a role that does not exist or
# may not log in, pg_hba.conf rejects; SQL Server: login failed), 28P01 invalid_password.
_LOGIN_REFUSED_STATES = {"28000", "28P01"}
# libpq (so psycopg, whose `sqlstate` is None on connect) and psqlODBC (which says 08001) report
# a refused login before a SQLSTATE reaches the client: the server's FATAL text gives it away
# (PostgreSQL's English messages; "%s authentication failed" covers password, SCRAM, ident,
# peer, LDAP, RADIUS, GSSAPI and certificates). SQL Server: "Login failed" is error 18456.
_LOGIN_REFUSED_TEXT = re.compile(
    r"authentication failed for user|role \"[^\"]*\" does not exist|is not permitted to log in"
    r"|pg_hba\.conf|fe_sendauth: no password supplied|Login failed for user|\(18456\)",
    re.IGNORECASE,
)
# The login as the server names it, when the connection string did not say.
_LOGIN_IN_TEXT = re.compile(r"(?:for user|role) [\"']([^\"']+)[\"']", re.IGNORECASE)
_TRANSIENT_STATES = {"40001", "40P01"}
# 25006 read_only_sql_transaction: a write in a read-only transaction (a hot standby, or
# default_transaction_read_only on when the session started): the database's state, not the
# statement's fault.
_READ_ONLY_STATES = {"25006"}
# 55P03 lock_not_available: `lock_timeout` (or NOWAIT) gave up on a lock someone else holds.
_LOCK_TIMEOUT_STATES = {"55P03"}
# 57014 query_canceled: `statement_timeout` (or a DBA's pg_cancel_backend); HYT00: the ODBC
# driver's own query timeout expired (SQL Server's drivers enforce it on the client).
_QUERY_TIMEOUT_STATES = {"57014", "HYT00"}
# 22021 character_not_in_repertoire, 22P05 untranslatable_character: text the server cannot
# send in the client's encoding (a SQL_ASCII database read as UTF-8 through psqlODBC).
_NOT_CONVERTIBLE_STATES = {"22021", "22P05"}
# 22P02 invalid_text_representation: a cast of text that is not of the type (`'x'::jsonb`).
_MALFORMED_STATES = {"22P02"}
_MISSING_TABLE_STATES = {"42P01", "42S02"}
_DUPLICATE_STATES = {"23505"}
# 42P07 duplicate table (and index), 42P06 duplicate schema, 42710 duplicate object.
_ALREADY_EXISTS_STATES = {"42P07", "42P06", "42710"}
_PERMISSION_DENIED_STATES = {"42501"}
_UNDEFINED_OBJECT_STATES = {"42704"}
# 0A000 feature not supported (COPY into a table with row-level security), 42809 wrong object
# type (COPY into a view).
_NOT_SUPPORTED_STATES = {"0A000", "42809"}

# In order of precedence: the exception types that SQLSTATEs (or native error numbers) name.
_CLASSES: tuple[tuple[type[DatabaseError], set[str]], ...] = (
    (TableNotFound, _MISSING_TABLE_STATES),
    (DuplicateKey, _DUPLICATE_STATES),
    (AlreadyExists, _ALREADY_EXISTS_STATES),
    (PermissionDenied, _PERMISSION_DENIED_STATES),
    (TransientDatabaseError, _TRANSIENT_STATES),
    (DatabaseReadOnly, _READ_ONLY_STATES),
    (LockTimeout, _LOCK_TIMEOUT_STATES),
    (QueryTimeout, _QUERY_TIMEOUT_STATES),
    (ValueNotConvertible, _NOT_CONVERTIBLE_STATES),
    (MalformedValue, _MALFORMED_STATES),
    (UndefinedObject, _UNDEFINED_OBJECT_STATES),
    (NotSupported, _NOT_SUPPORTED_STATES),
)


def classify(
    database: str, state: str, native_kind: type[DatabaseError] | None, message: str, text: str
) -> DatabaseError:
    """The exception for an error with SQLSTATE `state` (or `native_kind`, the type a
    server's own error number maps to), showing `text`; `message` is searched for words that
    give a lost connection away when the state does not."""
    for kind, states in _CLASSES:
        if native_kind is kind or state in states:
            return kind(database, text)
    if native_kind is not None:
        return native_kind(database, text)
    if state in _CONNECTION_LOST_STATES or ("connection" in message.lower() and "lost" in message):
        return ConnectionLost(database, text)
    return DatabaseError(database, text)


def connect_failure(
    database: str, state: str, message: str, text: str, login: str | None
) -> ConnectionFailed:
    """The exception for a connection that could not be opened: AuthenticationFailed when the
    server refused the login (SQLSTATE class 28, or its words in `message` where the driver
    reports no SQLSTATE), else ConnectionFailed; `text` is what it shows (free of secrets).
    `login`: the user name the connection string gives, if any (else the server's message
    may name it)."""
    if state in _LOGIN_REFUSED_STATES or _LOGIN_REFUSED_TEXT.search(message):
        if login is None and (named := _LOGIN_IN_TEXT.search(message)) is not None:
            login = named.group(1)
        return AuthenticationFailed(database, text, login=login)
    return ConnectionFailed(database, text)
