"""`sfbridge spark reconcile`: is every message in exactly one place? Counted from the databases.

Per forwarder, from its own database: what is queued, waiting in retry storage and in the error
queue, and the counters, which every batch writes in the same transaction as its claim; the
invariant is claimed + fan-out copies = delivered + duplicates skipped + expired + retries
scheduled + sent to the error queue + published without subscribers. These are a few small
queries on the driver.

Per destination database, the dedup ledger against the destination queues it names, on Spark:
executors read the ledger's (message id, destination) pairs and the queues' rows in ranges of
about equal rows (`bridge.spark.partitions`), parse each row's headers for its message id, and
Spark joins the two sides on (database, destination, message id) and counts each pair's status
per destination. A ledger entry without its message in the queue, a message without its ledger
entry, or a message in the queue more than once is a discrepancy. The driver gets the counts and
at most MAX_IDS_LISTED ids per destination and kind of discrepancy, in one Spark job (the
samples' branch reuses the join's shuffled input instead of reading the databases again).

The comparison assumes the receiving endpoints have not consumed the messages yet (as after a
migration drain): run it with them stopped, or narrow it with `--since` (then only ledger
entries since that time are held against the queues: queue rows carry no delivery time, so the
other direction is not checked).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import dialect_for
from bridge.exceptions import DatabaseError, PoisonHeaders, TableNotFound
from bridge.forwarding.settle import CLAIMED, FAN_OUT_COPIES, OUTCOMES
from bridge.headers import MESSAGE_ID_HEADER, parse_headers
from bridge.spark.partitions import TableRange, plan_ledger, plan_queue, read_ranges
from bridge.spark.shipped import ShippedConfig
from bridge.storage.ledger import ledger_address, ledger_databases, ledger_key
from bridge.storage.tables import forwarder_tables

# Ids listed per destination and kind of discrepancy, at most; the counts are always complete.
MAX_IDS_LISTED = 50

# What a (message id, destination) pair is, once the ledger and the queue are joined.
OK = "ok"
MISSING = "missing"  # in the ledger, not in the queue
UNRECORDED = "unrecorded"  # in the queue, not in the ledger
REPEATED = "repeated"  # in the ledger, and in the queue more than once
WITHOUT_ID = "without-id"  # queue rows whose headers name no message id (or cannot be read)

PAIRS_SCHEMA = "database string, destination string, key string"


@dataclass
class DatabasePlan:
    """What the driver learnt of one destination database before the comparison."""

    database: str
    ledger_entries: dict[str, int] = field(default_factory=dict)
    ledger_ranges: list[TableRange] = field(default_factory=list)
    queue_ranges: list[TableRange] = field(default_factory=list)
    # Destinations the ledger names whose queue table does not exist.
    missing_tables: set[str] = field(default_factory=set)
    error: str | None = None


def reconcile(
    spark: Any, config: BridgeConfig, shipped: ShippedConfig, since: datetime | None
) -> dict[str, Any]:
    """The reconciliation as a dict (for JSON): `forwarders`, `destinations`, `discrepancies`
    (sentences, empty when everything reconciles)."""
    parallelism = spark.sparkContext.defaultParallelism
    connections = Connections(config.databases)
    discrepancies: list[str] = []
    try:
        forwarders = [
            _forwarder(config, connections, f.name, discrepancies) for f in config.forwarders
        ]
        plans = [
            _plan(config, connections, database, since, parallelism, discrepancies)
            for database in ledger_databases(config)
        ]
    finally:
        connections.close()
    counted = _compare(spark, shipped, plans)
    destinations = []
    for plan in plans:
        if plan.error is not None:
            destinations.append({"database": plan.database, "error": plan.error})
            continue
        for destination in sorted(plan.ledger_entries):
            if destination in plan.missing_tables:
                continue
            entry = _entry(plan.database, destination, counted, since)
            destinations.append(entry)
            discrepancies.extend(_sentences(entry))
    return {"forwarders": forwarders, "destinations": destinations, "discrepancies": discrepancies}


def _forwarder(
    config: BridgeConfig, connections: Connections, name: str, discrepancies: list[str]
) -> dict[str, Any]:
    forwarder = config.forwarder(name)
    dialect = dialect_for(config.databases[forwarder.database].dialect)
    tables = forwarder_tables(config, forwarder)
    entry: dict[str, Any] = {"forwarder": name, "database": forwarder.database}
    try:
        connection = connections.get(forwarder.database)
        connection.begin()

        def count(address: Any) -> int:
            return int(connection.query(dialect.sql("queue_count", queue=address))[0][0])

        entry["queued"] = count(tables.queue)
        entry["in_error_queue"] = count(tables.error_queue)
        retries = connection.query(dialect.sql("retry_summary", retry=tables.retry), (name,))
        entry["waiting_in_retry"] = sum(int(row[1]) for row in retries)
        counters = {
            str(row[0]): int(row[1])
            for row in connection.query(
                dialect.sql("counters_read", counters=tables.counters), (name,)
            )
        }
        connection.commit()
    except DatabaseError as error:
        connections.discard(forwarder.database)
        discrepancies.append(f"forwarder '{name}': cannot read its database: {error}")
        entry["error"] = str(error)
        return entry
    entry["counters"] = counters
    claimed = counters.get(CLAIMED, 0) + counters.get(FAN_OUT_COPIES, 0)
    settled = sum(counters.get(outcome, 0) for outcome in OUTCOMES)
    entry["claimed"] = claimed
    entry["settled"] = settled
    if CLAIMED not in counters and settled:
        # Counted by an sfbridge that did not count claims yet: nothing to hold them against.
        entry["claims_not_counted"] = True
    elif claimed != settled:
        discrepancies.append(
            f"forwarder '{name}': {claimed} claimed (with fan-out copies) but {settled} "
            f"settled ({', '.join(f'{o} {counters.get(o, 0)}' for o in OUTCOMES)})"
        )
    return entry


def _plan(
    config: BridgeConfig,
    connections: Connections,
    database: str,
    since: datetime | None,
    parallelism: int,
    discrepancies: list[str],
) -> DatabasePlan:
    """The ranges of the ledger and of each queue it names, in one destination database."""
    dialect = dialect_for(config.databases[database].dialect)
    grammar = dialect.grammar
    target = config.databases[database]
    plan = DatabasePlan(database)
    try:
        connection = connections.get(database)
        plan.ledger_entries, plan.ledger_ranges = plan_ledger(
            connection, dialect, database, ledger_address(config, database), since, parallelism
        )
        for destination in sorted(plan.ledger_entries):
            address = grammar.resolve(grammar.parse(destination), target.schema, None)
            try:
                _, ranges = plan_queue(
                    connection, dialect, database, address, parallelism, destination
                )
            except TableNotFound:
                plan.missing_tables.add(destination)
                discrepancies.append(
                    f"{destination} in database '{database}': the ledger names it, but the "
                    "queue table does not exist (dropped since?)"
                )
                continue
            plan.queue_ranges.extend(ranges)
    except DatabaseError as error:
        connections.discard(database)
        discrepancies.append(f"database '{database}': cannot read its ledger or queues: {error}")
        plan.error = str(error)
    return plan


# -- on Spark -------------------------------------------------------------------------------


def ledger_pairs(
    shipped: ShippedConfig, ranges: Iterable[TableRange]
) -> Iterator[tuple[str, str, str]]:
    """(database, destination, key) of each ledger entry in `ranges`. Runs on the executors."""
    for table_range, (key, destination) in read_ranges(shipped, ranges):
        yield table_range.database, str(destination), str(key)


def queue_pairs(
    shipped: ShippedConfig, ranges: Iterable[TableRange]
) -> Iterator[tuple[str, str, str | None]]:
    """(database, destination, ledger key or None) of each queue row in `ranges`: the key the
    ledger records for the message id in the row's headers. Runs on the executors."""
    for table_range, (_, _, headers_text) in read_ranges(shipped, ranges):
        message_id = message_id_of(headers_text)
        key = ledger_key(message_id) if message_id is not None else None
        yield table_range.database, table_range.label, key


