"""`sfbridge check`: connectivity, table shapes and indexes, all reported at once."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

from bridge.addressing import TableAddress
from bridge.commands.check_login import check_logins
from bridge.commands.check_reach import check_route_reach
from bridge.commands.check_tables import (
    Finding,
    check_destination,
    check_exists,
    check_queue,
    check_routed_queues,
    table_columns,
)
from bridge.commands.configuration import load
from bridge.config.model import BridgeConfig, ForwarderConfig, SubscriptionTableConfig
from bridge.connections import Connections, reached_server
from bridge.daemon.budget import most_connections
from bridge.dialects import dialect_for
from bridge.drivers import Connection
from bridge.drivers.odbc import driver_log_switches
from bridge.exceptions import DatabaseError, ExitCode
from bridge.forwarding.fan_out import fan_out
from bridge.forwarding.in_doubt import (
    all_two_phase_destinations,
    max_prepared_transactions,
    old_prepared_transactions,
)
from bridge.forwarding.outgoing import Outgoing
from bridge.forwarding.proxies import forwarder_router, proxy_destination
from bridge.forwarding.subscriptions import SubscriberDirectory
from bridge.messages import Forward, NoSubscribers, Publish
from bridge.storage.dotted_names import dotted_names
from bridge.storage.ledger import ledger_address, ledger_databases
from bridge.storage.tables import forwarder_table_steps, forwarder_tables


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`check` takes no options of its own."""


def run(args: argparse.Namespace) -> int:
    """Print one line per finding; ExitCode.FAILED when any is a problem."""
    config = load(args)
    print(f"ok       configuration {args.config}: valid")
    findings = run_checks(config)
    for finding in findings:
        print(finding)
    problems = sum(1 for finding in findings if not finding.ok)
    print(f"{problems} problem(s) found" if problems else "no problems found")
    return ExitCode.FAILED if problems else ExitCode.OK


def run_checks(config: BridgeConfig) -> list[Finding]:
    """Every finding, good and bad. Never raises for database errors."""
    findings: list[Finding] = []
    connections = Connections(config.databases)
    reachable: set[str] = set()
    try:
        findings.extend(_driver_logging(config))
        findings.extend(check_route_reach(config))
        written = written_databases(config)
        for name in config.databases:
            try:
                connection = connections.get(name)
                connection.begin()
                connection.query("SELECT 1")
                connection.commit()
                reachable.add(name)
                findings.append(_reached(config, name, connection, name in written))
            except DatabaseError as error:
                findings.append(Finding(False, f"database '{name}'", f"{error.detail}"))
        checked: set[tuple[str, TableAddress]] = set()
        for forwarder in config.forwarders:
            if forwarder.database not in reachable:
                continue
            tables = forwarder_tables(config, forwarder)
            dialect = dialect_for(config.databases[forwarder.database].dialect)
            connection = connections.get(forwarder.database)
            label = f"forwarder '{forwarder.name}'"
            # Every table `install` and the daemon create (one list, so check cannot miss one);
            # the tables forwarders of one database share, once.
            for step in forwarder_table_steps(config, forwarder):
                if step.table is None or step.optional:
                    continue  # schemas: asked for with their tables; push triggers: optional
                if (forwarder.database, step.table) in checked:
                    continue
                checked.add((forwarder.database, step.table))
                if step.table == tables.queue:
                    subject, check = f"{label} queue", check_queue
                elif step.table == tables.error_queue:
                    subject, check = f"{label} error queue", check_queue
                else:
                    subject, check = f"{label} {step.description}", check_exists
                findings.extend(check(config, connection, dialect, step.table, subject))
        findings.extend(_check_dotted_names(config, connections, reachable))
        for forwarder in config.forwarders:
            if forwarder.destination is not None:
                findings.extend(_check_proxy(config, forwarder, connections, reachable))
        findings.extend(check_routed_queues(config, connections, reachable))
        for table in config.subscription_tables:
            if table.database in reachable:
                findings.extend(_check_subscription_table(config, connections, table))
        for forwarder in config.forwarders:
            if forwarder.database in reachable:
                findings.extend(_check_event_subscribers(config, forwarder, connections))
        findings.extend(_check_transaction_modes(config, connections, reachable))
        findings.extend(_check_connection_limits(config, connections, reachable))
        findings.extend(check_logins(config, connections, reachable))
        for name in ledger_databases(config):
            if name not in reachable:
                continue
            dialect = dialect_for(config.databases[name].dialect)
            findings.extend(
                check_exists(
                    config,
                    connections.get(name),
                    dialect,
                    ledger_address(config, name),
                    f"database '{name}' dedup ledger",
                    "the messages routed there wait in retry storage",
                )
            )
    finally:
        connections.close()
    missing = sum(1 for finding in findings if finding.missing_table)
    if missing:
        if any(finding.needs_dba for finding in findings):
            advice = (
                "the bridge's login may not create some of them (see the lines above): a DBA "
                "must run the DDL of 'sfbridge install --print-sql', or grant the login the "
                "right named above and then run 'sfbridge install'"
            )
        else:
            advice = (
                "'sfbridge install' creates them all now (a DBA can run the DDL of "
                "'sfbridge install --print-sql' instead)"
            )
        findings.append(Finding(True, "bridge tables", f"{missing} missing: {advice}", True))
    return findings


