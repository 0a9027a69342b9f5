"""What `/healthz` and `/readyz` answer (`bridge.daemon.listener`), from what the daemon knows.

- **Live** (`/healthz`): the daemon's main loop found its workers and watchers making progress
  within `LIVENESS_LIMIT`: the same check that feeds systemd's watchdog (`WATCHDOG=1`,
  `bridge.daemon.runtime`). A hung worker stops both.
- **Ready** (`/readyz`): the daemon forwards everything it covers. Every forwarder is served
  (its forwarding database took this daemon's last heartbeat, `bridge.daemon.heartbeat`: what
  `sfbridge status` calls served) and its batches succeed (`bridge.daemon.forwarder_health`);
  every database is usable (not unreachable, read-only, not ready or refusing the login:
  `bridge.outages`), and none has left a check unanswered for longer than `unanswered_after`.
  A forwarder paused with `sfbridge pause` is a plan, not a fault: it does not make the daemon
  unready, and the body says it is paused.

Destinations are checked every heartbeat by `DestinationChecks` (a connection and the
dialect's read-only question, `bridge.connections.require_writes`), so that a destination that
goes down is seen within one heartbeat even when no message is on its way there. What a check
finds goes into the outage tracker, as the first failed delivery would put it: `status`, the
metrics, the systemd status line and `/readyz` then say the same, and the tracker's probe
(`bridge.daemon.probes`) finds it usable again.

The answers are built from state in memory, under short locks: a request never waits on a
database.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bridge.config.model import BridgeConfig
from bridge.connections import Connections, require_writes
from bridge.dialects import dialect_for
from bridge.exceptions import AuthenticationFailed, DatabaseError, DatabaseReadOnly
from bridge.outages import DatabaseState, OutageTracker
from bridge.secrets import for_terminal

# How long the main loop may go without finding the workers alive before `/healthz` fails:
# the loop looks every second; a reload stops and starts the workers within this.
LIVENESS_LIMIT = 30.0

# A check of a database counts as unanswered after this share of a heartbeat, at least
# `MIN_UNANSWERED` s: a check takes milliseconds, and a silent database would otherwise look
# usable until the query timeout.
UNANSWERED_SHARE = 0.5
MIN_UNANSWERED = 1.0

_TROUBLE_WORDS = {
    "unreachable": "cannot be reached",
    "read-only": "does not accept writes (read-only)",
    "not-ready": "is not ready for the bridge",
    "auth-failed": "refuses the login",
    "not checked yet": "is not checked yet",
}


class Liveness:
    """When the daemon's main loop last found its workers alive. Thread-safe enough: one
    writer, and a float read whole."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._fed: float | None = None

    def fed(self) -> None:
        self._fed = self._clock()

    def check(self) -> tuple[bool, dict[str, Any]]:
        """(live, the JSON body of `/healthz`)."""
        fed = self._fed
        if fed is None:
            return False, {"live": False, "reason": "starting: the workers have not run yet"}
        age = self._clock() - fed
        live = age <= LIVENESS_LIMIT
        body: dict[str, Any] = {"live": live, "workers_seen_alive_seconds_ago": round(age, 1)}
        if not live:
            body["reason"] = (
                f"no worker progress for {age:.0f} s: a worker or watcher is hung (systemd's "
                "watchdog is not fed either)"
            )
        return live, body


@dataclass(frozen=True)
class CheckState:
    """One database's checks: `error` of the last one that ended (None: it passed, or none
    ended yet: `passed` False), `running_since` (monotonic) while one is in progress."""

    passed: bool = False
    error: str | None = None
    running_since: float | None = None