def message_id_of(headers_text: str | None) -> str | None:
    try:
        return parse_headers(headers_text).get(MESSAGE_ID_HEADER) or None
    except PoisonHeaders:
        return None


def _compare(
    spark: Any, shipped: ShippedConfig, plans: list[DatabasePlan]
) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (database, destination): per status, its pairs, its queue rows and the first ids."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ledger_ranges = [r for plan in plans for r in plan.ledger_ranges]
    queue_ranges = [r for plan in plans for r in plan.queue_ranges]
    if not ledger_ranges and not queue_ranges:
        return {}
    ledger = _frame(spark, ledger_ranges, lambda part: ledger_pairs(shipped, part))
    queue = _frame(spark, queue_ranges, lambda part: queue_pairs(shipped, part))
    keys = ["database", "destination", "key"]
    copies = queue.groupBy(*keys).agg(F.count(F.lit(1)).alias("copies"))
    pairs = ledger.withColumn("recorded", F.lit(True)).join(copies, keys, "full_outer")
    status = (
        F.when(F.col("key").isNull(), WITHOUT_ID)
        .when(F.col("copies").isNull(), MISSING)
        .when(F.col("recorded").isNull(), UNRECORDED)
        .when(F.col("copies") > 1, REPEATED)
        .otherwise(OK)
    )
    pairs = pairs.withColumn("status", status)
    groups = ["database", "destination", "status"]
    counts = (
        pairs.groupBy(*groups)
        .agg(F.count(F.lit(1)).alias("pairs"), F.sum("copies").alias("rows"))
        .withColumn("key", F.lit(None).cast("string"))
    )
    # A top-n per group: Spark limits each group before the shuffle (WindowGroupLimit), so
    # millions of discrepancies move no more than n ids per group and partition.
    first_keys = Window.partitionBy(*groups).orderBy("key")
    samples = (
        pairs.where(F.col("status").isin(MISSING, UNRECORDED, REPEATED))
        .withColumn("n", F.row_number().over(first_keys))
        .where(F.col("n") <= MAX_IDS_LISTED)
        .select(
            *groups,
            F.lit(None).cast("long").alias("pairs"),
            F.lit(None).cast("long").alias("rows"),
            "key",
        )
    )
    counted: dict[tuple[str, str], dict[str, Any]] = {}
    for row in counts.unionByName(samples).collect():
        slot = counted.setdefault((row.database, row.destination), {}).setdefault(
            row.status, {"pairs": 0, "rows": 0, "ids": []}
        )
        if row.key is None:
            slot["pairs"], slot["rows"] = int(row.pairs), int(row.rows or 0)
        else:
            slot["ids"].append(row.key)
    return counted


