"""Open a connection for a configured database."""

from __future__ import annotations

from bridge.config.model import DatabaseConfig
from bridge.drivers.base import Connection


def connect(database: DatabaseConfig, *, create: bool = False) -> Connection:
    """Open a connection to `database`.

    `create` lets SQLite create a missing file (used by `install` and the demo); everywhere
    else a missing SQLite file is an unavailable database. Raises ConnectionFailed.
    """
    if database.dialect == "sqlite":
        from bridge.drivers.sqlite import SqliteConnection

        assert database.path is not None
        return SqliteConnection(database.name, database.path, create=create)
    from bridge.dialects import dialect_for
    from bridge.drivers.odbc import OdbcConnection

    assert database.connection is not None
    return OdbcConnection(
        database.name,
        database.connection,
        dialect=database.dialect,
        timeout=database.connect_timeout,
        session_setup=dialect_for(database.dialect).session_setup,
    )
