"""Push: being told of new rows instead of asking (PostgreSQL's LISTEN/NOTIFY).

`sfbridge install` (and the daemon, where it creates a missing forwarding queue or retry
storage) puts a statement-level trigger on each forwarding queue and on retry storage that
notifies a channel of that table (`bridge.dialects.base.notify_channel`) once per INSERT
statement, at commit. A watcher (`bridge.daemon.watcher`) listens on its database's channels on
its own connection, in a thread of its own (`PushListener`), so a message is marked for a
worker milliseconds after its sender commits, and an idle daemon sends nothing but a slow
fallback poll. The watcher's polls run on another connection, so a notification never waits
for a poll, however long one takes (a thousand tables, or one kept locked by someone else).

What is pushed is read from the database, not assumed: a table without the trigger (a DBA
refused it, or dropped it, or the database was installed by an older sfbridge) is polled at the
fast interval, as is every table while the listening connection is down. Nothing is missed:
when listening starts (again), the watcher polls at once for what was sent meanwhile.

A database behind a transaction pooler (`pooler: transaction`) is not listened to at all: the
pooler hands the LISTEN to whichever server connection runs that transaction and drops what
that connection is told afterwards, so a listener there would wait for pushes that never come
while believing itself pushed. Its sources are polled every peek interval instead, and the log
and `sfbridge status` say so (`push_off_reason`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from bridge.addressing import TableAddress
from bridge.config.model import BridgeConfig, DatabaseConfig
from bridge.connections import Connections
from bridge.daemon.board import Key
from bridge.dialects import Dialect, dialect_for
from bridge.dialects.base import notify_channel
from bridge.drivers import Connection
from bridge.exceptions import DatabaseError
from bridge.outages import OutageTracker

log = logging.getLogger(__name__)

# How often a database whose tables all push is polled all the same (a notification lost in
# a way the bridge cannot see; retries coming due are timed, not polled for).
PUSH_POLL_INTERVAL = 5.0
# The longest the listener waits for a notification in one go, so that it sees a stop.
LISTEN_NAP = 1.0
# The fewest `max_connections` with room for the listener's connection: upkeep, the watcher,
# the heartbeat and one pool worker take the schema's minimum of 4 (`bridge.daemon.budget`).
FEWEST_CONNECTIONS_TO_LISTEN = 5


def push_off_reason(database: DatabaseConfig, dialect: Dialect) -> str | None:
    """Why the daemon does not listen for pushes from `database`, as a log line or `status`
    says it; None where it listens."""
    if not dialect.pushes:
        return f"{dialect.title} has no push"
    if dialect.opens_with_odbc(database):
        return "its ODBC driver cannot listen for pushes"
    if database.pooler == "transaction":
        return "transaction pooler: LISTEN/NOTIFY does not pass it"
    if database.max_connections < FEWEST_CONNECTIONS_TO_LISTEN:
        return (
            f"max_connections {database.max_connections} leaves no connection to listen on "
            f"(it takes {FEWEST_CONNECTIONS_TO_LISTEN})"
        )
    return None


def pickup(config: BridgeConfig, database: str) -> dict[str, Any]:
    """How the daemon's watcher finds new messages in `database`'s queues, as `sfbridge
    status` shows it: told of them (`push`), or polling every `poll_seconds` and `why`."""
    settings = config.databases[database]
    dialect = dialect_for(settings.dialect)
    why = push_off_reason(settings, dialect)
    if why is None:
        return {"push": True}
    poll = min(f.peek_interval for f in config.forwarders if f.database == database)
    return {"push": False, "poll_seconds": poll, "why": why}


class PushChannels:
    """The channels of one database's sources, and which of them push."""

    def __init__(
        self, database: str, dialect: Dialect, sources: Iterable[tuple[Key, TableAddress]]
    ):
        self.database = database
        self._dialect = dialect
        self._tables: dict[Key, TableAddress] = {}
        self._keys: dict[str, list[Key]] = {}  # channel -> the sources it tells of
        for key, table in sources:
            self._tables[key] = table
            channel = notify_channel(dialect.grammar.qualified_name(table))
            self._keys.setdefault(channel, []).append(key)
        self.pushed: set[Key] = set()
        self._told_unpushed: frozenset[str] = frozenset()
        self._reading = threading.Lock()  # the listener and the watcher both read triggers

    @property
    def tables(self) -> dict[Key, TableAddress]:
        return self._tables

    @property
    def channels(self) -> Sequence[str]:
        return sorted(self._keys)

    def listen(self, connection: Connection) -> None:
        """LISTEN on every channel and read which tables have the trigger. Raises the
        DatabaseError family."""
        connection.listen(self.channels)
        self.read_triggers(connection)

    def read_triggers(self, connection: Connection) -> None:
        """Which sources push now (a trigger may be dropped or created while the daemon
        runs). Raises the DatabaseError family."""
        try:
            connection.begin_read()
            rows = connection.query(self._dialect.statements["notify_triggers"])
            connection.commit()
        except BaseException:
            connection.rollback()
            raise
        with self._reading:
            self._found_triggers(rows)

    def _found_triggers(self, rows: Sequence[Sequence[Any]]) -> None:
        found = {(str(schema).casefold(), str(table).casefold()) for schema, table in rows}
        self.pushed = {
            key
            for key, table in self._tables.items()
            if ((table.schema or "").casefold(), table.table.casefold()) in found
        }
        unpushed = frozenset(
            self._dialect.grammar.render(table)
            for key, table in self._tables.items()
            if key not in self.pushed
        )
        if unpushed and unpushed != self._told_unpushed:
            log.warning(
                "database '%s': %s without the push trigger (run 'sfbridge install', or have a "
                "DBA run what 'sfbridge install --print-sql' shows): polled every peek interval",
                self.database,
                ", ".join(sorted(unpushed)),
            )
        elif self._told_unpushed and not unpushed:
            # Said, so that the warning above is not the last word (a first start without
            # 'sfbridge install' creates the tables, triggers included, a moment after it).
            log.info(
                "database '%s': every forwarding queue and retry storage has the push trigger "
                "now: pushed, polled every %g s",
                self.database,
                PUSH_POLL_INTERVAL,
            )
        self._told_unpushed = unpushed

    def keys(self, channels: Iterable[str]) -> list[Key]:
        """The sources the notified `channels` tell of."""
        return [key for channel in channels for key in self._keys.get(channel, ())]