def _check_dotted_names(
    config: BridgeConfig, connections: Connections, reachable: set[str]
) -> Iterator[Finding]:
    """A problem for each queue whose unquoted dot reads as a missing table while the table of
    the whole name exists: the daemon would forward from an empty queue."""
    for database in sorted({f.database for f in config.forwarders} & reachable):
        try:
            traps = dotted_names(config, database, connections.get(database))
        except DatabaseError as error:
            yield Finding(False, f"database '{database}'", f"queue names: {error.detail}")
            continue
        for trap in traps:
            yield Finding(False, f"forwarder '{trap.forwarder}' {trap.key}", trap.detail)


def written_databases(config: BridgeConfig) -> set[str]:
    """The databases the bridge writes to: forwarding databases (queues, retry storage, its
    own tables) and destinations (routes, proxies, and so the ledgers)."""
    written = {forwarder.database for forwarder in config.forwarders}
    written |= {route.database for route in config.routes}
    written |= {f.destination.database for f in config.forwarders if f.destination}
    return written


def _reached(config: BridgeConfig, name: str, connection: Connection, written: bool) -> Finding:
    """Where the connection to database `name` landed (with several hosts in the connection
    string, the one that answered) and whether it accepts writes: a problem where the bridge
    writes (`written`), since every batch there would fail."""
    subject = f"database '{name}'"
    dialect = dialect_for(config.databases[name].dialect)
    try:
        reached = reached_server(connection, dialect)
    except DatabaseError as error:
        return Finding(True, subject, f"reachable; where is unknown: {error.detail}", True)
    if reached is None:
        return Finding(True, subject, "reachable")
    if reached.accepts_writes:
        return Finding(True, subject, f"reachable at {reached.server}, accepts writes")
    detail = f"reachable at {reached.server}, which does not accept writes: {reached.read_only}"
    if not written:
        return Finding(True, subject, f"{detail} (the bridge only reads there)")
    what = (
        "forwards from and keeps its tables"
        if name in {f.database for f in config.forwarders}
        else "delivers"
    )
    return Finding(
        False,
        subject,
        f"{detail}; the bridge {what} there, so nothing would flow: "
        f"{dialect.read_only_advice or 'connect to the primary'}",
    )


def _check_connection_limits(
    config: BridgeConfig, connections: Connections, reachable: set[str]
) -> Iterator[Finding]:
    """Whether the most connections the daemon may hold (`databases.<name>.max_connections`,
    see `bridge.daemon.budget`) fit what each server allows, beside its other clients now."""
    servers: dict[str, tuple[int, int, list[str]]] = {}
    for name in reachable:
        dialect = dialect_for(config.databases[name].dialect)
        if "connection_limit" not in dialect.statements:
            continue
        connection = connections.get(name)
        try:
            connection.begin_read()
            [(allowed, others, server)] = connection.query(dialect.statements["connection_limit"])
            connection.commit()
        except DatabaseError as error:
            connection.rollback()
            yield Finding(True, f"database '{name}'", f"server limits unknown: {error}", True)
            continue
        servers.setdefault(str(server), (int(allowed), int(others), []))[2].append(name)
    for _server, (allowed, others, names) in sorted(servers.items()):
        most = sum(most_connections(config, name) for name in names)
        subject = "database(s) " + ", ".join(f"'{name}'" for name in sorted(names))
        if most > allowed:
            detail = (
                f"the daemon may hold up to {most} connections to their server, which accepts "
                f"{allowed} (max_connections less its reserved ones): lower "
                "databases.<name>.max_connections, or raise the server's max_connections"
            )
        elif most + others > allowed:
            detail = (
                f"the daemon may hold up to {most} connections to their server, which accepts "
                f"{allowed} and has {others} open by other clients now: it may run out, "
                "for every client (lower databases.<name>.max_connections)"
            )
        else:
            detail = f"up to {most} connection(s) of the {allowed} the server accepts"
            yield Finding(True, subject, detail)
            continue
        yield Finding(True, subject, detail, warning=True)


