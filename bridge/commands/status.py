"""`sfbridge status`: first, which daemons run (`bridge.commands.status_daemons`); per
forwarder, whether a running daemon serves it, what is queued, waiting for retry, in error, and
counters; per destination database, whether the daemon sees it up, since when, and what waits
for it. States written by a daemon that no longer runs are shown as such: they describe the
past."""

from __future__ import annotations

import argparse
import json
from typing import Any

from bridge.commands.audit import print_recent_commands, recent_commands, render_audit
from bridge.commands.configuration import load
from bridge.commands.status_daemons import (
    daemon_entries,
    exit_code,
    human,
    iso,
    read_all_daemons,
    render_daemons,
    render_served,
    served_by,
)
from bridge.config.durations import format_duration
from bridge.config.fingerprint import config_fingerprint
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.daemon.push import pickup
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import Connection
from bridge.exceptions import AuthenticationFailed, DatabaseError, TableNotFound
from bridge.forwarding.catch_up import HELD_MESSAGES, HELD_MILLISECONDS
from bridge.forwarding.in_doubt import old_prepared_transactions
from bridge.forwarding.proxies import proxy_destination
from bridge.messages import utcnow
from bridge.secrets import inert
from bridge.storage.daemons import ServedForwarder
from bridge.storage.destination_states import read_forwarder_states, read_states
from bridge.storage.error_counts import read_error_counts
from bridge.storage.queue_depths import read_pause_state, read_queue_depths
from bridge.storage.tables import ForwarderTables, forwarder_tables

# States older than this whose writer is not in the daemons table (an sfbridge from before it)
# were written by a daemon that is probably not running.
STALE_STATE_SECONDS = 120.0


# Operator commands (the audit log) in `status`; `status --audit` shows more.
RECENT_COMMANDS = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--audit",
        action="store_true",
        help="only the audit log: the last 50 operator commands (who, when, what, how many)",
    )


def run(args: argparse.Namespace) -> int:
    """Print the status; exit with `status_daemons.exit_code`: 3 when a forwarding database
    cannot be read, 1 when a forwarder has no running daemon or a login is refused, else 0."""
    config = load(args)
    if args.audit:
        return print_recent_commands(config, as_json=args.json)
    status = collect_status(config)
    print(render_json(status) if args.json else render_text(status))
    return exit_code(status)


def collect_status(config: BridgeConfig, audit_entries: int = RECENT_COMMANDS) -> dict[str, Any]:
    """`forwarders`: one dict per forwarder (a database that cannot be read gives an `error`
    entry instead); `destinations`: one dict per destination database the daemon has seen or
    that messages wait for."""
    connections = Connections(config.databases)
    try:
        now = utcnow()
        fingerprint = config_fingerprint(config)
        read = read_all_daemons(config, connections)
        daemons, stale = daemon_entries(read, now, fingerprint)
        running = {entry["daemon"] for entry in daemons if entry["state"] == "running"}
        states = {entry["daemon"]: entry["state"] for entry in daemons}
        error_queues = _error_queues(config, connections)
        owned: dict[str, int] = {}
        for entry in error_queues:
            for name, messages in entry.get("forwarders", {}).items():
                owned[name] = owned.get(name, 0) + messages
        forwarders = []
        for forwarder in config.forwarders:
            status = _forwarder_status(config, forwarder.name, connections, owned, states)
            serving = served_by(
                read, forwarder.database, ServedForwarder(forwarder.name, status["queue"]), now
            )
            status["served_by"] = serving
            status["served"] = None if serving is None else bool(serving)
            forwarders.append(status)
        old, _ = old_prepared_transactions(config, connections)
        destinations = _destinations(config, connections, states)
        return {
            "config_fingerprint": fingerprint,
            "daemons": daemons,
            "daemons_running": len(running),
            "daemons_unreadable": [
                {"database": database, "error": error}
                for database, error in read.unreadable.items()
            ],
            "stale_daemons": stale,
            "forwarders": forwarders,
            "error_queues": error_queues,
            "destinations": destinations,
            "auth_failed": _auth_failed(forwarders, destinations),
            "prepared_transactions": old,
            "audit": recent_commands(config, connections, audit_entries),
        }
    finally:
        connections.close()