class Checks:
    """Thread-safe record of checks per database (heartbeats, destination checks)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._states: dict[str, CheckState] = {}
        self._lock = threading.Lock()

    def begin(self, database: str) -> None:
        with self._lock:
            before = self._states.get(database, CheckState())
            self._states[database] = CheckState(before.passed, before.error, self.clock())

    def end(self, database: str, error: str | None) -> None:
        with self._lock:
            self._states[database] = CheckState(error is None, error)

    def states(self) -> dict[str, CheckState]:
        with self._lock:
            return dict(self._states)


def destination_databases(config: BridgeConfig) -> list[str]:
    """The databases messages are delivered to: routes' and proxy queues' destinations."""
    named = [route.database for route in config.routes]
    named += [f.destination.database for f in config.forwarders if f.destination is not None]
    return list(dict.fromkeys(named))


class DestinationChecks:
    """Checks each destination database every heartbeat (`check`, a scheduled job per
    database) unless the outage tracker already has it in trouble; a failure is recorded there.
    One connection per database, kept between checks (`bridge.daemon.budget` counts it)."""

    def __init__(self, config: BridgeConfig, tracker: OutageTracker) -> None:
        self._config = config
        self._tracker = tracker
        self.checks = Checks()
        self._connections = {
            database: Connections(config.databases, tracker)
            for database in destination_databases(config)
        }

    @property
    def databases(self) -> list[str]:
        return list(self._connections)

    def check(self, database: str) -> None:
        """The scheduled job. Never raises."""
        if self._tracker.in_trouble(database):
            self.checks.end(database, None)  # the tracker's probe looks after it
            return
        self.checks.begin(database)
        try:
            self._ask(database)
        except DatabaseReadOnly as error:
            self._failed(database, "read-only", str(error))
        except AuthenticationFailed as error:
            self.checks.end(database, str(error))
            self._tracker.record_trouble(database, "auth-failed", str(error), error.login)
        except DatabaseError as error:
            self._failed(database, "unreachable", str(error))
        else:
            self.checks.end(database, None)

    def _ask(self, database: str) -> None:
        """Whether `database` takes writes, on the kept connection; a kept connection that
        fails is asked again on a new one, and only that answer counts: a session ended by an
        administrator, a pooler or a failover is no outage (the workers reconnect too)."""
        connections = self._connections[database]
        dialect = dialect_for(self._config.databases[database].dialect)
        kept = connections.is_open(database)
        try:
            require_writes(connections.get(database), dialect, database)
        except DatabaseReadOnly:
            raise
        except DatabaseError:
            if not kept:
                raise
            connections.discard(database)
            require_writes(connections.get(database), dialect, database)

    def _failed(self, database: str, kind: str, error: str) -> None:
        self._connections[database].discard(database)
        self.checks.end(database, error)
        self._tracker.record_trouble(database, kind, error)  # type: ignore[arg-type]

    def close(self) -> None:
        """Close the connections, but those of a check still waiting for an answer: closing
        them could wait as long (they go with the thread, or the process)."""
        states = self.checks.states()
        for database, connections in self._connections.items():
            state = states.get(database)
            if state is None or state.running_since is None:
                connections.close()


@dataclass(frozen=True)
class Seen:
    """What the daemon knows at one moment, for `readiness`."""

    started: bool
    workers_alive: bool
    failing: Mapping[str, str | None]  # forwarder -> its last error
    heartbeats: Mapping[str, CheckState]  # forwarding database -> its heartbeats
    destination_checks: Mapping[str, CheckState]
    databases: Mapping[str, DatabaseState]  # the outage tracker's states
    paused: Iterable[str] = ()  # forwarders paused as a whole
    now: float = 0.0  # the clock of the check states' `running_since`


def readiness(config: BridgeConfig, seen: Seen, heartbeat: float) -> tuple[bool, dict[str, Any]]:
    """(ready, the JSON body of `/readyz`): `not_ready` says in a sentence each what is wrong,
    naming the forwarder or database; `forwarders` and `databases` give every one's state."""
    problems: list[str] = []
    if not seen.started:
        problems.append("the daemon is starting or reloading its workers")
    elif not seen.workers_alive:
        problems.append("a worker or watcher is hung (no progress)")
    unanswered_after = max(MIN_UNANSWERED, heartbeat * UNANSWERED_SHARE)
    databases: dict[str, dict[str, Any]] = {}
    for database in config.databases:
        found = _database_entry(
            database, seen, unanswered_after, seen.heartbeats.get(database), config
        )
        if found is not None:
            databases[database] = found
    paused = set(seen.paused)
    forwarders: dict[str, dict[str, Any]] = {}
    for forwarder in config.forwarders:
        served = databases.get(forwarder.database, {}).get("heartbeat") == "written"
        entry: dict[str, Any] = {"database": forwarder.database, "served": served}
        if forwarder.name in seen.failing:
            entry["state"] = "failing"
            entry["error"] = for_terminal(seen.failing[forwarder.name] or "")
            problems.append(f"forwarder '{forwarder.name}' cannot forward: {entry['error']}")
        elif forwarder.name in paused:
            entry["state"] = "paused"
        else:
            entry["state"] = "forwarding"
        if not served:
            problems.append(
                f"forwarder '{forwarder.name}' is not served: this daemon's heartbeat is not "
                f"in database '{forwarder.database}'"
            )
        forwarders[forwarder.name] = entry
    for name, entry in databases.items():
        if entry["state"] != "up":
            said = _TROUBLE_WORDS.get(entry["state"], entry["state"])
            error = f": {entry['error']}" if entry.get("error") else ""
            problems.append(f"database '{name}' {said}{error}")
    return not problems, {
        "ready": not problems,
        "not_ready": problems,
        "forwarders": forwarders,
        "databases": databases,
    }


def _database_entry(
    database: str,
    seen: Seen,
    unanswered_after: float,
    beats: CheckState | None,
    config: BridgeConfig,
) -> dict[str, Any] | None:
    """One database's state, or None for a database this daemon neither forwards from nor
    delivers to."""
    check = seen.destination_checks.get(database)
    forwarding = any(f.database == database for f in config.forwarders)
    destination = database in destination_databases(config)
    if not destination and not forwarding:
        return None
    entry: dict[str, Any] = {"state": "up"}
    tracked = seen.databases.get(database)
    if tracked is not None and tracked.in_trouble:
        entry = {"state": tracked.state, "since": f"{tracked.since:%Y-%m-%dT%H:%M:%S}Z"}
        if tracked.last_error:
            entry["error"] = for_terminal(tracked.last_error)
    elif destination and (check is None or not (check.passed or check.error)):
        # Before its first check has ended (the checks start with the workers).
        entry = {"state": "not checked yet"}
    unanswered = False
    for what, state in (("heartbeat", beats), ("check", check)):
        if state is None:
            continue
        running = state.running_since
        if running is not None and seen.now - running > unanswered_after:
            unanswered = unanswered or what == "heartbeat"
            if entry["state"] == "up":
                entry["state"] = "no answer"
                entry["error"] = f"a {what} has had no answer for {seen.now - running:.0f} s"
        elif what == "heartbeat" and state.error is not None and entry["state"] == "up":
            entry["state"] = "unreachable"
            entry["error"] = for_terminal(f"heartbeat not written: {state.error}")
    if forwarding:
        written = beats is not None and beats.passed and not unanswered
        entry["heartbeat"] = "written" if written else "not written"
    return entry
