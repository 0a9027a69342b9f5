"""Which destination databases are in trouble right now, and when to look at them again.

An outage is a state of a database, not a failure of each message. When a destination cannot
be reached, answers but takes no writes (`read-only`: a hot standby after a failover, a frozen
or restoring database), or lacks a bridge table that the bridge may not create, the first
failure puts the database in trouble; from then on its messages fail at once with that error,
without every worker and batch waiting out a connect timeout, until a probe finds it usable
(and writable) again.

Who probes: in the daemon, one scheduled job (`external_probe`), once per probe interval, so
no worker ever blocks on a dead database, and the daemon's worker processes learn what it finds
(`listener`, `bridge.daemon.processes`); standalone (tests, one-off drains), the first
delivery attempt after the interval is the probe, and only one caller gets to make it.

A refused login (`auth-failed`) is a state of its own: it does not pass by itself, and every
attempt counts against an account lock-out policy. It is tried again after the probe interval,
then after twice as long each time, up to `AUTH_RETRY_MAX_SECONDS` (`auth_retry_delay`); in the
daemon nothing else logs in meanwhile (`refused_login`, which `bridge.connections.Connections`
asks). A reload starts a new tracker: the login is tried again at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from bridge.messages import about, utcnow
from bridge.secrets import mask_secrets

log = logging.getLogger(__name__)

State = Literal["up", "unreachable", "read-only", "not-ready", "auth-failed"]
TroubleKind = Literal["unreachable", "read-only", "not-ready", "auth-failed"]

# What the log says of each kind of outage (a refused login says more: `_say_refused`).
_TROUBLE_WORDS = {
    "unreachable": "cannot be reached",
    "read-only": "does not accept writes (read-only)",
    "not-ready": "is not ready for the bridge",
}

# A refused login is tried again at most this far apart (after doubling from the interval).
AUTH_RETRY_MAX_SECONDS = 600.0

# While a database stays in trouble, say so again this often (the first time is at once).
REMINDER_SECONDS = 600.0

# Told of each change of state: the name of the `record_...` method and its arguments.
Listener = Callable[[str, tuple[Any, ...]], None]


@dataclass(frozen=True)
class DatabaseState:
    """What the bridge last saw of one destination database. Times are naive UTC."""

    database: str
    state: State
    since: datetime
    last_error: str | None = None
    next_probe_at: datetime | None = None
    login: str | None = None  # the user name of a refused login (auth-failed)

    @property
    def in_trouble(self) -> bool:
        return self.state != "up"


class OutageTracker:
    """Shared by all workers of a daemon; thread-safe."""

    def __init__(
        self,
        probe_interval: float,
        *,
        external_probe: bool = False,
        clock: Callable[[], float] = time.monotonic,
        quiet: bool = False,
    ) -> None:
        """`quiet`: log nothing (a worker process, whose daemon logs what it passes on)."""
        # `clock` is time.monotonic but for tests, which move time on instead of sleeping.
        self._clock = clock
        self._quiet = quiet
        # Told of each change recorded here, but not of those passed in as `relayed`.
        self.listener: Listener | None = None
        self._interval = probe_interval
        self._external = external_probe
        self._states: dict[str, DatabaseState] = {}
        self._next_probe: dict[str, float] = {}  # monotonic
        self._next_reminder: dict[str, float] = {}
        # Refused logins in a row per database, and whether a new login was let through
        # since the last one (a refusal that was not tried again is the same refusal told twice).
        self._refusals: dict[str, int] = {}
        self._tried: set[str] = set()
        # Tables another session held locked past the query timeout: (database, table) ->
        # (monotonic time until which they count as busy, the error).
        self._busy: dict[tuple[str, str], tuple[float, str]] = {}
        self._lock = threading.Lock()
        self.version = 0  # grows with every change of state, for whoever publishes them

    @property
    def probe_interval(self) -> float:
        return self._interval

    def trouble(self, database: str) -> DatabaseState | None:
        """The database's trouble, or None when the caller should go ahead and try.

        Without an external prober, a caller arriving after the probe interval is let through
        as the probe (the others keep getting the trouble until it reports back).
        """
        with self._lock:
            state = self._states.get(database)
            if state is None or not state.in_trouble:
                return None
            if not self._external and self._clock() >= self._next_probe[database]:
                self._schedule_probe(database, granted=True)
                return None
            return state

    def record_trouble(
        self,
        database: str,
        kind: TroubleKind,
        error: str,
        login: str | None = None,
        *,
        relayed: bool = False,
    ) -> None:
        """`database` failed as a whole (unreachable, not ready for the bridge, or its
        login refused: `login` is then the user name, where known). `relayed`: another
        process of the daemon saw it (the listener is not told)."""
        with self._lock:
            before = self._states.get(database)
            if kind == "auth-failed":
                self._record_refused(database, before, error, login)
            else:
                self._record_outage(database, kind, before, error)
            self.version += 1
        self._tell(relayed, "record_trouble", database, kind, error, login)

    def _record_outage(
        self, database: str, kind: TroubleKind, before: DatabaseState | None, error: str
    ) -> None:
        # Caller holds the lock.
        now = self._clock()
        if before is None or before.state != kind:
            since = utcnow()
            self._say_trouble(database, kind, error, since=None)
            self._next_reminder[database] = now + REMINDER_SECONDS
        else:
            since = before.since
            if now >= self._next_reminder.get(database, 0.0):
                self._say_trouble(database, kind, error, since=since)
                self._next_reminder[database] = now + REMINDER_SECONDS
        self._states[database] = DatabaseState(database, kind, since, error)
        self._schedule_probe(database)

    def _record_refused(
        self, database: str, before: DatabaseState | None, error: str, login: str | None
    ) -> None:
        # Caller holds the lock. Said once, when the state starts (not reminded: the state
        # stays until a person acts, and the metric and `status` show it meanwhile).
        if before is not None and before.state == "auth-failed":
            if database not in self._tried:
                return  # the refusal already recorded, told again (another worker, a process)
            self._refusals[database] += 1
            since = before.since
            login = login or before.login
        else:
            self._refusals[database] = 1
            since = utcnow()
        self._tried.discard(database)
        self._states[database] = DatabaseState(database, "auth-failed", since, error, login=login)
        self._schedule_probe(database)
        if before is None or before.state != "auth-failed":
            self._say_refused(database, error, login)

    def refused_login(self, database: str) -> DatabaseState | None:
        """The state of `database` while its login is refused, for a daemon's connections to
        fail at once instead of logging in (only the daemon's probe tries: `due_for_probe`);
        None otherwise, and always without an external prober (there the caller `trouble`
        lets through is the attempt)."""
        with self._lock:
            state = self._states.get(database)
            if self._external and state is not None and state.state == "auth-failed":
                return state
            return None

    def record_up(self, database: str, *, relayed: bool = False) -> None:
        with self._lock:
            before = self._states.get(database)
            if before is not None and not before.in_trouble:
                return
            if before is not None and not self._quiet:
                if before.state == "auth-failed":
                    log.warning(
                        "database '%s': the login%s is accepted again after %s; delivering "
                        "what waited for it",
                        database,
                        f" '{before.login}'" if before.login else "",
                        _duration(utcnow() - before.since),
                        extra=about(database=database),
                    )
                else:
                    log.warning(
                        "database '%s' is usable again after %s; delivering what waited for it",
                        database,
                        _duration(utcnow() - before.since),
                        extra=about(database=database),
                    )
            self._states[database] = DatabaseState(database, "up", utcnow())
            self._next_probe.pop(database, None)
            self._refusals.pop(database, None)
            self._tried.discard(database)
            self.version += 1
        self._tell(relayed, "record_up", database)

    def in_trouble(self, database: str) -> bool:
        """Whether `database` is known to be in trouble (never grants a probe)."""
        with self._lock:
            state = self._states.get(database)
            return state is not None and state.in_trouble

    def waiting_databases(self) -> list[str]:
        """Databases in trouble whose messages should stay in retry storage for now."""
        with self._lock:
            now = self._clock()
            return sorted(
                name
                for name, state in self._states.items()
                if state.in_trouble and (self._external or now < self._next_probe[name])
            )

    def due_for_probe(self) -> list[str]:
        """For the external prober: databases to probe now; each is scheduled again at once."""
        with self._lock:
            now = self._clock()
            due = [
                name
                for name, state in self._states.items()
                if state.in_trouble and now >= self._next_probe[name]
            ]
            for name in due:
                self._schedule_probe(name, granted=True)
            return due

    def record_busy(self, database: str, table: str, error: str, *, relayed: bool = False) -> None:
        """`table` (rendered) in `database` stayed locked by another session for the whole
        query timeout (an ALTER TABLE, a VACUUM FULL, a migration): for one probe interval
        its messages fail at once instead of each batch waiting out the lock again."""
        with self._lock:
            key = (database, table)
            if key not in self._busy and not self._quiet:
                log.warning(
                    "%s in database '%s' is locked by another session (%s); its messages wait "
                    "in retry storage and it is tried again every %s",
                    table,
                    database,
                    error,
                    _duration(timedelta(seconds=self._interval)),
                    extra=about(database=database),
                )
            self._busy[key] = (self._clock() + self._interval, error)
        self._tell(relayed, "record_busy", database, table, error)

    def busy(self, database: str, table: str) -> str | None:
        """The lock error while `table` counts as busy (`record_busy`), else None."""
        with self._lock:
            found = self._busy.get((database, table))
            if found is None:
                return None
            until, error = found
            if self._clock() < until:
                return error
            return None

    def record_free(self, database: str, table: str, *, relayed: bool = False) -> None:
        """`table` was written to again: no longer busy."""
        with self._lock:
            if self._busy.pop((database, table), None) is None:
                return
            if not self._quiet:
                log.warning(
                    "%s in database '%s' takes messages again",
                    table,
                    database,
                    extra=about(database=database),
                )
        self._tell(relayed, "record_free", database, table)

    def in_trouble_now(self) -> tuple[list[str], list[tuple[str, str]]]:
        """The databases in trouble and the (database, table)s busy now: what a listener
        joining now needs to know."""
        with self._lock:
            now = self._clock()
            troubled = [name for name, state in self._states.items() if state.in_trouble]
            busy = [key for key, (until, _) in self._busy.items() if now < until]
            return troubled, busy

    def state(self, database: str) -> DatabaseState | None:
        """What was last recorded of `database` (None: nothing yet)."""
        with self._lock:
            return self._states.get(database)

    def _tell(self, relayed: bool, change: str, *args: Any) -> None:
        # Outside the lock: a listener may take its time (a pipe to another process).
        listener = self.listener
        if listener is not None and not relayed:
            listener(change, args)

    def suspect(self, database: str) -> bool:
        """Whether `database` failed lately: in trouble now, or a table of it found locked and
        not written to since."""
        with self._lock:
            state = self._states.get(database)
            if state is not None and state.in_trouble:
                return True
            return any(name == database for name, _ in self._busy)

    def states(self) -> list[DatabaseState]:
        with self._lock:
            return [self._states[name] for name in sorted(self._states)]

    def _schedule_probe(self, database: str, *, granted: bool = False) -> None:
        """Caller holds the lock. `granted`: a caller was just let through to try (a refused
        login then waits as long as the next refusal would make it wait)."""
        state = self._states.get(database)
        wait = self._interval
        if state is not None and state.state == "auth-failed":
            refusals = self._refusals.get(database, 1) + (1 if granted else 0)
            wait = auth_retry_delay(self._interval, refusals)
            if granted:
                self._tried.add(database)
        self._next_probe[database] = self._clock() + wait
        if state is not None and state.in_trouble:
            next_at = utcnow() + timedelta(seconds=wait)
            self._states[database] = replace(state, next_probe_at=next_at)

    def _say_trouble(
        self, database: str, kind: TroubleKind, error: str, *, since: datetime | None
    ) -> None:
        if self._quiet:
            return
        what = _TROUBLE_WORDS.get(kind, "is not ready for the bridge")
        still = f" (still, for {_duration(utcnow() - since)})" if since else ""
        log.error(
            "database '%s' %s%s: %s; its messages wait in retry storage and it is probed every %s",
            database,
            what,
            still,
            error,
            _duration(timedelta(seconds=self._interval)),
            extra=about(database=database),
        )

    def _say_refused(self, database: str, error: str, login: str | None) -> None:
        if self._quiet:
            return
        log.error(
            "database '%s': the server refused the login%s: %s; its messages wait in retry "
            "storage, and the login is tried again in %s, then twice as long each time up to "
            "every %s (so as not to lock the account). Fix the login (the password, the "
            "role, pg_hba.conf) and reload (systemctl reload sfbridge) to try at once",
            database,
            f" '{login}'" if login else "",
            mask_secrets(error),
            _duration(timedelta(seconds=self._interval)),
            _duration(timedelta(seconds=AUTH_RETRY_MAX_SECONDS)),
            extra=about(database=database),
        )


def auth_retry_delay(probe_interval: float, refusals: int) -> float:
    """Seconds from the `refusals`-th refused login in a row (1: the first) to the next
    attempt: the probe interval, doubling with each refusal, at most `AUTH_RETRY_MAX_SECONDS`
    (never less than the probe interval, were it set longer)."""
    doubled = probe_interval * 2 ** min(max(refusals - 1, 0), 30)
    return max(probe_interval, min(doubled, AUTH_RETRY_MAX_SECONDS))


def _duration(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