def _auth_failed(forwarders: list[dict[str, Any]], destinations: list[dict[str, Any]]) -> list[str]:
    """The databases whose login is refused now: a forwarding database `status` itself could
    not log in to, or a destination a running daemon says so of."""
    refused = {f["database"] for f in forwarders if f.get("error_state") == "auth-failed"}
    refused |= {
        d["database"] for d in destinations if d["state"] == "auth-failed" and not d["stale"]
    }
    return sorted(refused)


def _destinations(
    config: BridgeConfig, connections: Connections, daemons: dict[str, str]
) -> list[dict[str, Any]]:
    """Merge what every forwarding database holds: the newest state row per destination, and
    the number of messages waiting for it in each retry storage. `daemons`: each known
    daemon's liveness, to tell a state of the past from a current one."""
    states: dict[str, dict[str, Any]] = {}
    waiting: dict[str, int] = {}
    next_attempt: dict[str, Any] = {}
    done: set[str] = set()
    for forwarder in config.forwarders:
        if forwarder.database in done:
            continue
        done.add(forwarder.database)
        dialect = dialect_for(config.databases[forwarder.database].dialect)
        tables = forwarder_tables(config, forwarder)
        try:
            connection = connections.get(forwarder.database)
            connection.begin()
            try:
                rows = read_states(connection, dialect, tables.destination_states)
            except TableNotFound:
                connection.rollback()
                connection.begin()
                rows = []
            for read in rows:
                known = states.get(read["database"])
                if known is None or read["updated_at"] > known["updated_at"]:
                    states[read["database"]] = read
            for name, count, due in connection.query(
                dialect.sql("retry_waiting", retry=tables.retry)
            ):
                waiting[name] = waiting.get(name, 0) + int(count)
                due_at = dialect.decode_timestamp(due)
                if due_at and (name not in next_attempt or due_at < next_attempt[name]):
                    next_attempt[name] = due_at
            connection.commit()
        except DatabaseError:
            connections.discard(forwarder.database)
    now = utcnow()
    result = []
    for name in sorted(set(states) | set(waiting)):
        state = states.get(name)
        entry: dict[str, Any] = {"database": name, "waiting": waiting.get(name, 0)}
        if state is None:
            entry["state"] = "unknown"
        else:
            row = state
            age = (now - row["updated_at"]).total_seconds()
            reporter = _reporter(daemons, row["reported_by"])
            entry.update(
                state=row["state"],
                since=iso(row["since"]),
                last_error=row["last_error"],
                next_probe_at=iso(row["next_probe_at"]),
                seen_seconds_ago=round(max(age, 0.0), 1),
                stale=_stale(reporter, age),
                reported_by=row["reported_by"],
                reporter_state=reporter,
            )
        if name in next_attempt:
            entry["next_attempt_at"] = iso(next_attempt[name])
        result.append(entry)
    return result


def _reporter(daemons: dict[str, str], reported_by: str) -> str | None:
    """The liveness of the daemon that wrote a state row: `running`, `stopped`, `missing`, or
    `gone` when the daemons table has rows but none of it (a daemon starting on its host
    forgets the host's earlier daemons that stopped or went missing: it replaced them). None
    when no daemon has recorded itself (an sfbridge from before the daemons table)."""
    if reported_by in daemons:
        return daemons[reported_by]
    return "gone" if daemons else None


def _stale(reporter: str | None, age: float) -> bool:
    """Whether a state row no longer describes now: its daemon is known and not running, or
    (no daemon recorded at all) it was not refreshed for long."""
    if reporter is not None:
        return reporter != "running"
    return age > STALE_STATE_SECONDS


