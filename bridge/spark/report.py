"""`sfbridge spark report`: the error queues and retry storage, analysed on Spark.

Rows are read from each forwarding database on the driver; their headers are parsed on the
executors, and the counts by failure reason, destination, exception type, age, attempts and
hour of failure are Spark aggregations. The result is JSON for scripts and a self-contained
HTML page with charts for people. No connection string, and so no password, is in either.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import dialect_for
from bridge.drivers import DatabaseError
from bridge.headers import (
    ATTEMPTS_HEADER,
    DESTINATION_HEADER,
    FAILURE_REASON_HEADER,
    PoisonHeaders,
    parse_headers,
    parse_wire_date,
)
from bridge.spark import html
from bridge.tables import forwarder_tables

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


def collect_rows(config: BridgeConfig) -> tuple[list[tuple[Any, ...]], list[str]]:
    """(kind, forwarder, headers or retry fields...) per failed or waiting message, and
    problems reading databases (sentences)."""
    raw: list[tuple[Any, ...]] = []
    problems: list[str] = []
    connections = Connections(config.databases)
    try:
        for forwarder in config.forwarders:
            dialect = dialect_for(config.databases[forwarder.database].dialect)
            tables = forwarder_tables(config, forwarder)
            try:
                connection = connections.get(forwarder.database)
                connection.begin()
                for (headers,) in connection.query(
                    dialect.sql("queue_read_headers", queue=tables.error_queue)
                ):
                    raw.append(("error", forwarder.name, headers, None, None, None, None))
                for row in connection.query_named(
                    dialect.sql("retry_read", retry=tables.retry), (forwarder.name,)
                ):
                    first = dialect.decode_timestamp(row["first_failure_at"])
                    raw.append(
                        (
                            "retry",
                            forwarder.name,
                            None,
                            row["destination"],
                            int(row["attempts"]),
                            first.isoformat() if first else None,
                            row["last_error"],
                        )
                    )
                connection.commit()
            except DatabaseError as error:
                connections.discard(forwarder.database)
                problems.append(f"forwarder '{forwarder.name}': {error}")
    finally:
        connections.close()
    return raw, problems


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


def build_report(spark: Any, config: BridgeConfig) -> dict[str, Any]:
    raw, problems = collect_rows(config)
    now_iso = datetime.now(UTC).replace(tzinfo=None).isoformat(timespec="seconds")
    described = spark.sparkContext.parallelize(raw or [], max(1, min(8, len(raw) // 500 + 1)))
    frame = spark.createDataFrame(described.map(lambda row: describe(row, now_iso)), ROW_SCHEMA)
    frame.cache()

    def counts(kind: str, column: str) -> list[list[Any]]:
        grouped = frame.where(frame.kind == kind).groupBy(column).count()
        return [
            [row[0], int(row[1])] for row in grouped.orderBy("count", ascending=False).collect()
        ]

    report = {
        "generated_at": now_iso + "Z",
        "error_queue": {
            "messages": frame.where(frame.kind == "error").count(),
            "by_reason": counts("error", "reason"),
            "by_destination": counts("error", "destination"),
            "by_exception_type": counts("error", "exception"),
            "by_age": counts("error", "age_bucket"),
            "by_attempts": counts("error", "attempts"),
            "by_hour": sorted(counts("error", "hour")),
            "by_forwarder": counts("error", "forwarder"),
        },
        "retry_storage": {
            "messages": frame.where(frame.kind == "retry").count(),
            "by_destination": counts("retry", "destination"),
            "by_last_error": counts("retry", "exception"),
            "by_age": counts("retry", "age_bucket"),
            "by_attempts": counts("retry", "attempts"),
        },
        "problems": problems,
    }
    frame.unpersist()
    return report


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
    with open(base + ".json", "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2, default=str)
    with open(base + ".html", "w", encoding="utf-8") as handle:
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
