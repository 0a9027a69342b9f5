"""The schema's sections about what flows where: `forwarders`, `routes`, `subscriptions`,
`subscription_tables` and `publish`."""

from __future__ import annotations

from bridge.config.keys import Key, Section
from bridge.config.model import (
    FixedDestination,
    ForwarderConfig,
    PublishConfig,
    RouteConfig,
    SubscriptionTableConfig,
)
from bridge.config.schema.common import (
    _POSITIVE,
    NAME_MESSAGE,
    NAME_PATTERN,
    _transaction_key,
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
            "Queue to drain: a table name or an address in the database's dialect. In "
            "PostgreSQL an unquoted dot separates schema and table: quote a dotted table name "
            "(`'\"sfbridge.forward\"'` in YAML).",
            example='"sfbridge.forward"',
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
        Key(
            "schemas",
            "names",
            "Schemas a destination address may name besides the database's default, for "
            "endpoints in several schemas (NServiceBus `UseSchemaForEndpoint`). An address "
            "naming any other schema is refused as unroutable (not for sqlite; `schema` "
            'overrides the address). See "Trust: what a sender reaches".',
            example=["billing", "shipping"],
            default=(),
        ),
        Key(
            "catalogs",
            "names",
            "Other catalogs on this SQL Server database's server that an address may name "
            "(three-part names); any other catalog that is not a configured database's is "
            "refused as unroutable (only for sqlserver).",
            example=["ArchiveDb"],
            default=(),
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
