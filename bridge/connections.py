"""Per-worker connection cache: one open connection per database, reopened after failures."""

from __future__ import annotations

from collections.abc import Mapping

from bridge.config.model import DatabaseConfig
from bridge.drivers import Connection, connect


class Connections:
    """Connections owned by one worker thread (connections are never shared across threads)."""

    def __init__(self, databases: Mapping[str, DatabaseConfig]) -> None:
        self._databases = databases
        self._open: dict[str, Connection] = {}

    def get(self, database: str) -> Connection:
        """An open connection to `database`. Raises ConnectionFailed."""
        connection = self._open.get(database)
        if connection is None:
            connection = connect(self._databases[database])
            self._open[database] = connection
        return connection

    def discard(self, database: str) -> None:
        """Drop a connection that failed; the next `get` opens a new one."""
        connection = self._open.pop(database, None)
        if connection is not None:
            connection.rollback()
            connection.close()

    def close(self) -> None:
        for database in list(self._open):
            self.discard(database)