def _error_queues(config: BridgeConfig, connections: Connections) -> list[dict[str, Any]]:
    """Every error queue the forwarders write to, counted with one grouped read each: its
    messages per forwarder that failed them, and `other` (the endpoints' own failures, rows
    without NServiceBus.FailedQ, poison)."""
    result: list[dict[str, Any]] = []
    for database in dict.fromkeys(f.database for f in config.forwarders):
        try:
            counts = read_error_counts(config, database, connections.get(database))
        except DatabaseError as error:
            connections.discard(database)
            result.append({"database": database, "error": str(error)})
            continue
        for count in counts:
            result.append(
                {
                    "database": database,
                    "error_queue": count.error_queue,
                    "exists": count.exists,
                    "messages": count.total,
                    "forwarders": dict(sorted(count.by_forwarder.items())),
                    "other": count.other,
                }
            )
    return result


def _forwarder_status(
    config: BridgeConfig,
    name: str,
    connections: Connections,
    in_error: dict[str, int],
    daemons: dict[str, str],
) -> dict[str, Any]:
    forwarder = config.forwarder(name)
    database = config.databases[forwarder.database]
    dialect = dialect_for(database.dialect)
    tables = forwarder_tables(config, forwarder)
    status: dict[str, Any] = {
        "forwarder": forwarder.name,
        "database": forwarder.database,
        "queue": tables.queue_canonical,
        "error_queue": dialect.grammar.render(tables.error_queue),
        "pickup": pickup(config, forwarder.database),
    }
    proxy = proxy_destination(config, forwarder)
    if proxy is not None:
        status["proxy_for"] = {"database": proxy.database, "queue": proxy.canonical}
    try:
        connection = connections.get(forwarder.database)
        # First, and apart: it is what tells why the rest may not be readable (a locked queue).
        status["failing"] = _failing(connection, dialect, tables, forwarder.name, daemons)
    except DatabaseError:
        connections.discard(forwarder.database)
        status["failing"] = []
    try:
        connection = connections.get(forwarder.database)
        depths = read_queue_depths(config, forwarder, connection)
        status["queued"] = depths.queued
        # What this forwarder failed, by NServiceBus.FailedQ, not the whole shared table.
        status["in_error"] = in_error.get(forwarder.name, 0)
        status["oldest_age_seconds"] = depths.oldest_age_seconds
        status["waiting_for_retry"] = depths.waiting_for_retry
        status["retries"] = [
            {
                "destination": row[0],
                "messages": int(row[1]),
                "failing_since": iso(dialect.decode_timestamp(row[2])),
                "next_attempt_at": iso(dialect.decode_timestamp(row[3])),
                "max_attempts_made": int(row[4]),
                "last_error": row[5],
            }
            for row in depths.retry_summary
        ]
        connection.begin()
        counters = connection.query(
            dialect.sql("counters_read", counters=tables.counters), (forwarder.name,)
        )
        status["counters"] = {row[0]: int(row[1]) for row in counters}
        status["event_types"] = [
            {
                "event_type": row[0],
                "last_seen": iso(dialect.decode_timestamp(row[1])),
                **json.loads(row[2]),
            }
            for row in connection.query(
                dialect.sql("event_types_read", event_types=tables.event_types),
                (forwarder.name,),
            )
        ]
        connection.commit()
        status["paused"] = [
            {
                "destination_database": pause.database,
                "since": iso(pause.paused_at),
                "reason": pause.reason,
            }
            for pause in read_pause_state(config, forwarder, connection).pauses
        ]
    except DatabaseError as error:
        connections.discard(forwarder.database)
        status["error"] = str(error)
        # A table of the bridge's missing is a state of the database, as for a destination.
        status["error_state"] = (
            "not-ready"
            if isinstance(error, TableNotFound)
            else "auth-failed"
            if isinstance(error, AuthenticationFailed)
            else "unavailable"
        )
    return status


