"""The declarative schema of the YAML configuration file.

This module is the single source of truth about the configuration: `bridge.config.walker`
walks `SCHEMA` to check and convert a parsed YAML document, and `bridge.config.reference` turns
the very same description into the Markdown reference that the README embeds. A key added here
is therefore validated and documented at once; a key that is not here is rejected as unknown.

Keys are named exactly like the fields of the dataclasses in `bridge.config.model`, and a unit
test checks that the defaults here equal the dataclass defaults.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from bridge.config.keys import Key, Section
from bridge.config.model import (
    TRANSACTION_MODES,
    DatabaseConfig,
    DeliveryConfig,
    FixedDestination,
    ForwarderConfig,
    InstallConfig,
    LedgerConfig,
    LoggingConfig,
    MetricsConfig,
    PublishConfig,
    RetryConfig,
    RouteConfig,
    SentryConfig,
    SubscriptionTableConfig,
)
from bridge.dialects.registry import dialects

__all__ = [
    "CATALOG_DIALECTS",
    "DATABASES",
    "DELIVERY",
    "DIALECTS",
    "FILE_DIALECTS",
    "FORWARDERS",
    "IMPLEMENTED_DIALECTS",
    "INSTALL",
    "LEDGER",
    "LOGGING",
    "METRICS",
    "NAME_MESSAGE",
    "NAME_PATTERN",
    "PUBLISH",
    "RETRIES",
    "ROUTES",
    "SCHEMA",
    "SCHEMA_DIALECTS",
    "SENTRY",
    "SERVER_DIALECTS",
    "SUBSCRIPTIONS",
    "SUBSCRIPTION_TABLES",
    "section",
]

# Every dialect module in bridge/dialects (the registry finds them), and what they need.
DIALECTS: Final = tuple(dialects())
# Dialects with a working driver in this version; any other would be recognised (so the message
# can say "not available yet" instead of "unknown") but rejected.
IMPLEMENTED_DIALECTS: Final = DIALECTS
# Located by an ODBC connection string / by a file path; with schemas / without.
SERVER_DIALECTS: Final = tuple(n for n, d in dialects().items() if d.locator == "connection")
FILE_DIALECTS: Final = tuple(n for n, d in dialects().items() if d.locator == "path")
SCHEMA_DIALECTS: Final = tuple(n for n, d in dialects().items() if d.has_schemas)
# Dialects whose addresses name catalogs (databases on the server).
CATALOG_DIALECTS: Final = tuple(n for n, d in dialects().items() if d.has_catalogs)
# Dialects whose databases can be opened with more than one driver, and every such driver.
DRIVER_DIALECTS: Final = tuple(n for n, d in dialects().items() if len(d.drivers) > 1)
DRIVERS: Final = tuple(dict.fromkeys(x for d in dialects().values() for x in d.drivers))


def _names(names: Sequence[str]) -> str:
    """`a`, `a and b`, `a, b and c`."""
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


_NO_SCHEMAS = [name for name in DIALECTS if name not in SCHEMA_DIALECTS]
_CONNECTION_HINT = f"{_names(FILE_DIALECTS)} databases take 'path' instead"
_PATH_HINT = f"{_names(SERVER_DIALECTS)} databases take 'connection' instead"
_SCHEMA_HINT = f"{_names(_NO_SCHEMAS)} {'has' if len(_NO_SCHEMAS) == 1 else 'have'} no schemas"


# Names end up in log lines, metrics labels and file names, so keep them to a safe alphabet.
NAME_PATTERN: Final = r"[A-Za-z0-9_.-]+"
NAME_MESSAGE: Final = "is not a valid name: use only letters, digits, '_', '.' and '-'"


# --------------------------------------------------------------------------------------------
# The schema
# --------------------------------------------------------------------------------------------

_POSITIVE: Final[dict[str, Any]] = {"minimum": 0, "exclusive_minimum": True}


def _transaction_key(description: str, default: str | None = None) -> Key:
    return Key(
        "transaction",
        "choice",
        description,
        example="two-phase",
        choices=TRANSACTION_MODES,
        default=default,
    )


DATABASES = Section(
    name="databases",
    shape="named",
    entry="database",
    name_pattern=NAME_PATTERN,
    required=True,
    min_items=1,
    model=DatabaseConfig,
    description=(
        "The databases the bridge connects to, by name. Forwarders and routes refer to them by "
        "that name."
    ),
    keys=(
        Key(
            "dialect",
            "choice",
            "SQL dialect of the database and of its queue addresses.",
            example="postgresql",
            choices=DIALECTS,
            unavailable=tuple(d for d in DIALECTS if d not in IMPLEMENTED_DIALECTS),
        ),
        Key(
            "connection",
            "string",
            "ODBC connection string; `${VAR}` is expanded (keep passwords in the environment).",
            example="Driver={PostgreSQL Unicode};Server=db1;Database=receiver;Uid=bridge",
            expand_env=True,
            secret=True,
            dialects=SERVER_DIALECTS,
            dialect_hint=_CONNECTION_HINT,
        ),
        Key(
            "path",
            "string",
            "SQLite database file; `${VAR}` is expanded; a relative path is taken from the "
            "config file's folder.",
            example="/var/lib/sfbridge/edge.db",
            expand_env=True,
            dialects=FILE_DIALECTS,
            dialect_hint=_PATH_HINT,
        ),
        Key(
            "schema",
            "string",
            "Schema of queue addresses that name none (default: `public` / `dbo`).",
            example="nsb",
            default=None,
            dialects=SCHEMA_DIALECTS,
            dialect_hint=_SCHEMA_HINT,
        ),
        Key(
            "catalog",
            "string",
            "The database's name on its server, as NServiceBus endpoints write it in "
            "addresses (`table@[schema]@[catalog]`); default: `Database=` or "
            "`Initial Catalog=` in `connection`, one of which must then be there. An address "
            'whose catalog names this database is delivered here (see "SQL Server catalogs").',
            example="ReceiverDb",
            default=None,
            dialects=CATALOG_DIALECTS,
            dialect_hint=f"only {_names(CATALOG_DIALECTS)} addresses name catalogs",
        ),
        Key(
            "connect_timeout",
            "duration",
            "How long to wait for a connection before giving up.",
            example="5s",
            default=5.0,
            **_POSITIVE,
        ),
        Key(
            "query_timeout",
            "duration",
            "The longest one call to the database may take (a statement, a commit, a wait for "
            "a lock held by someone else) before the bridge stops waiting. A destination that "
            "does not answer in time is treated as unreachable (its messages wait in retry "
            "storage, see `retries.during_outage`) and a table locked that long as busy, "
            "while the rest of the batch is delivered; a forwarding database that does not "
            "answer has its batch rolled back and tried again. Enforced by the server "
            "(`statement_timeout`, `lock_timeout`, `SET LOCK_TIMEOUT`) and by the client "
            "(psycopg; SQL Server's ODBC drivers), so a silent network cannot hold a worker. "
            "Keep it well above the slowest healthy statement (a batch of `batch_bytes`).",
            example="15s",
            default=15.0,
            **_POSITIVE,
        ),
        Key(
            "driver",
            "choice",
            "Driver to open the database with (default: the first). `psycopg` is psycopg 3 "
            "(PostgreSQL's own protocol, binary parameters, prepared statements; no system "
            "packages); it reads `Server`, `Port`, `Uid`, `Pwd`, `Database` and `SSLmode` "
            "from the ODBC-style `connection` (or takes a `postgresql://` URL). `odbc` is "
            "psqlODBC through pyodbc, as before.",
            example="psycopg",
            default=None,
            choices=DRIVERS,
            dialects=DRIVER_DIALECTS,
            dialect_hint=f"only {_names(DRIVER_DIALECTS)} databases have a choice of driver",
        ),
    ),
)

FORWARDERS = Section(
    name="forwarders",
    shape="list",
    entry="forwarder",
    required=True,
    min_items=1,
    model=ForwarderConfig,
    description=(
        "Local forwarding queues. Each forwarder drains one queue and delivers every message to "
        "the database its route selects."
    ),
    keys=(
        Key(
            "name",
            "string",
            "Unique name of the forwarder.",
            example="sender",
            pattern=NAME_PATTERN,
            pattern_message=NAME_MESSAGE,
        ),
        Key(
            "database",
            "string",
            "Name of the database (under `databases`) that holds the queue.",
            example="sender",
        ),
        Key(
            "queue",
            "address",
            "Queue to drain: a table name or an address in the database's dialect.",
            example="sfbridge.forward",
        ),
        Key(
            "error_queue",
            "address",
            "Queue for messages that cannot be delivered, parsed like `queue`; must differ "
            "from it.",
            example="error",
            default="error",
        ),
        Key(
            "batch_size",
            "integer",
            "Messages received per transaction, at most (see `batch_bytes`).",
            example=1000,
            default=1000,
            minimum=1,
            maximum=10000,
        ),
        Key(
            "batch_bytes",
            "size",
            "Bytes (bodies and headers) received per transaction, at most: a batch stops "
            "before the message that would cross it, and a message larger than it travels "
            'alone. Bounds the daemon\'s memory whatever the body sizes (see "Performance").',
            example="8MiB",
            default=8 * 1024 * 1024,
            minimum=64 * 1024,
            maximum=1024 * 1024 * 1024,
        ),
        Key(
            "concurrency",
            "integer",
            "Parallel workers draining the queue (a sqlite database always gets one).",
            example=2,
            default=2,
            minimum=1,
            maximum=64,
        ),
        Key(
            "peek_interval",
            "duration",
            "Pause between polls of an empty queue, so at most this long before a new message "
            "is picked up; a warning outside 10ms..10s. Retry storage and pauses are read at "
            "most once a second, whatever this says.",
            example="50ms",
            default=0.05,
            warn_outside=(0.01, 10.0),
            **_POSITIVE,
        ),
        Key(
            "destination",
            "mapping",
            "Makes the queue a *proxy*: a table named after an endpoint in another database, "
            "which unchanged endpoints send to with their ordinary send. Every message in it is "
            "delivered to this queue (one carrying a routing header is still routed by it). "
            'Replaces the transport\'s multi-instance mode; see "Proxy queues".',
            example={"database": "receiver"},
            default=None,
            model=FixedDestination,
            fields=(
                Key(
                    "database",
                    "string",
                    "Name of the database (under `databases`) that holds the endpoint's queue.",
                    example="receiver",
                ),
                Key(
                    "queue",
                    "address",
                    "The endpoint's queue in that database, in its dialect (default: the "
                    "proxy's own `queue`, re-rendered for that database).",
                    example="Samples.Receiver",
                    default=None,
                ),
                _transaction_key(
                    "How messages cross into that database (default: `delivery.transaction`); "
                    'see "Transaction modes".',
                ),
            ),
        ),
    ),
)

ROUTES = Section(
    name="routes",
    shape="list",
    entry="route",
    model=RouteConfig,
    description=(
        "Where messages go, by destination table name. Routes are tried in order and the first "
        "match wins. Required unless every forwarder is a proxy (has a `destination`)."
    ),
    keys=(
        Key(
            "match",
            "string",
            "Glob (`*`, `?`, `[abc]`) matched against the destination queue's table name.",
            example="Samples.Receiver*",
        ),
        Key(
            "database",
            "string",
            "Name of the database (under `databases`) that receives the matching messages.",
            example="receiver",
        ),
        Key(
            "schema",
            "string",
            "Schema of the destination queue, overriding the address and the database default "
            "(not for sqlite).",
            example="nsb",
            default=None,
        ),
        _transaction_key(
            "How messages cross into this route's database (default: `delivery.transaction`); "
            'see "Transaction modes".',
        ),
    ),
)

SUBSCRIPTIONS = Section(
    name="subscriptions",
    shape="multimap",
    entry="topic",
    model=tuple,
    description=(
        "Who receives a published event (`$.store-and-forward.eventtype`), by topic: the "
        "event type's full name. Used together with `subscription_tables`."
    ),
    keys=(),
    name_key=Key(
        "topic",
        "topic",
        "Full name of the event type without the assembly part (a generic type's arguments "
        "in brackets may be assembly-qualified).",
        example="Shared.OrderSubmitted",
    ),
    items=Key(
        "subscribers",
        "address",
        "Subscriber queues, a list even for one: addresses in the grammar of every forwarding "
        "database (like destination headers), each matching a route; duplicates draw a warning.",
        example="Samples.Billing",
    ),
)

SUBSCRIPTION_TABLES = Section(
    name="subscription_tables",
    shape="list",
    entry="subscription table",
    model=SubscriptionTableConfig,
    description=(
        "NServiceBus native subscription tables (SQL transport subscription storage) whose "
        "subscribers are added to those under `subscriptions`."
    ),
    keys=(
        Key(
            "database",
            "string",
            "Name of the database (under `databases`) that holds the table.",
            example="receiver",
        ),
        Key(
            "table",
            "address",
            "The table: a table name or an address in the database's dialect.",
            example="SubscriptionRouting",
            default="SubscriptionRouting",
        ),
    ),
)

PUBLISH = Section(
    name="publish",
    shape="mapping",
    model=PublishConfig,
    description="How published events are multicast to their subscribers.",
    keys=(
        Key(
            "no_subscribers",
            "choice",
            "An event without subscribers: drop it (logged and counted) or move it to the "
            "error queue.",
            example="drop",
            default="drop",
            choices=("drop", "error"),
        ),
        Key(
            "cache",
            "duration",
            "How long subscriber lists read from `subscription_tables` are reused (NServiceBus "
            "uses 5s): a subscription added to or removed from a table takes effect at most "
            "this long after it is written. A warning above 1m.",
            example="5s",
            default=5.0,
            warn_outside=(0.0, 60.0),
            warn_hint="new subscriptions would be seen late",
            **_POSITIVE,
        ),
    ),
)

RETRIES = Section(
    name="retries",
    shape="mapping",
    model=RetryConfig,
    description=(
        "What happens when a delivery fails: a few immediate in-process attempts for transient "
        "errors, then durable delayed retries kept in the source database."
    ),
    keys=(
        Key(
            "delay",
            "duration",
            "Wait before the first delayed retry (and between them with `constant` backoff).",
            example="10s",
            default=10.0,
            **_POSITIVE,
        ),
        Key(
            "max_attempts",
            "integer",
            "Delivery attempts before a message is moved to the error queue.",
            example=100,
            default=100,
            minimum=1,
        ),
        Key(
            "backoff",
            "choice",
            "How the wait grows between delayed retries.",
            example="exponential",
            default="constant",
            choices=("constant", "linear", "exponential"),
        ),
        Key(
            "max_delay",
            "duration",
            "Longest wait between delayed retries; must be at least `delay`.",
            example="1h",
            default=3600.0,
            **_POSITIVE,
        ),
        Key(
            "immediate_attempts",
            "integer",
            "In-process attempts for transient errors before a delayed retry is scheduled.",
            example=3,
            default=3,
            minimum=1,
            maximum=10,
        ),
        Key(
            "missing_queue",
            "choice",
            "When the destination queue does not exist: keep retrying, or fail to the error queue.",
            example="retry",
            default="retry",
            choices=("retry", "error"),
        ),
        Key(
            "during_outage",
            "choice",
            "When a whole destination database is unreachable (cannot connect, does not exist, "
            "shutting down) or lacks a bridge table it cannot create: `count` spends an attempt "
            "each time as for any failure; `wait` spends none: one worker probes the database "
            "once per `delay` and its messages wait in retry storage until it is back, up to "
            "`max_wait`. Failures of one message (a rejected row, a missing queue in a reachable "
            "database) count in both.",
            example="wait",
            default="count",
            choices=("count", "wait"),
        ),
        Key(
            "max_wait",
            "duration",
            "With `during_outage: wait`, how long a message may wait from its first failure "
            "before it goes to the error queue (reason `outage-too-long`); must be at least "
            "`delay`. Expired messages are dropped while they wait, as always.",
            example="7d",
            default=7 * 24 * 3600.0,
            **_POSITIVE,
        ),
    ),
)

DELIVERY = Section(
    name="delivery",
    shape="mapping",
    model=DeliveryConfig,
    description=(
        "How messages cross into another database, for every route and proxy destination that "
        'does not say otherwise. See "Transaction modes" for which to choose.'
    ),
    keys=(
        _transaction_key(
            "`ledger`: exactly once, with a dedup-ledger table in each destination database. "
            "`two-phase`: exactly once with no bridge table in the destination, through "
            "PostgreSQL's `PREPARE TRANSACTION` (PostgreSQL forwarding and destination "
            "databases, `max_prepared_transactions` above 0 in the destination). "
            "`at-least-once`: no ledger; a crash between the two commits can deliver a "
            "message twice (counted as suspected duplicates).",
            default="ledger",
        ),
    ),
)

INSTALL = Section(
    name="install",
    shape="mapping",
    model=InstallConfig,
    description=(
        "Creating the bridge's own tables (forwarding and error queues, retry storage, counters, "
        "event types and destination states in forwarding databases; the dedup ledger in "
        "destination databases). `sfbridge install` creates them all; `install --print-sql` "
        "prints the DDL for a DBA."
    ),
    keys=(
        Key(
            "at_runtime",
            "boolean",
            "Whether the daemon creates one of those tables when it finds it missing (a "
            "database dropped and recreated heals without a human). `false` for shops where "
            "only a DBA runs DDL: a missing table is then reported (log, `status`, `check`) "
            "and its messages wait in retry storage.",
            example=True,
            default=True,
        ),
    ),
)

LEDGER = Section(
    name="ledger",
    shape="mapping",
    model=LedgerConfig,
    description="The deduplication ledger that keeps forwarding from delivering a message twice.",
    keys=(
        Key(
            "retention",
            "duration",
            "How long a forwarded message id is remembered.",
            example="7d",
            default=7 * 24 * 3600.0,
            **_POSITIVE,
        ),
        Key(
            "cleanup_interval",
            "duration",
            "How often expired ledger entries are deleted.",
            example="1m",
            default=60.0,
            **_POSITIVE,
        ),
        Key(
            "cleanup",
            "boolean",
            "Whether this bridge deletes expired ledger entries at all.",
            example=True,
            default=True,
        ),
    ),
)

LOGGING = Section(
    name="logging",
    shape="mapping",
    model=LoggingConfig,
    description="Log output.",
    keys=(
        Key(
            "level",
            "choice",
            "Least severe level that is logged.",
            example="INFO",
            default="INFO",
            choices=("DEBUG", "INFO", "WARNING", "ERROR"),
            case_insensitive=True,
        ),
    ),
)

SENTRY = Section(
    name="sentry",
    shape="mapping",
    model=SentryConfig,
    description="Error reporting to Sentry; an empty or absent `dsn` disables it.",
    keys=(
        Key(
            "dsn",
            "string",
            "Sentry DSN; `${VAR}` is expanded; empty means no Sentry.",
            example="${SENTRY_DSN:-}",
            default=None,
            expand_env=True,
            secret=True,
            empty_is_none=True,
            # Only the shape: sentry-sdk checks the rest when it starts, with its own message.
            pattern=r"https?://[^\s@/]+@[^\s/]+/\S+",
            pattern_message="is not a Sentry DSN: expected https://<key>@<host>/<project>",
        ),
        Key(
            "environment",
            "string",
            "Environment name attached to Sentry events; empty means none.",
            example="production",
            default=None,
            empty_is_none=True,
        ),
    ),
)

METRICS = Section(
    name="metrics",
    shape="mapping",
    model=MetricsConfig,
    description="Prometheus metrics, served by `sfbridge run` at `/metrics`; off without `listen`.",
    keys=(
        Key(
            "listen",
            "listen",
            "Address and port the daemon serves `/metrics` on. Keep it on loopback or a "
            "management network: the page names forwarders, databases and queues (never "
            "connection strings). Changing it takes a restart, not a reload.",
            example="127.0.0.1:9464",
            default=None,
        ),
    ),
)

SCHEMA: Final[tuple[Section, ...]] = (
    DATABASES,
    FORWARDERS,
    ROUTES,
    SUBSCRIPTIONS,
    SUBSCRIPTION_TABLES,
    PUBLISH,
    RETRIES,
    DELIVERY,
    INSTALL,
    LEDGER,
    LOGGING,
    SENTRY,
    METRICS,
)


def section(name: str) -> Section:
    """The top-level section called `name`; raises KeyError when there is none."""
    for candidate in SCHEMA:
        if candidate.name == name:
            return candidate
    raise KeyError(name)
