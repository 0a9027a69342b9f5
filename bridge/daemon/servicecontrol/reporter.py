"""The daemon's ServiceControl jobs: a heartbeat every `heartbeat_interval` (and the startup
registration first), and the custom checks every `check_interval`, each written into
ServiceControl's input queue as one transaction.

They run in upkeep's `servicecontrol` lane (`bridge.daemon.upkeep`), a thread each, apart from
the workers and from the other jobs, and every connection they open has short deadlines
(`SEND_TIMEOUT`, `PROBE_TIMEOUT`): a ServiceControl database that is down, a queue that is
missing or held locked, cost a failed write and one warning, never a forwarded message, and a
stopping daemon waits for them a few seconds at most. A refused login is recorded in the
daemon's outage tracker, and not tried again meanwhile (`bridge.connections.Connections`).
"""

from __future__ import annotations

import getpass
import logging
import os
import sys
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import timedelta

from bridge.config.model import BridgeConfig, DatabaseConfig, ServiceControlConfig
from bridge.config.servicecontrol import servicecontrol_queue
from bridge.connections import Connections, require_writes
from bridge.daemon.forwarder_health import ForwarderHealth
from bridge.daemon.servicecontrol.checks import (
    DestinationTrouble,
    destination_result,
    error_queue_result,
    forwarder_result,
)
from bridge.daemon.servicecontrol.messages import (
    CheckResult,
    ControlMessage,
    Instance,
    check_result_message,
    heartbeat_message,
    startup_message,
)
from bridge.daemon.upkeep import SERVICECONTROL_LANE, Upkeep
from bridge.dialects import dialect_for
from bridge.exceptions import (
    AuthenticationFailed,
    DatabaseError,
    DatabaseReadOnly,
)
from bridge.forwarding.writes import QueueWriter
from bridge.headers import serialize_headers
from bridge.messages import utcnow
from bridge.outages import OutageTracker
from bridge.processing_host import host_id_for, machine_name
from bridge.secrets import mask_secrets
from bridge.storage.error_counts import read_error_counts
from bridge.storage.pauses import PauseState
from bridge.storage.queue_depths import read_pause_state
from bridge.storage.tables import forwarder_tables

__all__ = ["SEND_TIMEOUT", "ServiceControlReporter", "destination_databases"]

log = logging.getLogger(__name__)

# The longest a connection to ServiceControl's database may take to open, and one statement
# (a lock wait included) on it: a heartbeat is worth less than a prompt stop.
SEND_TIMEOUT = 3.0
# The same for the checks' looks at the bridge's own databases.
PROBE_TIMEOUT = 5.0


def destination_databases(config: BridgeConfig) -> list[str]:
    """Every database that routes or proxies deliver to, in the order of the file."""
    named = [route.database for route in config.routes]
    named += [f.destination.database for f in config.forwarders if f.destination is not None]
    return [name for name in config.databases if name in named]


def this_instance(settings: ServiceControlConfig) -> Instance:
    machine = machine_name()
    return Instance(settings.endpoint, machine, uuid.UUID(host_id_for(machine)))


class ServiceControlReporter:
    """One per daemon process, kept across reloads: the startup is registered once per process,
    and the error-queue counts carry over."""

    def __init__(self) -> None:
        self._started_at = utcnow()
        self._registered = False
        self._writer = QueueWriter()
        # The forwarders' error-queue counts at the last check (`error_queue_result`).
        self._error_counts: dict[str, int] = {}
        # Jobs whose write failed and was logged: one warning per run of failures.
        self._failing: set[str] = set()
        self._lock = threading.Lock()

    def schedule(
        self,
        upkeep: Upkeep,
        config: BridgeConfig,
        outages: OutageTracker,
        health: ForwarderHealth,
        stop: threading.Event,
    ) -> None:
        """Add the heartbeat and checks jobs for `config` (none without `servicecontrol`)."""
        settings = config.servicecontrol
        if settings is None:
            return
        run = _Jobs(self, config, settings, outages, health, stop)
        upkeep.add(
            run.heartbeat,
            settings.heartbeat_interval,
            name="servicecontrol heartbeat",
            at_once=True,
            lane=SERVICECONTROL_LANE,
        )
        upkeep.add(
            run.checks,
            settings.check_interval,
            name="servicecontrol checks",
            at_once=True,
            lane=SERVICECONTROL_LANE,
        )