class PushListener(threading.Thread):
    """Listens on one database's channels on a connection of its own and hands what it is told
    to `told` (the sources notified), until `stop`.

    `changed(listening)` is called when listening starts (the watcher then polls at once, for
    what was sent while nobody listened) and when the connection is lost (the watcher then
    polls every source at its fast interval until listening starts again, `PUSH_POLL_INTERVAL`
    later at the latest). A driver that cannot listen ends the thread, `unable` set."""

    def __init__(
        self,
        databases: Mapping[str, DatabaseConfig],
        channels: PushChannels,
        stop: threading.Event,
        told: Callable[[list[Key]], None],
        changed: Callable[[bool], None],
        poll_interval: float,
        logins: OutageTracker | None = None,
        *,
        tick: Callable[[float], None] | None = None,
    ) -> None:
        """`tick(now)`: called every time the thread loops (at least every `LISTEN_NAP`), in
        its thread, with `time.monotonic()`."""
        super().__init__(name=f"listen-{channels.database}", daemon=True)
        self.database = channels.database
        self.channels = channels
        self.listening = False
        self.unable = False
        self.listens = 0  # times listening started, for tests
        self.last_progress = time.monotonic()
        self._databases = databases
        self._stopping = stop
        self._told = told
        self._changed = changed
        self._poll_interval = poll_interval
        self._logins = logins
        self._tick = tick

    def run(self) -> None:
        connections = Connections(self._databases, self._logins)
        next_listen = 0.0
        try:
            while not self._stopping.is_set():
                self.last_progress = now = time.monotonic()
                if self._tick is not None:
                    self._tick(now)
                if not self.listening:
                    if now < next_listen:
                        self._stopping.wait(min(next_listen - now, LISTEN_NAP))
                        continue
                    if not self._listen(connections):
                        if self.unable:
                            return
                        next_listen = now + PUSH_POLL_INTERVAL
                        continue
                try:
                    notified = connections.get(self.database).notifications(LISTEN_NAP)
                except DatabaseError as error:
                    connections.discard(self.database)
                    self.listening = False
                    log.warning(
                        "database '%s': the listening connection is lost (%s); polling every %g "
                        "s until it is back",
                        self.database,
                        error,
                        self._poll_interval,
                    )
                    self._changed(False)
                    continue  # listen again at once; the watcher polls meanwhile
                if notified:
                    self._told(self.channels.keys(notified))
        finally:
            connections.close()

    def _listen(self, connections: Connections) -> bool:
        """Start listening; False when it cannot (now, or with this driver: `unable`)."""
        try:
            connection = connections.get(self.database)
            if not connection.listens:
                self.unable = True
                log.info(
                    "database '%s': polled every %g s (its driver cannot listen for pushes)",
                    self.database,
                    self._poll_interval,
                )
                self._changed(False)
                return False
            self.channels.listen(connection)
        except DatabaseError as error:
            connections.discard(self.database)
            log.debug("database '%s': cannot listen yet: %s", self.database, error)
            return False
        self.listening = True
        self.listens += 1
        tables = self.channels.tables
        log.info(
            "database '%s': %d of %d table(s) push (LISTEN/NOTIFY); polled every %g s, "
            "those without push every %g s",
            self.database,
            len({tables[key] for key in self.channels.pushed}),
            len(set(tables.values())),
            max(PUSH_POLL_INTERVAL, self._poll_interval),
            self._poll_interval,
        )
        self._changed(True)
        return True
