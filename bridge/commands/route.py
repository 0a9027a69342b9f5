"""`sfbridge route`: where a message with a given routing header would go, decided as the
daemon decides it, or why it would go to the error queue.

The message is classified by the data path's own `classify` with the forwarder's own router
(routes, proxy destination, SQL Server catalogs), so the answer is the daemon's, suggestions
included. Nothing is read from a database, except the subscribers of a published event from
the `subscription_tables`, when the config lists any. Every text that came from a database
or from the command line is printed between single quotes as it is (backslashes and quotes
kept, not Python's `repr`), and every line goes through `inert`, so nothing in it can act on
a terminal.
"""

from __future__ import annotations

import argparse
import uuid

from bridge.commands.configuration import load
from bridge.commands.selection import forwarder_named
from bridge.config.catalogs import database_catalog
from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.dialects.registry import dialect_for
from bridge.exceptions import ExitCode
from bridge.forwarding.classify import classify
from bridge.forwarding.fan_out import fan_out
from bridge.forwarding.outgoing import Outgoing
from bridge.forwarding.proxies import forwarder_router
from bridge.forwarding.subscriptions import SubscriberDirectory
from bridge.headers import DESTINATION_HEADER, EVENT_TYPE_HEADER, serialize_headers
from bridge.messages import ClaimedMessage, Forward, NoSubscribers, Publish, Reject
from bridge.routing import Destination, Router, choose_route
from bridge.secrets import inert
from bridge.storage.tables import forwarder_tables

__all__ = ["add_arguments", "run"]


def _say(line: str) -> None:
    """Print one line, its control characters escaped (`bridge.secrets.inert`)."""
    print(inert(line))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "address",
        nargs="?",
        help="the destination header ($.store-and-forward.destination), in the forwarding "
        "database's address grammar; leave it out for what a proxy does with a plain send",
    )
    parser.add_argument(
        "--forwarder", help="the forwarder whose queue it is in (default: the first)"
    )
    parser.add_argument(
        "--event-type",
        metavar="TYPE",
        help="a published event's type ($.store-and-forward.eventtype): lists its subscribers "
        "and where each copy goes (reads subscription_tables, if the config has any)",
    )


def run(args: argparse.Namespace) -> int:
    """Print where the message would go; ExitCode.OK, or ExitCode.FAILED when it would go to
    the error queue.

    Raises RequestError for an unknown forwarder, DatabaseError when a subscription table must
    be read and cannot be.
    """
    config = load(args)
    forwarder = forwarder_named(config, args.forwarder)
    router = forwarder_router(config, forwarder)
    headers: dict[str, str | None] = {}
    if args.address is not None:
        headers[DESTINATION_HEADER] = args.address
    if args.event_type is not None:
        headers[EVENT_TYPE_HEADER] = args.event_type
    _say(_heading(config, forwarder, args.address, args.event_type))
    message = ClaimedMessage(
        row_id=uuid.UUID(int=0),
        expired=False,
        expires=None,
        headers_text=serialize_headers(headers),
        body=None,
        order=0,
    )
    outgoing = Outgoing.from_config(config, forwarder.database)
    decision = classify(message, router, outgoing)  # as the daemon classifies a claimed row
    if isinstance(decision, Reject):
        _say(_error_queue_line(config, forwarder, decision.reason_code, decision.reason))
        return ExitCode.FAILED
    if isinstance(decision, Forward):
        for line in _delivery_lines(config, forwarder, router, args.address, decision.destination):
            _say(line)
        return ExitCode.OK
    assert isinstance(decision, Publish), decision
    return _publish(config, forwarder, router, decision)


def _heading(
    config: BridgeConfig, forwarder: ForwarderConfig, address: str | None, event_type: str | None
) -> str:
    source = config.databases[forwarder.database]
    what = []
    if address is not None:
        what.append(f"destination '{address}'")
    if event_type is not None:
        what.append(f"event type '{event_type}'")
    if not what:
        what.append("no routing header")
    return (
        f"a message with {' and '.join(what)} in forwarder '{forwarder.name}' "
        f"(database '{source.name}', {source.dialect}):"
    )