def _failing(
    connection: Connection,
    dialect: Dialect,
    tables: ForwarderTables,
    forwarder: str,
    daemons: dict[str, str],
) -> list[dict[str, Any]]:
    """What daemons running now say about the forwarder's batches failing (the forwarder
    states table; rows of daemons that are not running are left out)."""
    connection.begin()
    try:
        rows = read_forwarder_states(connection, dialect, tables.forwarder_states)
    except TableNotFound:  # made by an sfbridge before forwarder states
        rows = []
    finally:
        connection.rollback()
    now = utcnow()
    failing = []
    for row in rows:
        age = (now - row["updated_at"]).total_seconds()
        stale = _stale(_reporter(daemons, row["reported_by"]), age)
        if row["forwarder"] != forwarder or row["state"] != "failing" or stale:
            continue
        failing.append(
            {
                "reported_by": row["reported_by"],
                "since": iso(row["since"]),
                "failed_batches": row["failures"],
                "last_error": row["last_error"],
                "seen_seconds_ago": round(max(age, 0.0), 1),
            }
        )
    return failing


def render_json(status: dict[str, Any]) -> str:
    return json.dumps(status, indent=2)


def render_text(status: dict[str, Any]) -> str:
    """Whether a daemon runs, a short table per forwarder, then one line or two per
    destination, for people. Each line's control characters are escaped
    (`bridge.secrets.inert`): destinations, errors and event types come from messages and
    databases."""
    lines = render_daemons(status)
    lines.extend(_render_forwarders(status["forwarders"]))
    lines.extend(_render_error_queues(status.get("error_queues", [])))
    if status["destinations"]:
        lines.append("destination databases (as the daemon last saw them):")
    for destination in status["destinations"]:
        lines.extend(_render_destination(destination))
    audit = status.get("audit", [])
    if audit:
        lines.append("recent operator commands (audit log; 'sfbridge status --audit' for more):")
    lines.extend(render_audit(audit))
    for entry in status.get("prepared_transactions", []):
        lines.append(
            f"PREPARED TRANSACTION left in database '{entry['database']}' for "
            f"{human(float(entry['age_seconds']))}: {entry['gid']} (a running daemon settles "
            "it; see 'sfbridge check')"
        )
    return "\n".join(inert(line) for line in lines)


def _render_error_queues(entries: list[dict[str, Any]]) -> list[str]:
    lines = ["error queues (by the queue each message failed in, NServiceBus.FailedQ):"]
    for entry in entries:
        if "error" in entry:
            lines.append(f"  database '{entry['database']}': UNAVAILABLE: {entry['error']}")
            continue
        where = f"{entry['error_queue']} in database '{entry['database']}'"
        if not entry["exists"]:
            lines.append(f"  {where}: does not exist yet (nothing has failed there)")
            continue
        parts = [f"{name} {count}" for name, count in entry["forwarders"].items()]
        if entry["other"]:
            parts.append(
                f"other {entry['other']} (failed in no forwarder's queue: the endpoints' own "
                "failures, poison)"
            )
        lines.append(
            f"  {where}: {entry['messages']} message(s)"
            + (f": {', '.join(parts)}" if parts else "")
        )
    return lines if len(lines) > 1 else []


def _render_destination(entry: dict[str, Any]) -> list[str]:
    name, state = entry["database"], entry["state"]
    waiting = f"{entry['waiting']} waiting"
    if state == "unknown":
        return [f"  {name:<12} {waiting}; no daemon has reported on it"]
    since = entry["since"]
    seen = f"seen {human(entry['seen_seconds_ago'])} ago by {entry['reported_by']}"
    if entry.get("reporter_state") in ("stopped", "missing"):
        seen += f", which is {entry['reporter_state']}: not current"
    elif entry.get("reporter_state") == "gone":
        seen += ", which no longer runs: not current"
    elif entry["stale"]:
        seen += " - stale: is the daemon running?"
    if state == "up":
        was = "was up" if entry["stale"] else "up"
        return [f"  {name:<12} {was} since {since}; {waiting} ({seen})"]
    label = {"unreachable": "DOWN", "read-only": "READ-ONLY", "auth-failed": "AUTH FAILED"}.get(
        state, "NOT READY"
    )
    probe = "next login attempt" if state == "auth-failed" else "next probe"
    lines = [
        f"  {name:<12} {label} since {since}; {waiting}; {probe} {entry['next_probe_at']} ({seen})",
        f"               last error: {entry['last_error']}",
    ]
    if state == "auth-failed":
        lines.append("               fix the login, then reload the daemon to try at once")
    return lines


