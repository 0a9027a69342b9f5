"""Warnings at start, from a look at the databases: one when the daemon's login is a superuser
(PostgreSQL) or sysadmin / db_owner (SQL Server) in any of its databases (it then may do
anything there, where it needs only what `sfbridge install --print-grants` prints), and one per
queue whose unquoted dot reads as a missing table while the table of the whole name exists
(`bridge.storage.dotted_names`: the daemon would forward from an empty queue)."""

from __future__ import annotations

import logging
import threading

from bridge.config.model import BridgeConfig
from bridge.connections import connect
from bridge.dialects import dialect_for
from bridge.exceptions import DatabaseError
from bridge.storage.dotted_names import dotted_names
from bridge.storage.grants import login_powers

log = logging.getLogger(__name__)


def superuser_databases(config: BridgeConfig) -> list[tuple[str, str, str]]:
    """(database, login, power) for each reachable database where the login is a superuser
    or the like; a database that cannot be reached or read is left out. Never raises."""
    found: list[tuple[str, str, str]] = []
    for name, database in config.databases.items():
        dialect = dialect_for(database.dialect)
        if "login_powers" not in dialect.statements:
            continue
        try:
            connection = connect(database)
        except DatabaseError:
            continue
        try:
            powers = login_powers(connection, dialect)
        except DatabaseError:
            continue
        finally:
            connection.close()
        if powers is not None and powers.severe:
            found.append((name, powers.login, powers.powers[0]))
    return found


def warn_if_superuser(config: BridgeConfig) -> None:
    """Log one warning naming every database where the login is a superuser."""
    found = superuser_databases(config)
    if found:
        log.warning(
            "the bridge's login is %s: it may do anything there, and so may a mistake; run "
            "the daemon as a dedicated login ('sfbridge install --print-grants' prints the "
            "statements that create one)",
            "; ".join(f"'{login}' {power} in database '{name}'" for name, login, power in found),
        )


def warn_of_dotted_names(config: BridgeConfig) -> None:
    """Log a warning for each forwarder queue that falls into the dotted-name trap; a database
    that cannot be reached or read is left out. Never raises."""
    for database in sorted({forwarder.database for forwarder in config.forwarders}):
        try:
            connection = connect(config.databases[database])
        except DatabaseError:
            continue
        try:
            traps = dotted_names(config, database, connection)
        except DatabaseError:
            continue
        finally:
            connection.close()
        for trap in traps:
            log.warning("%s", trap)


def _start_checks(config: BridgeConfig) -> None:
    warn_of_dotted_names(config)
    warn_if_superuser(config)


def start_login_check(config: BridgeConfig) -> threading.Thread:
    """`warn_of_dotted_names` and `warn_if_superuser` in a thread of their own: a database
    that does not answer must not hold up the start."""
    thread = threading.Thread(target=_start_checks, args=(config,), name="login check", daemon=True)
    thread.start()
    return thread