def _delivery_lines(
    config: BridgeConfig,
    forwarder: ForwarderConfig,
    router: Router,
    address: str | None,
    destination: Destination,
    written_in: str | None = None,
) -> list[str]:
    """Where one message (or subscriber copy) goes, and why there."""
    target = config.databases[destination.database]
    grammar = dialect_for(target.dialect).grammar
    table = grammar.qualified_name(destination.address)
    if destination.address.catalog:
        opens = f"through the connection of database '{target.name}' (another catalog there)"
    else:
        catalog = database_catalog(target)
        opens = f"in catalog {catalog}" if catalog else "in the database its connection opens"
    lines = [
        f"  -> database '{target.name}' ({target.dialect}): queue {destination.canonical}, "
        f"table {table} {opens}"
    ]
    if target.name == forwarder.database:
        crossing = "in the forwarding database itself: one transaction with the claim"
    else:
        crossing = f"transaction {destination.transaction}"
    if address is None or destination is router.proxy:
        lines.append(f"     the proxy's destination (forwarders[].destination), {crossing}")
        return lines
    source = config.databases[forwarder.database]
    choice = choose_route(
        address,
        source,
        config.routes,
        config.databases,
        default_transaction=config.delivery.transaction,
        written_in=config.databases.get(written_in or source.name),
    )
    if choice.route is not None:  # always, for a destination: every one takes a route
        route = config.routes[choice.route]
        lines.append(f"     by routes[{choice.route}] (match '{route.match}'), {crossing}")
    if choice.catalog is not None:
        lines.append(f"     catalog {choice.catalog}")
    return lines


def _error_queue_line(
    config: BridgeConfig, forwarder: ForwarderConfig, code: str, reason: str, indent: str = ""
) -> str:
    tables = forwarder_tables(config, forwarder)
    grammar = dialect_for(config.databases[forwarder.database].dialect).grammar
    error_queue = grammar.render(tables.error_queue)
    return (
        f"{indent}  -> the error queue {error_queue} in database '{forwarder.database}' "
        f"(reason {code}): {reason}"
    )


def _publish(
    config: BridgeConfig, forwarder: ForwarderConfig, router: Router, publish: Publish
) -> int:
    topics = ", ".join(f"'{topic}'" for topic in publish.topics)
    _say(f"  subscribers are looked up for the topics {topics}")
    lookup = SubscriberDirectory(config, forwarder.database).lookup(publish.topics)
    outgoing = Outgoing.from_config(config, forwarder.database)
    fanned = fan_out(
        publish, lookup.subscribers, router, outgoing, fallback_message_id="sfbridge-route"
    )
    if isinstance(fanned, NoSubscribers):
        if config.publish.no_subscribers == "drop":
            _say(
                "  -> nowhere: it has no subscribers, so it is dropped and counted "
                "(publish.no_subscribers: drop)"
            )
            return ExitCode.OK
        reason = f"published event '{publish.topics[0]}' has no subscribers"
        _say(_error_queue_line(config, forwarder, "no-subscribers", reason))
        return ExitCode.FAILED
    failed = False
    for copy in fanned.copies:
        listed = "; ".join(f"'{s.address}' ({s.source})" for s in copy.subscribers)
        _say(f"  subscriber {listed}:")
        decision = copy.decision
        if isinstance(decision, Forward):
            subscriber = copy.subscriber
            lines = _delivery_lines(
                config,
                forwarder,
                router,
                subscriber.address,
                decision.destination,
                written_in=subscriber.address_database,
            )
            for line in lines:
                _say("  " + line)
        else:
            failed = True
            line = _error_queue_line(
                config, forwarder, decision.reason_code, decision.reason, indent="  "
            )
            _say(line)
    return ExitCode.FAILED if failed else ExitCode.OK