def _check_transaction_modes(
    config: BridgeConfig, connections: Connections, reachable: set[str]
) -> Iterator[Finding]:
    """Routes without exactly-once; what two-phase needs of its destinations (prepared
    transactions allowed) and what it must never leave there (old prepared transactions)."""
    forwarding = {f.database for f in config.forwarders}
    for index, route in enumerate(config.routes):
        if config.route_transaction(route) == "at-least-once" and forwarding - {route.database}:
            yield Finding(
                True,
                f"routes[{index}] (match {route.match!r})",
                f"runs without exactly-once (transaction: at-least-once): a crash between the "
                f"commits in database '{route.database}' and in the forwarding database can "
                "deliver a message twice (counted as suspected_duplicates)",
                warning=True,
            )
    for forwarder in config.forwarders:
        fixed = forwarder.destination
        if (
            fixed
            and fixed.database != forwarder.database
            and config.proxy_transaction(fixed) == "at-least-once"
        ):
            yield Finding(
                True,
                f"forwarder '{forwarder.name}' destination",
                "runs without exactly-once (transaction: at-least-once)",
                warning=True,
            )
    for name in all_two_phase_destinations(config):
        if name not in reachable:
            continue
        dialect = dialect_for(config.databases[name].dialect)
        try:
            allowed = max_prepared_transactions(connections.get(name), dialect)
        except DatabaseError as error:
            yield Finding(False, f"database '{name}'", f"cannot read a setting: {error.detail}")
            continue
        if allowed > 0:
            yield Finding(
                True, f"database '{name}'", f"allows {allowed} prepared transactions (two-phase)"
            )
        else:
            yield Finding(
                False,
                f"database '{name}'",
                "max_prepared_transactions is 0, so two-phase routes into it cannot prepare "
                "(their messages wait): set it above 0, e.g. max_prepared_transactions = 100 "
                "in postgresql.conf or ALTER SYSTEM SET max_prepared_transactions = 100, then "
                "restart PostgreSQL. The forwarding database needs none: it keeps the decisions",
            )
    old, _ = old_prepared_transactions(config, connections)
    by_database: dict[str, list[dict[str, object]]] = {}
    for entry in old:
        by_database.setdefault(str(entry["database"]), []).append(entry)
    for name, entries in sorted(by_database.items()):
        oldest = max(float(str(e["age_seconds"])) for e in entries)
        yield Finding(
            False,
            f"database '{name}'",
            f"{len(entries)} prepared transaction(s) of the bridge older than a minute (oldest "
            f"{oldest:.0f} s: {entries[0]['gid']}); they hold locks and hold back VACUUM. A "
            "running 'sfbridge run' settles them within a retry delay from the decisions in "
            'the forwarding database; if one stays, see "Transaction modes" in docs/concepts.md',
        )


def _driver_logging(config: BridgeConfig) -> Iterator[Finding]:
    """ODBC drivers whose registry entry turns their own log files on (each once)."""
    seen: set[tuple[str, str]] = set()
    for database in config.databases.values():
        if database.connection is None or not dialect_for(database.dialect).opens_with_odbc(
            database
        ):
            continue  # psycopg (or a file) never loads the ODBC driver named in the string
        found = driver_log_switches(database.connection)
        if found is None or found[:2] in seen:
            continue
        path, section, switches = found
        seen.add((path, section))
        settings = ", ".join(f"{name}=1" for name in switches)
        yield Finding(
            True,
            f"ODBC driver '{section}'",
            f"{path} sets {settings}: every process that connects (the daemon, each "
            "sfbridge command) leaves a psqlodbc_*.log file in /tmp. The bridge turns the "
            "logging off per connection, but the driver creates the file before it reads the "
            f"connection string: set {' and '.join(f'{n}=0' for n in switches)} in "
            f"[{section}] there",
            warning=True,
        )


def _check_proxy(
    config: BridgeConfig,
    forwarder: ForwarderConfig,
    connections: Connections,
    reachable: set[str],
) -> Iterator[Finding]:
    """A proxy's destination queue exists with the queue shape; its own queue does not shadow
    an endpoint that lives in the proxy's database."""
    destination = proxy_destination(config, forwarder)
    assert destination is not None
    label = f"forwarder '{forwarder.name}'"
    if forwarder.database in reachable:
        yield from _check_shadowing(config, forwarder, connections.get(forwarder.database))
    if destination.database not in reachable:
        return
    subject = f"{label} destination in database '{destination.database}'"
    yield from check_destination(config, connections, destination, subject, "the proxy's")


