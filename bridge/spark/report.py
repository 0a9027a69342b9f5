"""`sfbridge spark report`: the error queues and retry storage, analysed on Spark.

The driver cuts each forwarder's error queue and its rows in retry storage into ranges of about
equal rows (`bridge.spark.partitions`); executors read them, parse each message's headers and
describe it as one row (`describe`), and Spark counts those rows by failure reason,
destination, exception type, age, attempts and hour of failure in one aggregation. The driver
gets the counts only. The result is JSON for scripts and a self-contained HTML page with charts
for people. No connection string, and so no password, is in either.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import dialect_for
from bridge.exceptions import DatabaseError, PoisonHeaders
from bridge.headers import (
    ATTEMPTS_HEADER,
    DESTINATION_HEADER,
    FAILURE_REASON_HEADER,
    parse_headers,
    parse_wire_date,
)
from bridge.messages import utcnow
from bridge.secrets import open_private
from bridge.spark import html
from bridge.spark.partitions import TableRange, plan_queue, plan_retry, read_ranges
from bridge.spark.shipped import ShippedConfig
from bridge.storage.tables import forwarder_tables

# Ages are counted in these buckets (upper bound in seconds, label).
AGE_BUCKETS = (
    (3600, "under 1 h"),
    (86400, "1 h to 1 d"),
    (7 * 86400, "1 d to 7 d"),
    (float("inf"), "over 7 d"),
)

ROW_SCHEMA = (
    "kind string, forwarder string, reason string, destination string, exception string, "
    "attempts int, age_bucket string, hour string"
)
# What each kind of row is counted by: (report key, column).
ERROR_BREAKDOWNS = (
    ("by_reason", "reason"),
    ("by_destination", "destination"),
    ("by_exception_type", "exception"),
    ("by_age", "age_bucket"),
    ("by_attempts", "attempts"),
    ("by_hour", "hour"),
    ("by_forwarder", "forwarder"),
)
RETRY_BREAKDOWNS = (
    ("by_destination", "destination"),
    ("by_last_error", "exception"),
    ("by_age", "age_bucket"),
    ("by_attempts", "attempts"),
)


def plan_reads(config: BridgeConfig, parallelism: int) -> tuple[list[TableRange], list[str]]:
    """The ranges of every forwarder's error queue and retry storage rows, and problems reading
    databases (sentences)."""
    ranges: list[TableRange] = []
    problems: list[str] = []
    connections = Connections(config.databases)
    try:
        for forwarder in config.forwarders:
            dialect = dialect_for(config.databases[forwarder.database].dialect)
            tables = forwarder_tables(config, forwarder)
            try:
                connection = connections.get(forwarder.database)
                _, errors = plan_queue(connection, dialect, forwarder.database,
                                       tables.error_queue, parallelism, forwarder.name)  # fmt: skip
                _, retries = plan_retry(connection, dialect, forwarder.database, tables.retry,
                                        forwarder.name, parallelism)  # fmt: skip
                ranges += errors + retries
            except DatabaseError as error:
                connections.discard(forwarder.database)
                problems.append(f"forwarder '{forwarder.name}': {error}")
    finally:
        connections.close()
    return ranges, problems


def described_rows(
    shipped: ShippedConfig, ranges: Iterable[TableRange], now_iso: str
) -> Iterator[tuple[Any, ...]]:
    """One row of ROW_SCHEMA per failed or waiting message in `ranges`. Runs on the executors."""
    config = shipped.load()
    for table_range, row in read_ranges(shipped, ranges):
        if table_range.kind == "retry":
            _, destination, attempts, first_failure_at, last_error = row
            dialect = dialect_for(config.databases[table_range.database].dialect)
            first = dialect.decode_timestamp(first_failure_at)
            raw: tuple[Any, ...] = (
                "retry", table_range.label, None, destination, int(attempts),
                first.isoformat() if first else None, last_error,
            )  # fmt: skip
        else:
            raw = ("error", table_range.label, row[2], None, None, None, None)
        yield describe(raw, now_iso)


def describe(raw: tuple[Any, ...], now_iso: str) -> tuple[Any, ...]:
    """One row of ROW_SCHEMA from a raw row. Runs on the executors."""
    kind, forwarder, headers_text, destination, attempts, first_failure, last_error = raw
    now = datetime.fromisoformat(now_iso)
    if kind == "retry":
        failed_at = datetime.fromisoformat(first_failure) if first_failure else None
        reason = "waiting-for-retry"
        exception = _first_words(last_error)
    else:
        try:
            headers = parse_headers(headers_text)
        except PoisonHeaders:
            headers = {}
        reason = headers.get(FAILURE_REASON_HEADER) or "poison (moved as it was)"
        destination = headers.get(DESTINATION_HEADER) or "(none)"
        exception = headers.get("NServiceBus.ExceptionInfo.ExceptionType") or "(none)"
        attempts = int(headers.get(ATTEMPTS_HEADER) or 0)
        moment = parse_wire_date(headers.get("NServiceBus.TimeOfFailure") or "")
        failed_at = moment.replace(tzinfo=None) if moment else None
    age = (now - failed_at).total_seconds() if failed_at else None
    bucket = (
        "unknown" if age is None else next(label for limit, label in AGE_BUCKETS if age < limit)
    )
    hour = failed_at.strftime("%Y-%m-%d %H:00") if failed_at else "unknown"
    return (kind, forwarder, reason, destination or "(none)", exception, attempts, bucket, hour)


def _first_words(text: str | None) -> str:
    return (text or "(none)").split(":")[0][:80]


def build_report(spark: Any, config: BridgeConfig, shipped: ShippedConfig) -> dict[str, Any]:
    """The report as a dict (for JSON): counts per breakdown, most first, and `problems`."""
    ranges, problems = plan_reads(config, spark.sparkContext.defaultParallelism)
    now_iso = utcnow().isoformat(timespec="seconds")
    totals, counted = _count(spark, shipped, ranges, now_iso) if ranges else ({}, {})

    def counts(kind: str, column: str) -> list[list[Any]]:
        rows = counted.get((kind, column), [])
        if column == "attempts":
            rows = [[int(value), count] for value, count in rows]
        return sorted(rows, key=lambda row: (-row[1], str(row[0])))

    errors: dict[str, Any] = {"messages": totals.get("error", 0)}
    errors.update((key, counts("error", column)) for key, column in ERROR_BREAKDOWNS)
    errors["by_hour"] = sorted(errors["by_hour"])
    retries: dict[str, Any] = {"messages": totals.get("retry", 0)}
    retries.update((key, counts("retry", column)) for key, column in RETRY_BREAKDOWNS)
    return {
        "generated_at": now_iso + "Z",
        "error_queue": errors,
        "retry_storage": retries,
        "problems": problems,
    }


def _count(
    spark: Any, shipped: ShippedConfig, ranges: list[TableRange], now_iso: str
) -> tuple[dict[str, int], dict[tuple[str, str], list[list[Any]]]]:
    """(messages per kind, [value, count] pairs per (kind, column)), in one Spark job."""
    from pyspark.sql import functions as F

    rdd = spark.sparkContext.parallelize(ranges, len(ranges)).mapPartitions(
        lambda part: described_rows(shipped, part, now_iso)
    )
    frame = spark.createDataFrame(rdd, ROW_SCHEMA, verifySchema=False)
    # Every breakdown in one aggregation: each row becomes a (column, value) pair per column,
    # plus one ("", "") pair that counts the message itself.
    columns = sorted({column for _, column in ERROR_BREAKDOWNS + RETRY_BREAKDOWNS})
    pairs = [F.struct(F.lit("").alias("dimension"), F.lit("").alias("value"))]
    pairs += [
        F.struct(F.lit(column).alias("dimension"), F.col(column).cast("string").alias("value"))
        for column in columns
    ]
    unpivoted = frame.select("kind", F.explode(F.array(*pairs)).alias("pair"))
    totals: dict[str, int] = {}
    counted: dict[tuple[str, str], list[list[Any]]] = {}
    for row in unpivoted.groupBy("kind", "pair.dimension", "pair.value").count().collect():
        if row.dimension == "":
            totals[row.kind] = int(row["count"])
        else:
            counted.setdefault((row.kind, row.dimension), []).append([row.value, int(row["count"])])
    return totals, counted


def render_html(report: dict[str, Any]) -> str:
    errors, retries = report["error_queue"], report["retry_storage"]

    def chart(title: str, rows: list[list[Any]]) -> str:
        return html.bar_chart(title, [(str(label), int(count)) for label, count in rows])

    sections = [
        f"<p>Generated {report['generated_at']}: {errors['messages']} message(s) in error "
        f"queues, {retries['messages']} waiting in retry storage.</p>",
        "<h2>Error queues</h2>",
        chart("By failure reason", errors["by_reason"]),
        chart("By destination", errors["by_destination"]),
        chart("By exception type", errors["by_exception_type"]),
        chart("By age", errors["by_age"]),
        chart("By attempts made", errors["by_attempts"]),
        chart("By hour of failure (UTC)", errors["by_hour"]),
        "<h2>Retry storage</h2>",
        chart("By destination", retries["by_destination"]),
        chart("By last error", retries["by_last_error"]),
        chart("By age", retries["by_age"]),
        chart("By attempts made", retries["by_attempts"]),
    ]
    if report["problems"]:
        sections.append(html.table(["could not read"], [[p] for p in report["problems"]]))
    return html.page("sfbridge: failed and waiting messages", sections, report)


def write_report(report: dict[str, Any], path: str) -> list[str]:
    """`path`.json and `path`.html (a `.json` or `.html` suffix on `path` is dropped)."""
    base = path.removesuffix(".json").removesuffix(".html")
    # Headers and errors of failed messages: for the bridge's user only.
    with open_private(base + ".json") as handle:
        json.dump(report, handle, indent=2, default=str)
    with open_private(base + ".html") as handle:
        handle.write(render_html(report))
    return [base + ".json", base + ".html"]


def iter_lines(report: dict[str, Any]) -> Iterator[str]:
    errors, retries = report["error_queue"], report["retry_storage"]
    yield f"error queues: {errors['messages']} message(s)"
    for reason, count in errors["by_reason"]:
        yield f"  {count:6d}  {reason}"
    yield f"retry storage: {retries['messages']} message(s)"
    for destination, count in retries["by_destination"]:
        yield f"  {count:6d}  {destination}"
