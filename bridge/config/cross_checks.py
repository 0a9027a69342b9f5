"""The checks that span several keys, run on what the walk kept of a document.

References between sections (every `database` names a configured one), SQL Server catalogs
(`bridge.config.catalog_checks`), forwarders (unique
names, one forwarder per queue, an error queue apart from the queue), routes (unreachable ones,
schemas on sqlite), subscriber addresses (parsed in every forwarding dialect, routable, not
repeated), subscription tables and the retry durations. Queue addresses are parsed with the
grammars of `bridge.addressing`, the same ones the forwarders use.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping

from bridge.addressing import TableAddress
from bridge.config.catalog_checks import (
    check_catalogs,
    database_config,
    database_configs,
    where_routes_decide,
)
from bridge.config.connection_checks import check_connection_strings
from bridge.config.durations import format_duration
from bridge.config.messages import join_path, suggestion
from bridge.config.model import FixedDestination, RouteConfig
from bridge.config.problems import ProblemLog
from bridge.config.proxy_addresses import fixed_destination_address
from bridge.config.schema import DELIVERY, LEDGER, RETRIES, ROUTES, SUBSCRIPTIONS
from bridge.config.servicecontrol import check_servicecontrol
from bridge.config.walker import Document, Entry, Item
from bridge.dialects.registry import dialects, grammar_for
from bridge.exceptions import AddressError

__all__ = [
    "check_across_keys",
    "check_catalogs",
    "check_connection_strings",
    "check_forwarders",
    "check_poolers",
    "check_proxies",
    "check_references",
    "check_retries",
    "check_routes",
    "check_subscription_tables",
    "check_subscriptions",
    "check_transactions",
]


def check_across_keys(document: Document, log: ProblemLog) -> None:
    """Run every cross-key check, in this order, reporting to `log`.

    Two checks also settle values: a sqlite forwarder's `concurrency` becomes 1, and a
    subscriber given twice for one topic is kept once.
    """
    check_references(document, log)
    check_connection_strings(document, log)
    check_poolers(document, log)
    check_catalogs(document, log)
    check_forwarders(document, log)
    check_proxies(document, log)
    check_routes(document, log)
    check_transactions(document, log)
    check_subscriptions(document, log)
    check_subscription_tables(document, log)
    check_retries(document, log)
    check_servicecontrol(document, log)


def _seen_before(first: dict[object, str], value: object, path: str) -> str | None:
    """Where `value` was met first, or None when this is the first time: `path` is then
    recorded as that place (`first` maps each value met so far to where it was met)."""
    if value in first:
        return first[value]
    first[value] = path
    return None


def check_references(document: Document, log: ProblemLog) -> None:
    """Every `database` of a forwarder, proxy destination, route or subscription table names
    a database."""
    for entries in (document.forwarders, document.routes, document.subscription_tables):
        for entry in entries:
            if entry is None:
                continue
            if "database" in entry.values:
                _check_reference(document, log, entry.values["database"], entry.path)
            fixed = entry.values.get("destination")
            if isinstance(fixed, FixedDestination):
                path = join_path(entry.path, "destination")
                _check_reference(document, log, fixed.database, path)


def check_poolers(document: Document, log: ProblemLog) -> None:
    """Behind a transaction pooler only psycopg will do: psqlODBC keeps prepared statements
    and session settings that the pooler's next transaction, on another server connection,
    would not find."""
    for name, entry in document.databases.items():
        if entry.values.get("pooler") != "transaction" or entry.values.get("driver") != "odbc":
            continue
        log.error(
            join_path(entry.path, "driver"),
            f"database {name!r} is behind a transaction pooler (pooler: transaction), where "
            "psqlODBC's prepared statements and session settings are lost between "
            "transactions: use 'driver: psycopg' (the default), or have the pooler lend "
            "connections per session ('pool_mode = session', then 'pooler: session')",
        )


def _check_reference(document: Document, log: ProblemLog, name: str, path: str) -> None:
    if name in document.database_names:
        return
    known = sorted(document.database_names)
    hint = suggestion(name, known)
    if not hint:
        hint = f" (databases: {', '.join(known)})" if known else " (none is defined)"
    log.error(join_path(path, "database"), f"no database named {name!r}{hint}")


def check_proxies(document: Document, log: ProblemLog) -> None:
    """A proxy's destination is a queue its database can hold, is not the proxy itself, and
    no forwarder drains a queue that a proxy delivers to (an endpoint's real queue); routes
    are required unless every forwarder is a proxy."""
    delivered_to: dict[tuple[str, object], str] = {}
    drained: list[tuple[Entry, tuple[str, object]]] = []
    for entry in document.forwarders:
        if entry is None:
            continue
        source = database_config(document, entry.values.get("database"))
        queue = entry.values.get("queue")
        if source is None or queue is None:
            continue
        try:
            grammar = grammar_for(source.dialect)
            own = grammar.resolve(grammar.parse(queue), source.schema, None)
        except AddressError:
            continue  # reported with the forwarder's other checks
        drained.append((entry, (source.name, own)))
        fixed = entry.values.get("destination")
        target = (
            database_config(document, fixed.database)
            if isinstance(fixed, FixedDestination)
            else None
        )
        if not isinstance(fixed, FixedDestination) or target is None:
            continue
        path = join_path(entry.path, "destination")
        try:
            destination = fixed_destination_address(queue, source, fixed, target)
        except AddressError as exc:
            where = "queue" if fixed.queue is not None else "database"
            given = (
                "" if fixed.queue is not None else f" (the default: the proxy's queue {queue!r})"
            )
            log.error(
                join_path(path, where),
                f"cannot be a {target.dialect} queue in database {target.name!r}{given}: {exc}",
            )
            continue
        if target.name == source.name and destination == own:
            log.error(
                path,
                f"is the proxy's own queue {grammar_for(target.dialect).render(own)}: every "
                "message would be forwarded to where it came from; name the endpoint's queue "
                "in another database",
            )
            continue
        delivered_to.setdefault((target.name, destination), entry.path)
    for entry, queue_key in drained:
        earlier = delivered_to.get(queue_key)
        if earlier is not None and earlier != entry.path:
            log.error(
                join_path(entry.path, "queue"),
                f"is the queue {earlier} delivers to, an endpoint's real queue; a forwarder "
                "draining it would take that endpoint's messages",
            )
    _check_routes_given(document, log)


def _check_routes_given(document: Document, log: ProblemLog) -> None:
    if any(entry is not None for entry in document.routes):
        return
    if not any(entry is not None for entry in document.forwarders) and not document.routes:
        log.error(
            ROUTES.name,
            "required key is missing; expected a list of routes (only a config whose "
            "forwarders all have a 'destination' needs none)",
        )
        return
    routed = [
        entry.path
        for entry in document.forwarders
        if entry is not None and entry.values.get("destination") is None
    ]
    if routed:
        log.error(
            ROUTES.name,
            f"at least 1 route is required: {', '.join(routed)} "
            f"{'has' if len(routed) == 1 else 'have'} no 'destination', so "
            f"{'its' if len(routed) == 1 else 'their'} messages go where routes send them",
        )


def check_forwarders(document: Document, log: ProblemLog) -> None:
    """Forwarder names are unique, each queue is drained by one forwarder, the error queue is
    not the queue; a sqlite forwarder runs one worker."""
    first_by_name: dict[object, str] = {}
    first_by_queue: dict[object, str] = {}
    for entry in document.forwarders:
        if entry is None:
            continue
        name = entry.values.get("name")
        if name is not None:
            earlier = _seen_before(first_by_name, name, entry.path)
            if earlier is not None:
                log.error(
                    join_path(entry.path, "name"),
                    f"duplicate forwarder name {name!r} (already used by {earlier})",
                )
        queue, error_queue = _resolve_queues(document, log, entry)
        if queue is not None and queue == error_queue:
            log.error(
                join_path(entry.path, "error_queue"),
                "is the same queue as 'queue'; failed messages would be forwarded again",
            )
        database = entry.values.get("database")
        if queue is not None and database is not None:
            earlier = _seen_before(first_by_queue, (database, queue), entry.path)
            if earlier is not None:
                log.error(
                    join_path(entry.path, "queue"),
                    f"{earlier} already drains this queue in database {database!r}",
                )
        _check_single_writer(document, log, entry)


def _resolve_queues(document: Document, log: ProblemLog, entry: Entry) -> tuple[object, object]:
    """Parse `queue` and `error_queue` in the grammar of the forwarder's database.

    Returns comparable forms of both (resolved addresses, or the raw text when the
    database or its grammar is unknown), None for a missing or unparsable one.
    """
    dialect = document.dialect_of(entry)
    database = document.databases.get(entry.values.get("database", ""))
    default_schema = None if database is None else database.values.get("schema")
    results: list[object] = []
    for key in ("queue", "error_queue"):
        text = entry.values.get(key)
        if text is None or dialect is None:
            results.append(text)
            continue
        try:
            grammar = grammar_for(dialect)
            results.append(grammar.resolve(grammar.parse(text), default_schema, None))
        except AddressError as exc:
            log.error(join_path(entry.path, key), f"invalid {dialect} queue address: {exc}")
            results.append(None)
    return results[0], results[1]


def _check_single_writer(document: Document, log: ProblemLog, entry: Entry) -> None:
    dialect = dialects().get(document.dialect_of(entry) or "")
    if dialect is None or not dialect.single_writer:
        return
    concurrency = entry.values.get("concurrency")
    if "concurrency" in entry.given and isinstance(concurrency, int) and concurrency > 1:
        log.warning(
            join_path(entry.path, "concurrency"),
            f"{dialect.title} serialises writers, so the bridge runs one worker for a "
            f"{dialect.name} database; concurrency {concurrency} is ignored",
        )
    # Make the config say what actually runs, including when the default (2) was used.
    entry.values["concurrency"] = 1


def check_routes(document: Document, log: ProblemLog) -> None:
    """A route hidden behind an earlier one draws a warning; a route into a dialect without
    schemas takes no schema."""
    earlier: list[Entry] = []
    for entry in document.routes:
        if entry is None:
            continue
        match = entry.values.get("match")
        if match is not None:
            _check_reachable(log, entry, match, earlier)
            earlier.append(entry)
        dialect = dialects().get(document.dialect_of(entry) or "")
        if entry.values.get("schema") is not None and dialect and not dialect.has_schemas:
            log.error(
                join_path(entry.path, "schema"),
                f"{dialect.name} has no schemas (database {entry.values['database']!r} is "
                f"{dialect.name})",
            )


def check_transactions(document: Document, log: ProblemLog) -> None:
    """`two-phase` needs a destination that can prepare a transaction and forwarding databases
    that hold the decision (PostgreSQL both): a route or proxy destination asking for it
    elsewhere is an error, naming what is in the way. A route into the forwarders' own
    database is atomic whatever it says, so it is not checked."""
    delivery = document.mappings.get(DELIVERY.name)
    default = (delivery.values.get("transaction") if delivery is not None else None) or "ledger"
    forwarding = [
        (entry.path, entry.values.get("database"), document.dialect_of(entry))
        for entry in document.forwarders
        if entry is not None
    ]
    for entry in document.routes:
        if entry is None:
            continue
        given = entry.values.get("transaction")
        if (given or default) != "two-phase":
            continue
        path = join_path(entry.path, "transaction")
        if given is None:
            path = f"{path} (from delivery.transaction)"
        sources = [f for f in forwarding if f[1] != entry.values.get("database")]
        if not sources:
            continue  # only into the forwarding database itself: one transaction anyway
        database = entry.values.get("database")
        _check_two_phase(log, path, database, document.dialect_of(entry), sources)
    for entry in document.forwarders:
        fixed = None if entry is None else entry.values.get("destination")
        if entry is None or not isinstance(fixed, FixedDestination):
            continue
        if (fixed.transaction or default) != "two-phase":
            continue
        if fixed.database == entry.values.get("database"):
            continue
        path = join_path(join_path(entry.path, "destination"), "transaction")
        if fixed.transaction is None:
            path = f"{path} (from delivery.transaction)"
        target = database_config(document, fixed.database)
        sources = [(entry.path, entry.values.get("database"), document.dialect_of(entry))]
        _check_two_phase(log, path, fixed.database, target.dialect if target else None, sources)


def _check_two_phase(
    log: ProblemLog,
    path: str,
    database: object,
    dialect_name: str | None,
    sources: list[tuple[str, object, str | None]],
) -> None:
    dialect = dialects().get(dialect_name or "")
    if dialect is not None and dialect.cannot_prepare is not None:
        log.error(
            path,
            f"two-phase needs a destination that can prepare a transaction, and database "
            f"{database!r} is {dialect.name}: {dialect.cannot_prepare}. Use 'ledger' "
            "(exactly once, with a ledger table there) or 'at-least-once'",
        )
        return
    for forwarder_path, source, source_dialect in sources:
        known = dialects().get(source_dialect or "")
        if known is not None and known.cannot_prepare is not None:
            log.error(
                path,
                f"two-phase keeps its commit decisions in the forwarding database, and "
                f"{forwarder_path} forwards from {source!r}, a {known.name} database: "
                "two-phase works between PostgreSQL databases. Use 'ledger' or "
                "'at-least-once' for this route",
            )
            return


def _check_reachable(log: ProblemLog, entry: Entry, match: str, earlier: list[Entry]) -> None:
    for previous in earlier:
        pattern = previous.values["match"]
        if set(pattern) == {"*"}:
            reason = f"{previous.path} (match {pattern!r}) matches every destination first"
        elif pattern == match:
            reason = f"{previous.path} has the same match and comes first"
        else:
            continue
        log.warning(join_path(entry.path, "match"), f"route {match!r} is unreachable: {reason}")
        return


def _forwarding_dialects(document: Document) -> list[str]:
    """The dialects of the forwarders' databases, in forwarder order, each once."""
    dialects: list[str] = []
    for entry in document.forwarders:
        dialect = None if entry is None else document.dialect_of(entry)
        if dialect is not None and dialect not in dialects:
            dialects.append(dialect)
    return dialects


def check_subscriptions(document: Document, log: ProblemLog) -> None:
    """Subscriber addresses: parsed in every forwarding dialect, routable, not repeated.

    A published event is multicast by whichever forwarder drains it, and a subscriber
    address is read like a destination header: in that forwarder's database's grammar.
    """
    dialects = _forwarding_dialects(document)
    routes = _route_configs(document)
    databases = database_configs(document)
    forwarding = [
        databases[name]
        for name in dict.fromkeys(e.values.get("database") for e in document.forwarders if e)
        if isinstance(name, str) and name in databases
    ]
    for topic, items in document.multimaps.get(SUBSCRIPTIONS.name, {}).items():
        first: dict[object, str] = {}
        unique: list[Item] = []
        for item in items:
            parsed: dict[str, TableAddress] = {}
            for dialect in dialects:
                try:
                    parsed[dialect] = grammar_for(dialect).parse(item.value)
                except AddressError as exc:
                    log.error(item.path, f"invalid {dialect} address: {exc}")
            if routes is not None:
                notes = {
                    dialect: note
                    for dialect, address in parsed.items()
                    if (note := where_routes_decide(address, dialect, databases, forwarding))
                    is not None
                }
                _check_subscriber_route(log, item, parsed, routes, notes)
            # The same queue in every forwarding dialect, e.g. `a.b` and `"a"."b"` when all
            # forwarders are postgresql; the text when an address does not parse.
            complete = dialects and len(parsed) == len(dialects)
            same = tuple(parsed.items()) if complete else item.value
            earlier = _seen_before(first, same, item.path)
            if earlier is None:
                unique.append(item)
            else:
                log.warning(
                    item.path,
                    f"{item.value!r} is the same subscriber as {earlier}; it gets the event once",
                )
        document.multimaps[SUBSCRIPTIONS.name][topic] = unique


def _route_configs(document: Document) -> list[RouteConfig] | None:
    """The routes as far as matching goes; None when one is broken (already reported),
    since checking against the others would report destinations it may well route."""
    routes: list[RouteConfig] = []
    for entry in document.routes:
        if entry is None or entry.values.get("match") is None:
            return None
        routes.append(RouteConfig(entry.values["match"], entry.values.get("database", "")))
    return routes


def _routed(table: str, routes: list[RouteConfig]) -> bool:
    return any(route.matches(table) for route in routes)


def _check_subscriber_route(
    log: ProblemLog,
    item: Item,
    parsed: Mapping[str, TableAddress],
    routes: list[RouteConfig],
    notes: Mapping[str, str],
) -> None:
    reported: set[str] = set()
    for dialect, address in parsed.items():
        table = address.table
        if dialect not in notes or table in reported or _routed(table, routes):
            continue
        reported.add(table)
        patterns = [route.match for route in routes]
        close = difflib.get_close_matches(table, patterns, n=1, cutoff=0.6)
        hint = f" (did you mean a destination matching {close[0]!r}?)" if close else ""
        read_as = ""
        if table != item.value:
            read_as = f"; {dialect} reads {item.value!r} as table {table!r}"
            if address.schema is not None and _routed(item.value, routes):
                read_as += f", write {json.dumps(item.value)!r} for a table with a dot"
        listed = ", ".join(repr(p) for p in patterns)
        log.error(
            item.path,
            f"no route matches subscriber table {table!r}{hint}{read_as}{notes[dialect]}; "
            f"routes: {listed}",
        )


def check_subscription_tables(document: Document, log: ProblemLog) -> None:
    """Each table parses in its database's grammar; one named twice draws a warning."""
    first: dict[object, str] = {}
    for entry in document.subscription_tables:
        if entry is None or entry.values.get("table") is None:
            continue
        name = entry.values.get("database")
        database = document.databases.get(name) if isinstance(name, str) else None
        if database is None or database.values.get("dialect") is None:
            continue
        dialect, text = database.values["dialect"], entry.values["table"]
        try:
            grammar = grammar_for(dialect)
            parsed = grammar.parse(text)
            table = grammar.resolve(parsed, database.values.get("schema"), None)
        except AddressError as exc:
            log.error(join_path(entry.path, "table"), f"invalid {dialect} table address: {exc}")
            continue
        earlier = _seen_before(first, (name, table), entry.path)
        if earlier is not None:
            log.warning(
                join_path(entry.path, "table"),
                f"{earlier} already names this table in database {name!r}; it is read once",
            )


def check_retries(document: Document, log: ProblemLog) -> None:
    """`retries.max_delay` and `retries.max_wait` are at least `retries.delay`."""
    retries = document.mappings.get(RETRIES.name)
    if retries is None:
        return
    delay = retries.values.get("delay")
    for key in ("max_delay", "max_wait"):
        value = retries.values.get(key)
        if delay is None or value is None or value >= delay:
            continue
        default = "" if key in retries.given else " (the default)"
        log.error(
            join_path(retries.path, key),
            f"{format_duration(value)}{default} is less than retries.delay "
            f"{format_duration(delay)}; it must be at least the delay",
        )
    _check_wait_within_ledger_retention(document, log, retries)


def _check_wait_within_ledger_retention(
    document: Document, log: ProblemLog, retries: Entry
) -> None:
    """A delivery whose commit was never confirmed (the connection broke during it) is tried
    again later; the ledger only recognises it while it remembers the message."""
    ledger = document.mappings.get(LEDGER.name)
    max_wait = retries.values.get("max_wait")
    retention = ledger.values.get("retention") if ledger is not None else None
    if retries.values.get("during_outage") != "wait" or max_wait is None or retention is None:
        return
    if max_wait > retention:
        # Both are defaults of 7d; a shorter retention alone now meets the default wait.
        default = "" if "max_wait" in retries.given else " (the default)"
        log.warning(
            join_path(retries.path, "max_wait"),
            f"{format_duration(max_wait)}{default} is longer than ledger.retention "
            f"{format_duration(retention)}: a message whose delivery was committed but not "
            "confirmed, and that then waits longer than the ledger remembers, could arrive "
            "twice; make ledger.retention at least as long",
        )
