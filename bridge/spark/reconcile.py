"""`sfbridge spark reconcile`: is every message in exactly one place? Counted from the databases.

Per forwarder, from its own database: what is queued, waiting in retry storage and in the error
queue, and the counters, which every batch writes in the same transaction as its claim; the
invariant is claimed + fan-out copies = delivered + duplicates skipped + expired + retries
scheduled + sent to the error queue + published without subscribers. Per destination database,
the dedup ledger against the destination queues it names: a ledger entry without its message in
the queue, or a message without its ledger entry, is a discrepancy. That comparison assumes the
receiving endpoints have not consumed the messages yet (as after a migration drain): run it with
them stopped, or narrow it with `--since` (then only ledger entries since that time are held
against the queues: queue rows carry no delivery time, so the other direction is not checked).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import dialect_for
from bridge.drivers import DatabaseError, QueueNotFound
from bridge.headers import MESSAGE_ID_HEADER, PoisonHeaders, parse_headers
from bridge.ledger import ledger_address, ledger_databases, ledger_key
from bridge.settle import CLAIMED, FAN_OUT_COPIES, OUTCOMES
from bridge.tables import forwarder_tables

# Ids listed per discrepancy, at most; the counts are always complete.
MAX_IDS_LISTED = 50


def reconcile(spark: Any, config: BridgeConfig, since: datetime | None) -> dict[str, Any]:
    """The reconciliation as a dict (for JSON): `forwarders`, `destinations`, `discrepancies`
    (sentences, empty when everything reconciles)."""
    connections = Connections(config.databases)
    discrepancies: list[str] = []
    try:
        forwarders = [
            _forwarder(config, connections, f.name, discrepancies) for f in config.forwarders
        ]
        destinations = []
        for database in ledger_databases(config):
            destinations.extend(
                _destinations(spark, config, connections, database, since, discrepancies)
            )
    finally:
        connections.close()
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


def _destinations(
    spark: Any,
    config: BridgeConfig,
    connections: Connections,
    database: str,
    since: datetime | None,
    discrepancies: list[str],
) -> list[dict[str, Any]]:
    """Ledger against destination queues in one database, compared on Spark."""
    dialect = dialect_for(config.databases[database].dialect)
    grammar = dialect.grammar
    target = config.databases[database]
    try:
        connection = connections.get(database)
        connection.begin()
        cutoff = since or datetime(1970, 1, 1)
        ledger_rows = [
            (str(key), str(destination))
            for key, destination, _ in connection.query(
                dialect.sql("ledger_read_since", ledger=ledger_address(config, database)),
                (dialect.encode_timestamp(cutoff),),
            )
        ]
        queue_rows: list[tuple[str, str]] = []
        without_id: dict[str, int] = {}
        for destination in sorted({destination for _, destination in ledger_rows}):
            address = grammar.resolve(grammar.parse(destination), target.schema, None)
            try:
                rows = connection.query(dialect.sql("queue_read_headers", queue=address))
            except QueueNotFound:
                connection.rollback()
                connection.begin()
                discrepancies.append(
                    f"{destination} in database '{database}': the ledger names it, but the "
                    "queue table does not exist (dropped since?)"
                )
                continue
            for (headers_text,) in rows:
                message_id = _message_id(headers_text)
                if message_id is None:
                    without_id[destination] = without_id.get(destination, 0) + 1
                else:
                    queue_rows.append((ledger_key(message_id), destination))
        connection.commit()
    except DatabaseError as error:
        connections.discard(database)
        discrepancies.append(f"database '{database}': cannot read its ledger or queues: {error}")
        return [{"database": database, "error": str(error)}]
    ledger = spark.createDataFrame(ledger_rows, "key string, destination string")
    queues = spark.createDataFrame(queue_rows, "key string, destination string")
    only_ledger = ledger.join(queues, ["key", "destination"], "left_anti")
    only_queue = queues.join(ledger, ["key", "destination"], "left_anti")
    results = []
    for destination in sorted({destination for _, destination in ledger_rows}):
        missing = sorted(
            row.key for row in only_ledger.where(only_ledger.destination == destination).collect()
        )
        unrecorded = sorted(
            row.key for row in only_queue.where(only_queue.destination == destination).collect()
        )
        in_ledger = sum(1 for _, d in ledger_rows if d == destination)
        in_queue = sum(1 for _, d in queue_rows if d == destination)
        results.append(
            {
                "database": database,
                "destination": destination,
                "ledger_entries": in_ledger,
                "queued": in_queue + without_id.get(destination, 0),
                "in_ledger_not_in_queue": missing,
                # With --since only ledger entries are narrowed; queue rows have no time.
                "in_queue_not_in_ledger": unrecorded if since is None else [],
            }
        )
        if missing:
            discrepancies.append(
                f"{destination} in database '{database}': {len(missing)} message(s) recorded as "
                f"delivered but not in the queue: {', '.join(missing[:MAX_IDS_LISTED])}"
            )
        if unrecorded and since is None:
            discrepancies.append(
                f"{destination} in database '{database}': {len(unrecorded)} message(s) in the "
                f"queue without a ledger entry: {', '.join(unrecorded[:MAX_IDS_LISTED])}"
            )
    return results


def _message_id(headers_text: str | None) -> str | None:
    try:
        return parse_headers(headers_text).get(MESSAGE_ID_HEADER)
    except PoisonHeaders:
        return None


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
        lines.append(
            f"{entry['destination']} in '{entry['database']}': {entry['ledger_entries']} in the "
            f"ledger, {entry['queued']} queued; {len(entry['in_ledger_not_in_queue'])} missing "
            f"from the queue, {len(entry['in_queue_not_in_ledger'])} without a ledger entry"
        )
    if result["discrepancies"]:
        lines.append(f"{len(result['discrepancies'])} discrepancies:")
        lines.extend(f"  - {line}" for line in result["discrepancies"])
    else:
        lines.append("everything reconciles: every message is in exactly one place")
    return "\n".join(lines)
