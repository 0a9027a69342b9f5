"""Database drivers. The only modules that import pyodbc or sqlite3.

Everything above this layer talks to a `Connection` and sees the bridge's own exception
types, never a driver exception or a SQLSTATE.
"""

from bridge.drivers.base import (
    Connection,
    ConnectionFailed,
    ConnectionLost,
    DatabaseError,
    DatabaseUnavailable,
    DuplicateKey,
    QueueNotFound,
    TransientDatabaseError,
)
from bridge.drivers.factory import connect

__all__ = [
    "Connection",
    "ConnectionFailed",
    "ConnectionLost",
    "DatabaseError",
    "DatabaseUnavailable",
    "DuplicateKey",
    "QueueNotFound",
    "TransientDatabaseError",
    "connect",
]
