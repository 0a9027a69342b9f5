"""The schema's `databases` section: where each database is and how to reach it."""

from __future__ import annotations

from bridge.config.keys import Key, Section
from bridge.config.model import (
    POOLERS,
    DatabaseConfig,
)
from bridge.config.schema.common import (
    _CONNECTION_HINT,
    _PATH_HINT,
    _POSITIVE,
    _SCHEMA_HINT,
    CATALOG_DIALECTS,
    DIALECTS,
    DRIVER_DIALECTS,
    DRIVERS,
    FILE_DIALECTS,
    IMPLEMENTED_DIALECTS,
    NAME_PATTERN,
    POOLER_DIALECTS,
    SCHEMA_DIALECTS,
    SERVER_DIALECTS,
    _names,
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
            "ODBC connection string; `${VAR}` is expanded (keep passwords in the environment), "
            "and needed only by the commands that open this database.",
            example="Driver={PostgreSQL Unicode};Server=db1;Database=receiver;Uid=bridge",
            expand_env=True,
            secret=True,
            dialects=SERVER_DIALECTS,
            dialect_hint=_CONNECTION_HINT,
        ),
        Key(
            "path",
            "string",
            "SQLite database file; `${VAR}` is expanded (needed only by the commands that open "
            "it); a relative path is taken from the config file's folder.",
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
            "while the rest of the batch is delivered; a batch whose write misses it while the "
            "destination answers is written again in halves, and a message that misses it "
            "alone fails alone (reason: larger than query_timeout allows); a forwarding "
            "database that does not "
            "answer has its batch rolled back and tried again. Enforced by the server "
            "(`statement_timeout`, `lock_timeout`, `SET LOCK_TIMEOUT`) and by the client "
            "(psycopg; SQL Server's ODBC drivers), so a silent network cannot hold a worker. "
            "Keep it well above the slowest healthy statement (a batch of `batch_bytes`).",
            example="15s",
            default=15.0,
            **_POSITIVE,
        ),
        Key(
            "max_connections",
            "integer",
            "The most connections the daemon holds to this database at once: its forwarders' "
            "shared worker pool (in all its processes, see `daemon.processes`), the connection "
            "that watches its queues for work (and one that listens for pushes, on "
            "PostgreSQL), the heartbeat's and one for upkeep (status, "
            "ledger cleanup, probes; one more with `metrics`). The default "
            "leaves most of PostgreSQL's default `max_connections = 100` to other clients; "
            "`sfbridge check` warns when the configured databases of one server could take "
            "more than it allows.",
            example=10,
            default=10,
            minimum=4,
            maximum=10000,
        ),
        Key(
            "max_messages_per_second",
            "integer",
            "Catch-up limit: the most messages per second the daemon writes into this database "
            "from forwarders in other databases, in all its worker processes together (unset: "
            "no limit, and nothing spent on one). So that a destination back from a long "
            "outage is not hit by the whole backlog at once; a batch waits for its turn, its "
            "rows still in place. Time and messages held back show in `sfbridge status` and "
            "in the metrics (`sfbridge_catch_up_held_seconds_total`).",
            example=2000,
            default=None,
            minimum=1,
            maximum=10_000_000,
        ),
        Key(
            "max_batches_in_flight",
            "integer",
            "Catch-up limit: the most batches the daemon writes into this database at once "
            "from forwarders in other databases, in all its worker processes together (unset: "
            "as many as its workers). A batch waits for a free place before it opens its "
            "destination transaction.",
            example=2,
            default=None,
            minimum=1,
            maximum=10000,
        ),
        Key(
            "driver",
            "choice",
            "Driver to open the database with (default: the first). `psycopg` is psycopg 3 "
            "(PostgreSQL's own protocol, binary parameters, prepared statements; no system "
            "packages); it reads `Server`, `Port`, `Uid`, `Pwd`, `Database`, every libpq "
            "parameter (`target_session_attrs`, `load_balance_hosts`, `hostaddr`, `sslmode`, "
            "...) and psqlODBC's `pqopt={...}` from the ODBC-style `connection` (or takes a "
            "`postgresql://` URL). `odbc` is psqlODBC through pyodbc, as before; the bridge "
            "moves the libpq parameters psqlODBC would ignore into its `pqopt`. A key the "
            "bridge sets itself (`connect_timeout`) is refused, one it does not know is warned "
            'of (see "Failover and standbys" in the operating guide).',
            example="psycopg",
            default=None,
            choices=DRIVERS,
            dialects=DRIVER_DIALECTS,
            dialect_hint=f"only {_names(DRIVER_DIALECTS)} databases have a choice of driver",
        ),
        Key(
            "pooler",
            "choice",
            "What `connection` reaches: the server itself (`none`, the default), or a "
            "connection pooler "
            "such as PgBouncer in `session` or `transaction` pooling mode (its `pool_mode`; "
            "the bridge cannot ask a pooler which mode it is in, so it is said here). Behind "
            "`transaction` pooling nothing of a session outlives its transaction: the bridge "
            "prepares no statement on the server, sets its timeouts in every transaction "
            "(`SET LOCAL`), and does not LISTEN (a pooler drops notifications): new messages "
            'are polled for every `peek_interval`. Needs `driver: psycopg`. See "Behind a '
            'connection pooler" in docs/operating.md.',
            example="transaction",
            default=None,
            choices=POOLERS,
            dialects=POOLER_DIALECTS,
            dialect_hint=f"only {_names(POOLER_DIALECTS)} databases sit behind a pooler",
        ),
    ),
)
