"""The schema's sections about how messages are delivered: `retries`, `delivery`, `install` and
`ledger`."""

from __future__ import annotations

from bridge.config.keys import Key, Section
from bridge.config.model import (
    DeliveryConfig,
    InstallConfig,
    LedgerConfig,
    RetryConfig,
)
from bridge.config.schema.common import (
    _POSITIVE,
    _transaction_key,
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
            "Delivery attempts before a message is moved to the error queue (an outage of "
            "the whole destination database spends none unless `during_outage` is `count`).",
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
            "shutting down), read-only (a standby after a failover, a frozen or restoring "
            "database) or lacks a bridge table it cannot create: `wait` (the default) spends no "
            "attempt: the database is probed once per `delay` and its messages wait in retry "
            "storage until it is back, up to `max_wait`; `count` spends an attempt each time as "
            "for any failure, so an outage longer than `delay` x `max_attempts` sends good "
            "messages to the error queue. Failures of one message (a rejected row, a missing "
            "queue in a reachable database) count in both.",
            example="wait",
            default="wait",
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
        "event types, destination and forwarder states and daemons in forwarding databases; the "
        "dedup ledger in "
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