def _check_shadowing(
    config: BridgeConfig, forwarder: ForwarderConfig, connection: Connection
) -> Iterator[Finding]:
    """Signs that the endpoint the proxy is named after also receives in this database: its
    `<queue>.Delayed` table (the transport's native delayed delivery), or a subscription it
    made from this queue. The proxy would then take that endpoint's messages."""
    database = config.databases[forwarder.database]
    dialect = dialect_for(database.dialect)
    queue = forwarder_tables(config, forwarder).queue
    rendered = dialect.grammar.render(queue)
    signs: list[str] = []
    delayed = TableAddress(f"{queue.table}.Delayed", queue.schema, queue.catalog)
    if table_columns(connection, dialect, delayed):
        signs.append(f"its delayed-delivery table {dialect.grammar.render(delayed)} exists")
    for table in _subscription_tables_in(config, forwarder.database):
        try:
            rows = connection.query(
                dialect.sql("subscribers_by_endpoint", subscriptions=table),
                (queue.table, rendered),
            )
            connection.commit()
        except DatabaseError:
            connection.rollback()  # no such table here: nothing to learn from it
            continue
        if rows and rows[0][0]:
            where = dialect.grammar.render(table)
            signs.append(f"it subscribes to events from this queue ({where})")
    if signs:
        yield Finding(
            True,
            f"forwarder '{forwarder.name}' queue",
            f"{rendered} looks like the queue of a real endpoint in database "
            f"'{forwarder.database}' ({'; '.join(signs)}): the proxy would take that "
            "endpoint's messages. Give the proxy its own database, or route by headers",
            warning=True,
        )


def _subscription_tables_in(config: BridgeConfig, database_name: str) -> list[TableAddress]:
    """The subscription tables to look in: the configured ones in that database, and the
    transport's default `SubscriptionRouting` in its default schema."""
    database = config.databases[database_name]
    grammar = dialect_for(database.dialect).grammar
    names = [t.table for t in config.subscription_tables if t.database == database_name]
    tables: list[TableAddress] = []
    for name in [*names, "SubscriptionRouting"]:
        address = grammar.resolve(grammar.parse(name), database.schema, None)
        if address not in tables:
            tables.append(address)
    return tables


def _check_subscription_table(
    config: BridgeConfig, connections: Connections, table: SubscriptionTableConfig
) -> Iterator[Finding]:
    database = config.databases[table.database]
    dialect = dialect_for(database.dialect)
    address = dialect.grammar.resolve(dialect.grammar.parse(table.table), database.schema, None)
    subject = f"subscription table in database '{table.database}'"
    rendered = dialect.grammar.render(address)
    columns = table_columns(connections.get(table.database), dialect, address)
    missing = sorted({"queueaddress", "endpoint", "topic"} - set(columns))
    if not columns:
        yield Finding(
            False,
            subject,
            f"{rendered} does not exist, so published events wait in retry storage (their "
            "subscribers cannot be known): the subscribing endpoints create it when they run "
            "with installers enabled, or fix this entry of subscription_tables (the table, "
            "default SubscriptionRouting, is looked for in the database's default schema)",
        )
    elif missing:
        yield Finding(False, subject, f"{rendered} lacks column(s) {', '.join(missing)}")
    else:
        yield Finding(True, subject, f"{rendered} is readable")


def _check_event_subscribers(
    config: BridgeConfig, forwarder: ForwarderConfig, connections: Connections
) -> Iterator[Finding]:
    """Per event type (configured or seen): the subscribers found now, where they came from."""
    database = config.databases[forwarder.database]
    dialect = dialect_for(database.dialect)
    tables = forwarder_tables(config, forwarder)
    topic_sets: dict[str, tuple[str, ...]] = {topic: (topic,) for topic in config.subscriptions}
    connection = connections.get(forwarder.database)
    try:
        seen = connection.query(
            dialect.sql("event_types_read", event_types=tables.event_types), (forwarder.name,)
        )
        connection.commit()
    except DatabaseError:
        connection.rollback()  # not installed yet: reported with the other bridge tables
        seen = []
    for event_type, _, details in seen:
        topic_sets[str(event_type)] = tuple(json.loads(details).get("topics") or (event_type,))
    router = forwarder_router(config, forwarder)
    outgoing = Outgoing.from_config(config, forwarder.database)
    directory = SubscriberDirectory(config, forwarder.database)
    for event_type, topics in sorted(topic_sets.items()):
        subject = f"forwarder '{forwarder.name}' event {event_type}"
        try:
            lookup = directory.lookup(topics)
        except DatabaseError as error:
            yield Finding(False, subject, f"cannot read subscribers: {error}")
            continue
        outcome = fan_out(
            Publish({}, event_type, topics),
            lookup.subscribers,
            router,
            outgoing,
            fallback_message_id="",
        )
        if isinstance(outcome, NoSubscribers):
            yield Finding(
                True, subject, f"no subscribers (policy: {config.publish.no_subscribers})"
            )
            continue
        for copy in outcome.copies:
            sources = ", ".join(s.source for s in copy.subscribers)
            if isinstance(copy.decision, Forward):
                destination = copy.decision.destination
                yield Finding(
                    True,
                    subject,
                    f"{copy.subscriber.address} ({sources}) -> {destination.canonical} in "
                    f"database '{destination.database}'",
                )
            else:
                yield Finding(False, subject, f"{copy.decision.reason} ({sources})")
