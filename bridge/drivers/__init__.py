"""Database drivers. The only modules that import pyodbc or sqlite3.

Everything above this layer talks to a `Connection` and sees the bridge's own exception
types, never a driver exception or a SQLSTATE.
"""

from bridge.drivers.base import (
    AlreadyExists,
    Connection,
    ConnectionFailed,
    ConnectionLost,
    DatabaseError,
    DatabaseUnavailable,
    DuplicateKey,
    PermissionDenied,
    QueueNotFound,
    TransientDatabaseError,
)
from bridge.drivers.factory import connect

__all__ = [
    "AlreadyExists",
    "Connection",
    "ConnectionFailed",
    "ConnectionLost",
    "DatabaseError",
    "DatabaseUnavailable",
    "DuplicateKey",
    "PermissionDenied",
    "QueueNotFound",
    "TransientDatabaseError",
    "connect",
]
