"""Probes of databases in trouble: one look per database per interval, so that no worker waits
on a dead database (`bridge.outages`). Run by upkeep, in the daemon's own process only: its
worker processes hear from it (`bridge.daemon.processes`)."""

from __future__ import annotations

from bridge.config.model import BridgeConfig
from bridge.connections import Connections, require_writes
from bridge.dialects import dialect_for
from bridge.exceptions import (
    AuthenticationFailed,
    BridgeTableMissing,
    DatabaseError,
    DatabaseReadOnly,
    PermissionDenied,
)
from bridge.outages import OutageTracker
from bridge.storage.ledger import (
    RUNTIME_DDL_OFF_ADVICE,
    ensure_ledger,
    ledger_grant_advice,
    ledger_problem,
)

# How often the outage tracker's due probes are looked for.
PROBE_TICK = 1.0


def probe_databases(config: BridgeConfig, tracker: OutageTracker) -> None:
    """Look at each database in trouble whose probe is due; record what is found.

    A probe connects, asks whether the database takes writes (a read-only one answers every
    connection: `read-only` until a new session finds it writable), and makes sure the ledger
    is there (creating it when allowed), which is what delivery needs of a destination
    database; a database whose login was refused (which may be a forwarding database) only
    logs in: delivery heals a missing ledger on its way. Never raises.
    """
    due = tracker.due_for_probe()
    if not due:
        return
    connections = Connections(config.databases)
    try:
        for database in due:
            refused = tracker.refused_login(database) is not None
            try:
                connection = connections.get(database)
                if refused:
                    tracker.record_up(database)
                    continue
                dialect = dialect_for(config.databases[database].dialect)
                require_writes(connection, dialect, database)
                ensure_ledger(connection, config, database, create=config.install.at_runtime)
                tracker.record_up(database)
            except DatabaseReadOnly as error:
                connections.discard(database)
                tracker.record_trouble(database, "read-only", str(error))
            except BridgeTableMissing:
                tracker.record_trouble(
                    database, "not-ready", ledger_problem(config, database, RUNTIME_DDL_OFF_ADVICE)
                )
            except PermissionDenied as error:
                advice = ledger_grant_advice(config, connections, database, error)
                connections.discard(database)
                tracker.record_trouble(
                    database, "not-ready", ledger_problem(config, database, advice)
                )
            except AuthenticationFailed as error:
                tracker.record_trouble(database, "auth-failed", str(error), error.login)
            except DatabaseError as error:
                connections.discard(database)
                tracker.record_trouble(database, "unreachable", str(error))
    finally:
        connections.close()
