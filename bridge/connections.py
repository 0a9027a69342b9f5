"""Opening connections: `connect` for one configured database, `Connections`, the per-worker
cache (one open connection per database, reopened after failures), and what a connection finds
of its database (`require_writes`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from bridge.config.model import DatabaseConfig
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import AuthenticationFailed, Connection, DatabaseReadOnly
from bridge.exceptions import DatabaseNotWritable
from bridge.outages import OutageTracker

log = logging.getLogger(__name__)


def connect(database: DatabaseConfig, *, create: bool = False) -> Connection:
    """Open a connection to `database`, as its dialect does (driver, options, session setup).

    `create` lets a file-based dialect (SQLite) create a missing file (used by `install` and
    the demo); everywhere else a missing file is an unavailable database. Raises
    ConnectionFailed, and UnsetVariable where its `connection` or `path` names an environment
    variable that was not set (the one place a database's secrets are needed).
    """
    database.require_environment()
    return dialect_for(database.dialect).connect(database, create=create)


@dataclass(frozen=True)
class ReachedServer:
    """Where a connection landed: `server` (PostgreSQL `host:port`, SQL Server its name and
    port) and `read_only`, why it refuses writes there ("" when it accepts them)."""

    server: str
    read_only: str

    @property
    def accepts_writes(self) -> bool:
        return not self.read_only


def reached_server(connection: Connection, dialect: Dialect) -> ReachedServer | None:
    """Ask the server where `connection` landed (the dialect's `server_role`); None where the
    dialect cannot tell (a file). With several hosts in a connection string this is the one
    that answered, which `check` reports. Raises DatabaseError."""
    if "server_role" not in dialect.statements:
        return None
    connection.begin_read()
    try:
        [(server, read_only)] = connection.query(dialect.statements["server_role"])
    finally:
        connection.rollback()
    return ReachedServer(str(server), str(read_only or ""))


def require_writable(database: str, connection: Connection, dialect: Dialect) -> None:
    """Raise DatabaseNotWritable, naming the server and what to do, when `connection` landed
    where writes are refused (a standby): `install` would fail on its first CREATE."""
    reached = reached_server(connection, dialect)
    if reached is not None and not reached.accepts_writes:
        raise DatabaseNotWritable(
            database,
            f"the connection reached {reached.server}, which does not accept writes: "
            f"{reached.read_only}",
            advice=dialect.read_only_advice or None,
        )


def load_drivers(databases: Mapping[str, DatabaseConfig], *, quiet: bool = False) -> None:
    """Import the drivers these databases are opened with, once, before threads open their
    first connections: otherwise the first connection of every thread waits for the same
    import (psycopg: about 0.1 s on a small machine), and a daemon's first batch with it.

    A driver that cannot be imported is logged (unless `quiet`: a daemon's worker process,
    whose daemon has said so), not raised: the databases that need it fail on their own when
    connected to (each with its error), and the others go on."""
    reported: set[tuple[str, str]] = set()
    for database in databases.values():
        load = dialect_for(database.dialect).load_driver
        if load is None:
            continue
        try:
            load(database)
        except ImportError as error:
            if not quiet and (database.dialect, str(error)) not in reported:
                log.error("database '%s': its driver cannot be loaded: %s", database.name, error)
            reported.add((database.dialect, str(error)))


class Connections:
    """Connections owned by one worker (a connection is never used by two threads at once: a
    worker's delivery threads, `bridge.forwarding.side_by_side`, each use the connections of
    their own database only).

    `logins`: a daemon's outage tracker. A login the server refused is recorded there, and
    while it stands no new connection to that database logs in (the daemon's probe alone tries
    it, rarely: `bridge.outages`); `get` raises AuthenticationFailed at once instead."""

    def __init__(
        self, databases: Mapping[str, DatabaseConfig], logins: OutageTracker | None = None
    ) -> None:
        self._databases = databases
        self._open: dict[tuple[str, str], Connection] = {}
        self.logins = logins

    def get(self, database: str, role: str = "") -> Connection:
        """An open connection to `database`; a `role` other than the default one is a second
        connection of its own (e.g. for records committed apart from a batch). Raises
        ConnectionFailed (AuthenticationFailed while the login is refused)."""
        connection = self._open.get((database, role))
        if connection is None:
            logins = self.logins
            if logins is not None and (refused := logins.refused_login(database)) is not None:
                when = f"{refused.next_probe_at:%H:%M:%S} UTC" if refused.next_probe_at else "later"
                last = (refused.last_error or "").removeprefix(f"database '{database}': ")
                raise AuthenticationFailed(
                    database,
                    f"its login is refused; the daemon tries it again at {when}, or at once "
                    f"after a reload ({last})",
                    login=refused.login,
                )
            try:
                connection = connect(self._databases[database])
            except AuthenticationFailed as error:
                if logins is not None:
                    logins.record_trouble(database, "auth-failed", str(error), error.login)
                raise
            self._open[(database, role)] = connection
        return connection

    def is_open(self, database: str, role: str = "") -> bool:
        """Whether a connection to `database` is held (`get` would not log in)."""
        return (database, role) in self._open

    def discard(self, database: str, role: str = "") -> None:
        """Drop a connection that failed; the next `get` opens a new one."""
        connection = self._open.pop((database, role), None)
        if connection is not None:
            connection.rollback()
            connection.close()

    def close(self) -> None:
        for database, role in list(self._open):
            self.discard(database, role)


def require_writes(connection: Connection, dialect: Dialect, database: str) -> None:
    """Raises DatabaseReadOnly when `database` answers `connection` but takes no writes now (a
    hot standby, a read-only or restoring database), as the dialect's `read_only_reason` says.
    `connection` must have no transaction open; none is left open. Raises the DatabaseError
    family as the query does."""
    try:
        connection.begin_read()
        rows = connection.query(dialect.sql("read_only_reason"))
    finally:
        connection.rollback()
    reason = rows[0][0] if rows else None
    if reason:
        raise DatabaseReadOnly(database, f"does not accept writes: {reason}")


@contextmanager
def savepoint(
    connection: Connection, dialect: Dialect, *, undo_on: tuple[type[BaseException], ...]
) -> Iterator[None]:
    """Run the block in a savepoint of the open transaction: an exception of `undo_on` rolls
    back to it (and propagates), so the transaction goes on as if the block had not run."""
    statements = dialect.statements
    connection.execute(statements["savepoint"])
    try:
        yield
    except undo_on:
        connection.execute(statements["rollback_to_savepoint"])
        raise
    # Empty where the dialect has no RELEASE (SQL Server keeps savepoints to the end).
    if statements["release_savepoint"]:
        connection.execute(statements["release_savepoint"])
