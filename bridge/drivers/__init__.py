"""Database drivers. The only modules that import pyodbc or sqlite3.

Everything above this layer talks to a `Connection` and sees the bridge's own exception
types, never a driver exception or a SQLSTATE. Drivers know no dialect: a dialect's `connect`
(bridge.dialects) picks the driver and hands it the options and error numbers it needs;
`bridge.connections.connect` opens a connection for a configured database.
"""

from bridge.drivers.base import Connection, Unreadable
from bridge.exceptions import (
    AlreadyExists,
    AuthenticationFailed,
    ConnectionFailed,
    ConnectionLost,
    DatabaseError,
    DatabaseReadOnly,
    DatabaseUnavailable,
    DuplicateKey,
    LockTimeout,
    NotSupported,
    PermissionDenied,
    QueryTimeout,
    TableNotFound,
    TransientDatabaseError,
    UndefinedObject,
    ValueNotConvertible,
)

__all__ = [
    "AlreadyExists",
    "AuthenticationFailed",
    "Connection",
    "ConnectionFailed",
    "ConnectionLost",
    "DatabaseError",
    "DatabaseReadOnly",
    "DatabaseUnavailable",
    "DuplicateKey",
    "LockTimeout",
    "NotSupported",
    "PermissionDenied",
    "QueryTimeout",
    "TableNotFound",
    "TransientDatabaseError",
    "UndefinedObject",
    "Unreadable",
    "ValueNotConvertible",
]
