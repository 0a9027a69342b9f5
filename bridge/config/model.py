"""Frozen, typed configuration objects. The rest of the bridge never sees raw YAML dicts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from fnmatch import fnmatchcase
from typing import Literal

from bridge.config.environment import Unresolved, unset_variable_advice
from bridge.exceptions import UnsetVariables
from bridge.secrets import mask_secrets

# A dialect name from bridge.dialects.registry; the schema offers exactly those as choices.
Dialect = str
Backoff = Literal["constant", "linear", "exponential"]
MissingQueuePolicy = Literal["retry", "error"]
OutagePolicy = Literal["count", "wait"]
NoSubscribersPolicy = Literal["drop", "error"]
# How a message crosses into another database (`bridge.forwarding.transactions`): `ledger`
# (destination commit with a dedup-ledger row, then the source), `two-phase` (the destination
# prepared, the source committed with the decision, then the destination), `at-least-once` (no
# ledger: a crash between the two commits can deliver a message twice).
TransactionMode = Literal["ledger", "two-phase", "at-least-once"]
TRANSACTION_MODES: tuple[TransactionMode, ...] = ("ledger", "two-phase", "at-least-once")
# What stands between the bridge and a database's server (`databases.<name>.pooler`): nothing,
# or a connection pooler (PgBouncer) lending a server connection per client session, or per
# transaction (then nothing of a session survives its transaction: no prepared statements, no
# SET, no LISTEN).
Pooler = Literal["none", "session", "transaction"]
POOLERS: tuple[Pooler, ...] = ("none", "session", "transaction")


@dataclass(frozen=True)
class DatabaseConfig:
    """One database the bridge talks to.

    `connection` is the ODBC connection string with `${VAR}` already expanded (postgresql,
    sqlserver); `path` is the SQLite file (sqlite). Both are None and `unresolved` says why
    when the value names an environment variable that was not set: the database cannot be
    opened (`require_environment`), the rest of the configuration works. `schema` is the
    default schema used for addresses that name none (None: the dialect's default, `public` /
    `dbo`). `catalog` (sqlserver) is the database's name on its server, as addresses name it
    (None: the one the connection string opens; see `bridge.config.catalogs`).

    Its repr masks the credentials in `connection` (a traceback's locals, a debug log).
    """

    name: str
    dialect: Dialect
    connection: str | None = None
    path: str | None = None
    schema: str | None = None
    catalog: str | None = None
    connect_timeout: float = 5.0
    driver: str | None = None  # None: the dialect's default (see `Dialect.drivers`)
    # The longest one call may take (statement, commit, lock wait); see `bridge.drivers`.
    query_timeout: float = 15.0
    # The most connections the daemon holds to this database at once (see
    # `bridge.daemon.budget`).
    max_connections: int = 10
    pooler: Pooler | None = None  # None: as `none`, the server itself (or no choice: sqlite)
    # Catch-up limits on what forwarders of other databases write here (`bridge.daemon.catch_up`):
    # messages per second, and batches at once, in all the daemon's processes; None: none.
    max_messages_per_second: int | None = None
    max_batches_in_flight: int | None = None
    unresolved: Unresolved | None = None

    def require_environment(self, doing: str = "cannot connect") -> None:
        """Raises UnsetVariable (saying what cannot be done: `doing`) when `connection` or
        `path` names an environment variable that was not set."""
        if self.unresolved is not None:
            raise self.unresolved.error(self.name, doing)

    def __repr__(self) -> str:
        return _masked_repr(self, "connection")


@dataclass(frozen=True)
class FixedDestination:
    """Where every message of a proxy queue goes: a queue in another database.

    `queue` None: the proxy's own queue address, re-rendered in that database's grammar.
    """

    database: str
    queue: str | None = None
    transaction: TransactionMode | None = None  # None: `delivery.transaction`


# Retry storage and pauses are read at most this often (seconds) by an idle worker.
SLOW_POLL_MINIMUM = 1.0


@dataclass(frozen=True)
class ForwarderConfig:
    """One local forwarding queue and the workers that drain it.

    With `destination`, the queue is a *proxy*: a table named after a remote endpoint that
    unchanged endpoints send to; its messages go to that destination unless they carry a
    routing header.
    """

    name: str
    database: str
    queue: str
    error_queue: str = "error"
    batch_size: int = 1000
    batch_bytes: int = 8 * 1024 * 1024
    concurrency: int = 2
    peek_interval: float = 0.05
    destination: FixedDestination | None = None

    @property
    def slow_poll_interval(self) -> float:
        """How often an idle worker looks at retry storage and at pauses: the peek interval,
        but at most once a second (retry delays are seconds; a short peek interval is for new
        messages, and the extra statements would be its idle cost)."""
        return max(self.peek_interval, SLOW_POLL_MINIMUM)


@dataclass(frozen=True)
class RouteConfig:
    """Destination table-name glob -> database. `schema` overrides the destination schema;
    `schemas` and `catalogs` are the ones an address may name besides the database's own
    (`bridge.routing.resolve_for_target`)."""

    match: str
    database: str
    schema: str | None = None
    transaction: TransactionMode | None = None  # None: `delivery.transaction`
    schemas: tuple[str, ...] = ()
    catalogs: tuple[str, ...] = ()

    def matches(self, table: str) -> bool:
        """Whether `match` matches the table name (case-sensitive, like NServiceBus)."""
        return fnmatchcase(table, self.match)


@dataclass(frozen=True)
class RetryConfig:
    """Delayed retries (durable, in the source database) and immediate in-process retries."""

    delay: float = 10.0
    max_attempts: int = 100
    backoff: Backoff = "constant"
    max_delay: float = 3600.0
    immediate_attempts: int = 3
    missing_queue: MissingQueuePolicy = "retry"
    # `wait`: a whole-database outage spends no attempts; its messages wait up to `max_wait`.
    during_outage: OutagePolicy = "wait"
    max_wait: float = 7 * 24 * 3600.0


@dataclass(frozen=True)
class DeliveryConfig:
    """`transaction`: the mode of every route (and proxy destination) that names none."""

    transaction: TransactionMode = "ledger"


@dataclass(frozen=True)
class InstallConfig:
    """`at_runtime`: the daemon creates the bridge's own tables when it finds them missing."""

    at_runtime: bool = True


@dataclass(frozen=True)
class LedgerConfig:
    """The dedup ledger: how long a forwarded message id is kept (default 7 days), how often
    expired ids are deleted (default every minute) and whether this bridge deletes them."""

    retention: float = 7 * 24 * 3600.0
    cleanup_interval: float = 60.0
    cleanup: bool = True


@dataclass(frozen=True)
class ErrorArchiveConfig:
    """The error archive (`sfbridge errors archive`): how long an archived message is kept,
    restorable (default 30 days), how often older ones are deleted (default hourly) and
    whether this bridge deletes them."""

    retention: float = 30 * 24 * 3600.0
    cleanup_interval: float = 3600.0
    cleanup: bool = True


@dataclass(frozen=True)
class SubscriptionTableConfig:
    """An NServiceBus native `SubscriptionRouting` table to consult for subscribers.

    `table` is a table name or address in that database's own grammar.
    """

    database: str
    table: str = "SubscriptionRouting"


@dataclass(frozen=True)
class PublishConfig:
    """How published events (`$.store-and-forward.eventtype`) are multicast.

    `no_subscribers`: `drop` (log and count) or `error` (to the error queue). `cache` is how
    long subscriber lists read from subscription tables are reused (NServiceBus uses 5 s).
    """

    no_subscribers: NoSubscribersPolicy = "drop"
    cache: float = 5.0


@dataclass(frozen=True)
class DaemonConfig:
    """`heartbeat`: how often a running daemon records that it is alive (seconds);
    `processes`: how many processes run its workers (`auto` or a number, as written)."""

    heartbeat: float = 5.0
    processes: str = "auto"


@dataclass(frozen=True)
class LoggingConfig:
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    repeats: float = 60.0  # seconds a repeated failure is held for one summary line
    format: Literal["auto", "text", "json", "journal"] = "auto"


@dataclass(frozen=True)
class SentryConfig:
    """`dsn` None: no Sentry, or (`unresolved`) a `${VAR}` that was not set, which only the
    daemon, the one user of Sentry, refuses."""

    dsn: str | None = None
    environment: str | None = None
    unresolved: Unresolved | None = None

    def __repr__(self) -> str:
        return _masked_repr(self, "dsn")


def _masked_repr(instance: object, secret: str) -> str:
    """The dataclass's repr with the credentials in its field `secret` masked."""
    shown = []
    for item in fields(instance):  # type: ignore[arg-type]
        value = getattr(instance, item.name)
        text = repr(value)
        if item.name == secret and isinstance(value, str):
            text = repr(mask_secrets(value))
        shown.append(f"{item.name}={text}")
    return f"{type(instance).__name__}({', '.join(shown)})"


@dataclass(frozen=True)
class MetricsConfig:
    """Prometheus metrics served by the daemon; `listen` None: none."""

    listen: str | None = None


@dataclass(frozen=True)
class ServiceControlConfig:
    """Heartbeats and custom checks sent to ServiceControl (`bridge.daemon.servicecontrol`).

    `queue` None: the table `Particular.ServiceControl` in `database`'s default schema;
    `time_to_be_received` None: four intervals (heartbeat or check) of each message's kind.
    """

    database: str
    queue: str | None = None
    endpoint: str = "sfbridge"
    heartbeat_interval: float = 10.0
    time_to_be_received: float | None = None
    check_interval: float = 30.0

    @property
    def heartbeat_ttl(self) -> float:
        return self.time_to_be_received or 4 * self.heartbeat_interval

    @property
    def check_ttl(self) -> float:
        return self.time_to_be_received or 4 * self.check_interval


@dataclass(frozen=True)
class TracingConfig:
    """OpenTelemetry traces of each forwarded message (`bridge.daemon.tracing`), exported as
    the standard `OTEL_*` environment variables say; `enabled` False: none."""

    enabled: bool = False


@dataclass(frozen=True)
class BridgeConfig:
    databases: Mapping[str, DatabaseConfig]
    forwarders: tuple[ForwarderConfig, ...]
    routes: tuple[RouteConfig, ...] = ()
    retries: RetryConfig = field(default_factory=RetryConfig)
    delivery: DeliveryConfig = field(default_factory=DeliveryConfig)
    install: InstallConfig = field(default_factory=InstallConfig)
    ledger: LedgerConfig = field(default_factory=LedgerConfig)
    error_archive: ErrorArchiveConfig = field(default_factory=ErrorArchiveConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    sentry: SentryConfig = field(default_factory=SentryConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    servicecontrol: ServiceControlConfig | None = None  # None: no ServiceControl
    tracing: TracingConfig = field(default_factory=TracingConfig)
    # Topic (an event type's full name, without assembly) -> subscriber addresses, written in
    # the grammar of the forwarding database (like destination headers).
    subscriptions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    subscription_tables: tuple[SubscriptionTableConfig, ...] = ()
    publish: PublishConfig = field(default_factory=PublishConfig)
    source_path: str | None = None

    def route_transaction(self, route: RouteConfig) -> TransactionMode:
        return route.transaction or self.delivery.transaction

    def proxy_transaction(self, destination: FixedDestination) -> TransactionMode:
        return destination.transaction or self.delivery.transaction

    def crossings(self) -> set[tuple[str, str, TransactionMode]]:
        """(forwarding database, destination database, mode) for every way a message can
        cross into another database: each forwarder with each route into another database,
        and each proxy whose destination is in another database."""
        found = {
            (forwarder.database, route.database, self.route_transaction(route))
            for forwarder in self.forwarders
            for route in self.routes
            if route.database != forwarder.database
        }
        found |= {
            (f.database, f.destination.database, self.proxy_transaction(f.destination))
            for f in self.forwarders
            if f.destination is not None and f.destination.database != f.database
        }
        return found

    def require_environment(self, verb: str, databases: Iterable[str] | None = None) -> None:
        """For a command that opens every database at once (`run`, `install`), before it
        touches any: raises UnsetVariables naming every value of `databases` (default: all,
        and `sentry.dsn`) that names an environment variable that was not set."""
        chosen = self.databases if databases is None else dict.fromkeys(databases)
        values = [self.databases[name].unresolved for name in chosen]
        if databases is None:
            values.append(self.sentry.unresolved)
        unset = [value for value in values if value is not None]
        if unset:
            variables = tuple(dict.fromkeys(name for value in unset for name in value.variables))
            raise UnsetVariables(
                verb,
                [(value.key_path, value.variables) for value in unset],
                unset_variable_advice(variables),
            )

    def forwarder(self, name: str) -> ForwarderConfig:
        for forwarder in self.forwarders:
            if forwarder.name == name:
                return forwarder
        raise KeyError(name)