class _Jobs:
    """The two jobs of one start of the daemon (a reload makes new ones)."""

    def __init__(
        self,
        reporter: ServiceControlReporter,
        config: BridgeConfig,
        settings: ServiceControlConfig,
        outages: OutageTracker,
        health: ForwarderHealth,
        stop: threading.Event,
    ) -> None:
        self._reporter = reporter
        self._config = config
        self._settings = settings
        self._outages = outages
        self._health = health
        self._stop = stop
        self._instance = this_instance(settings)

    # -- the jobs --------------------------------------------------------------------------

    def heartbeat(self) -> None:
        """Send the startup registration until it went once, and a heartbeat."""
        reporter, settings = self._reporter, self._settings
        messages: list[ControlMessage] = []
        with reporter._lock:
            registering = not reporter._registered
        if registering:
            messages.append(
                startup_message(
                    self._instance, reporter._started_at, _host_properties(), settings.heartbeat_ttl
                )
            )
        messages.append(heartbeat_message(self._instance, utcnow(), settings.heartbeat_ttl))
        if self._send("heartbeats", messages) and registering:
            with reporter._lock:
                reporter._registered = True

    def checks(self) -> None:
        """Look at every destination database and forwarder, then report every check."""
        results = self.check_results()
        if results and not self._stop.is_set():
            now, ttl = utcnow(), self._settings.check_ttl
            self._send(
                "custom checks",
                [check_result_message(self._instance, result, now, ttl) for result in results],
            )

    def check_results(self) -> list[CheckResult]:
        """The checks' results now; a check whose subject could not be looked at is left out
        (ServiceControl keeps its last result)."""
        databases = _with_timeouts(self._config.databases, PROBE_TIMEOUT)
        connections = Connections(databases, self._outages)
        try:
            results = [
                destination_result(database, self._destination_trouble(connections, database))
                for database in destination_databases(self._config)
                if not self._stop.is_set()
            ]
            results += self._forwarder_results(connections)
        finally:
            connections.close()
        return results

    # -- looking -----------------------------------------------------------------------------

    def _destination_trouble(
        self, connections: Connections, database: str
    ) -> DestinationTrouble | None:
        """What is wrong with `database` now: a new connection and the question whether it
        takes writes, which is what delivery needs of it (a database whose login the tracker
        holds refused is not logged in to again)."""
        try:
            connection = connections.get(database)
            require_writes(
                connection, dialect_for(self._config.databases[database].dialect), database
            )
        except AuthenticationFailed as error:
            return DestinationTrouble("auth-failed", str(error), error.login)
        except DatabaseReadOnly as error:
            return DestinationTrouble("read-only", str(error))
        except DatabaseError as error:
            return DestinationTrouble("unreachable", str(error))
        finally:
            connections.discard(database)
        known = self._outages.state(database)
        if known is not None and known.state == "not-ready":
            return DestinationTrouble("not-ready", known.last_error or "")
        return None

    def _forwarder_results(self, connections: Connections) -> list[CheckResult]:
        config, reporter = self._config, self._reporter
        health = {state.forwarder: state for state in self._health.states()}
        counts: dict[str, int] = {}
        counted: set[str] = set()  # databases whose error queues were counted
        for database in dict.fromkeys(f.database for f in config.forwarders):
            try:
                for queue_count in read_error_counts(config, database, connections.get(database)):
                    counts.update(queue_count.by_forwarder)
                counted.add(database)
            except DatabaseError as error:
                connections.discard(database)
                log.debug(
                    "servicecontrol: cannot count the error queues of '%s': %s", database, error
                )
        results: list[CheckResult] = []
        for forwarder in config.forwarders:
            if self._stop.is_set():
                break
            pauses: PauseState | None = None
            try:
                pauses = read_pause_state(config, forwarder, connections.get(forwarder.database))
            except DatabaseError as error:
                connections.discard(forwarder.database)
                log.debug(
                    "servicecontrol: cannot read the pauses of '%s': %s", forwarder.name, error
                )
            results.append(forwarder_result(forwarder.name, pauses, health.get(forwarder.name)))
            if forwarder.database not in counted:
                continue
            # A forwarder none of whose messages are there is not among the counts.
            count = counts.get(forwarder.name, 0)
            tables = forwarder_tables(config, forwarder)
            error_queue = dialect_for(config.databases[forwarder.database].dialect).grammar.render(
                tables.error_queue
            )
            with reporter._lock:
                before = reporter._error_counts.get(forwarder.name)
                reporter._error_counts[forwarder.name] = count
            results.append(
                error_queue_result(
                    forwarder.name, error_queue, before, count, self._settings.check_interval
                )
            )
        return results

    # -- sending -----------------------------------------------------------------------------

    def _send(self, what: str, messages: Iterable[ControlMessage]) -> bool:
        """Write `messages` into ServiceControl's queue in one transaction. Returns whether
        they went; a failure is logged (once until the next success), never raised."""
        settings, reporter = self._settings, self._reporter
        databases = _with_timeouts(self._config.databases, SEND_TIMEOUT)
        database = databases[settings.database]
        dialect = dialect_for(database.dialect)
        connections = Connections(databases, self._outages)
        queue_text = "?"
        try:
            queue = servicecontrol_queue(dialect.grammar, settings.queue, database.schema)
            queue_text = dialect.grammar.render(queue)
            connection = connections.get(settings.database)
            now = utcnow()
            rows = [
                (
                    dialect.encode_id(uuid.uuid4()),
                    dialect.encode_timestamp(now + timedelta(seconds=message.time_to_be_received)),
                    serialize_headers(message.headers),
                    message.body,
                )
                for message in messages
            ]
            connection.begin()
            connection.executemany(reporter._writer.sql(connection, dialect, "send", queue), rows)
            connection.commit()
        except Exception as error:  # a failing observer never stops anything
            with reporter._lock:
                first = what not in reporter._failing
                reporter._failing.add(what)
            if first:
                log.warning(
                    "ServiceControl: cannot send %s to queue %s in database '%s': %s; trying "
                    "again on schedule (forwarding goes on)",
                    what,
                    queue_text,
                    settings.database,
                    error if isinstance(error, DatabaseError) else mask_secrets(repr(error)),
                )
            return False
        finally:
            connections.close()
        with reporter._lock:
            recovered = what in reporter._failing
            reporter._failing.discard(what)
        if recovered:
            log.info("ServiceControl: sending %s to queue %s again", what, queue_text)
        return True


def _with_timeouts(
    databases: Mapping[str, DatabaseConfig], limit: float
) -> dict[str, DatabaseConfig]:
    """`databases` with their connect and query timeouts at most `limit` seconds."""
    return {
        name: replace(
            database,
            connect_timeout=min(database.connect_timeout, limit),
            query_timeout=min(database.query_timeout, limit),
        )
        for name, database in databases.items()
    }


def _host_properties() -> dict[str, str]:
    """What `RegisterEndpointStartup` says of the host (ServiceControl stores, never reads)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = ""
    return {
        "Machine": machine_name(),
        "ProcessID": str(os.getpid()),
        "UserName": user,
        "PathToExecutable": os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else "",
    }