def _render_forwarders(statuses: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for status in statuses:
        lines.append(
            f"forwarder {status['forwarder']}  ({status['queue']} in database "
            f"'{status['database']}')"
        )
        lines.extend(render_served(status))
        if "proxy_for" in status:
            proxy = status["proxy_for"]
            lines.append(f"  proxy for          {proxy['queue']} in database '{proxy['database']}'")
        pickup = status["pickup"]
        if not pickup["push"]:
            lines.append(
                f"  pickup             polled every {format_duration(pickup['poll_seconds'])}: "
                f"push off ({pickup['why']})"
            )
        for failing in status["failing"]:
            lines.append(
                f"  FAILING            since {failing['since']}: {failing['failed_batches']} "
                f"batch(es) failed (seen {human(failing['seen_seconds_ago'])} ago by "
                f"{failing['reported_by']}); it forwards nothing until they succeed"
            )
            lines.append(f"                     last error: {failing['last_error']}")
        if "error" in status:
            if status.get("error_state") == "not-ready":
                lines.append(
                    f"  NOT READY: {status['error']} ('sfbridge check' says what is missing and "
                    "who may create it)"
                )
            elif status.get("error_state") == "auth-failed":
                lines.append(
                    f"  AUTH FAILED: {status['error']} (fix the login, then reload the daemon: "
                    "systemctl reload sfbridge)"
                )
            else:
                lines.append(f"  UNAVAILABLE: {status['error']}")
            continue
        for pause in status["paused"]:
            what = (
                f"deliveries to database '{pause['destination_database']}'"
                if pause["destination_database"]
                else "the whole forwarder: claims nothing"
            )
            because = f" ({pause['reason']})" if pause["reason"] else ""
            lines.append(f"  PAUSED             {what}, since {pause['since']}{because}")
        age = status["oldest_age_seconds"]
        lines.append(
            f"  queued             {status['queued']}"
            + (f"  (oldest sent {human(age)} ago)" if age is not None else "")
        )
        lines.append(f"  waiting for retry  {status['waiting_for_retry']}")
        lines.append(
            f"  in error queue     {status['in_error']}  (failed by this forwarder, in "
            f"{status['error_queue']})"
        )
        for retry in status["retries"]:
            lines.append(
                f"    -> {retry['destination']}: {retry['messages']} message(s), failing since "
                f"{retry['failing_since']}, next attempt {retry['next_attempt_at']}, "
                f"attempts so far up to {retry['max_attempts_made']}"
            )
            lines.append(f"       last error: {retry['last_error']}")
        if status["counters"]:
            counted = ", ".join(f"{k} {v}" for k, v in sorted(status["counters"].items()))
            lines.append(f"  since install      {counted}")
        held = status["counters"].get(HELD_MESSAGES, 0) if status["counters"] else 0
        if held:
            seconds = status["counters"].get(HELD_MILLISECONDS, 0) / 1000
            lines.append(
                f"  catch-up limits    held back {held} message(s), {human(seconds)} of "
                "waiting in all (max_messages_per_second, max_batches_in_flight; rising "
                "in sfbridge_catch_up_held_seconds while they hold)"
            )
        for event in status.get("event_types", []):
            lines.append(f"  event {event['event_type']} (subscribers as of {event['last_seen']}):")
            for subscriber in event["subscribers"] or [{"address": None}]:
                if subscriber["address"] is None:
                    lines.append("    no subscribers")
                    continue
                lines.append(
                    f"    {subscriber['address']} from {subscriber['source']} -> "
                    f"{subscriber['destination']}"
                )
    return lines