def _frame(spark: Any, ranges: list[TableRange], rows_of: Any) -> Any:
    """A DataFrame of PAIRS_SCHEMA read by one task per range."""
    context = spark.sparkContext
    rdd = context.parallelize(ranges, max(1, len(ranges))).mapPartitions(rows_of)
    return spark.createDataFrame(rdd, PAIRS_SCHEMA, verifySchema=False)


def _entry(
    database: str,
    destination: str,
    counted: dict[tuple[str, str], dict[str, Any]],
    since: datetime | None,
) -> dict[str, Any]:
    statuses = counted.get((database, destination), {})

    def part(status: str) -> dict[str, Any]:
        return statuses.get(status, {"pairs": 0, "rows": 0, "ids": []})

    def listed(status: str) -> dict[str, Any]:
        found = part(status)
        return {"count": found["pairs"], "ids": sorted(found["ids"])}

    return {
        "database": database,
        "destination": destination,
        "ledger_entries": sum(part(s)["pairs"] for s in (OK, MISSING, REPEATED)),
        "queued": sum(part(s)["rows"] for s in (OK, UNRECORDED, REPEATED, WITHOUT_ID)),
        "without_message_id": part(WITHOUT_ID)["rows"],
        "in_ledger_not_in_queue": listed(MISSING),
        # With --since only ledger entries are narrowed; queue rows have no time.
        "in_queue_not_in_ledger": listed(UNRECORDED) if since is None else None,
        "in_queue_more_than_once": listed(REPEATED),
    }


def _sentences(entry: dict[str, Any]) -> list[str]:
    where = f"{entry['destination']} in database '{entry['database']}'"
    found = []
    for key, what in (
        ("in_ledger_not_in_queue", "recorded as delivered but not in the queue"),
        ("in_queue_not_in_ledger", "in the queue without a ledger entry"),
        ("in_queue_more_than_once", "recorded once but in the queue more than once"),
    ):
        listed = entry[key]
        if listed and listed["count"]:
            more = listed["count"] - len(listed["ids"])
            ids = ", ".join(listed["ids"]) + (f" and {more} more" if more else "")
            found.append(f"{where}: {listed['count']} message(s) {what}: {ids}")
    return found


def render_text(result: dict[str, Any]) -> str:
    lines = []
    for entry in result["forwarders"]:
        if "error" in entry:
            lines.append(f"forwarder {entry['forwarder']}: UNREADABLE: {entry['error']}")
            continue
        lines.append(
            f"forwarder {entry['forwarder']}: queued {entry['queued']}, waiting in retry "
            f"{entry['waiting_in_retry']}, in error queue {entry['in_error_queue']}; claimed "
            f"{entry['claimed']} = settled {entry['settled']}"
            + (
                "  (claims not counted by the sfbridge that wrote these counters)"
                if entry.get("claims_not_counted")
                else ("" if entry["claimed"] == entry["settled"] else "  <- MISMATCH")
            )
        )
    for entry in result["destinations"]:
        if "error" in entry:
            lines.append(f"database {entry['database']}: UNREADABLE: {entry['error']}")
            continue
        unrecorded = entry["in_queue_not_in_ledger"]
        lines.append(
            f"{entry['destination']} in '{entry['database']}': {entry['ledger_entries']} in the "
            f"ledger, {entry['queued']} queued; {entry['in_ledger_not_in_queue']['count']} "
            "missing from the queue, "
            + (f"{unrecorded['count']} without a ledger entry, " if unrecorded else "")
            + f"{entry['in_queue_more_than_once']['count']} in the queue more than once"
            + (
                f", {entry['without_message_id']} without a message id"
                if entry["without_message_id"]
                else ""
            )
        )
    if result["discrepancies"]:
        lines.append(f"{len(result['discrepancies'])} discrepancies:")
        lines.extend(f"  - {line}" for line in result["discrepancies"])
    else:
        lines.append("everything reconciles: every message is in exactly one place")
    return "\n".join(lines)
