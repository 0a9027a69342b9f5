"""A sender reaches only what the routes allow. Pure: the routers and classification the data
path uses, for forwarding databases of every dialect (SQL Server's address grammar without a
server), fed what a hostile or buggy endpoint could write into a forwarding queue.

The oracle (`allowed`) is written from the rules of docs/security.md, not from bridge.routing:
a route's database, a table its glob matches, the database's default schema or one the route
lists, no catalog but one the route lists, never a table the bridge owns or reads there.
"""

from __future__ import annotations

import functools
import json
import random
import uuid
from fnmatch import fnmatchcase

import pytest

from bridge.addressing import TableAddress
from bridge.config.model import (
    BridgeConfig,
    DatabaseConfig,
    FixedDestination,
    ForwarderConfig,
    RouteConfig,
    SubscriptionTableConfig,
)
from bridge.dialects.registry import grammar_for
from bridge.exceptions import AddressError
from bridge.forwarding.classify import classify
from bridge.forwarding.fan_out import Fanout, fan_out
from bridge.forwarding.outgoing import Outgoing
from bridge.forwarding.proxies import forwarder_router
from bridge.forwarding.subscriptions import Subscriber
from bridge.headers import (
    ADDRESS_DATABASE_HEADER,
    ATTEMPTS_HEADER,
    DESTINATION_HEADER,
    EVENT_TYPE_HEADER,
    FAILURE_REASON_HEADER,
    parse_headers,
    without_bridge_headers,
)
from bridge.messages import ClaimedMessage, Forward, Poison, Publish, Reject
from bridge.routing import Destination, Router

DATABASES = {
    "sender": DatabaseConfig("sender", "postgresql", connection="Server=pg1;Database=sender"),
    "receiver": DatabaseConfig("receiver", "postgresql", connection="Server=pg2;Database=r"),
    "edge": DatabaseConfig("edge", "sqlite", path="/var/lib/sfbridge/edge.db"),
    "store": DatabaseConfig("store", "sqlite", path="/var/lib/sfbridge/store.db"),
    "mssql": DatabaseConfig("mssql", "sqlserver", connection="Server=sql1;Database=SenderDb"),
    "orders": DatabaseConfig("orders", "sqlserver", connection="Server=sql2;Database=OrdersDb"),
    # Configured, but no route leads here.
    "billing": DatabaseConfig("billing", "sqlserver", connection="Server=sql3;Database=BillingDb"),
}
ROUTES = (
    RouteConfig("Samples.Receiver*", "receiver"),
    RouteConfig("Tenant.*", "receiver", schemas=("tenants",)),
    RouteConfig("Orders*", "orders"),
    RouteConfig("Subscription*", "orders"),
    RouteConfig("Store*", "store"),
    # Globs wide enough to match the bridge's own tables: refused all the same.
    RouteConfig("error", "receiver"),
    RouteConfig("sfbridge_*", "orders"),
)
FORWARDERS = (
    ForwarderConfig("sender", "sender", '"Samples.Sender.Forward"'),
    ForwarderConfig("receiver-out", "receiver", '"Samples.Receiver.Forward"'),
    ForwarderConfig("edge", "edge", "Samples.Edge.Forward"),
    ForwarderConfig("store-out", "store", "Store.Forward", error_queue="Store.Errors"),
    ForwarderConfig("mssql", "mssql", "Samples.Sender.Forward"),
    ForwarderConfig("orders-out", "orders", "Orders.Forward", error_queue="Orders.Error"),
    # A proxy named after an endpoint of the receiver database, in the sender's.
    ForwarderConfig(
        "to-receiver",
        "sender",
        '"Samples.Receiver"',
        error_queue="proxy_error",
        destination=FixedDestination("receiver"),
    ),
)
CONFIG = BridgeConfig(
    databases=DATABASES,
    forwarders=FORWARDERS,
    routes=ROUTES,
    subscription_tables=(SubscriptionTableConfig("orders", "SubscriptionRouting"),),
)

# What the bridge owns or reads, written out by hand: (database, schema, table), casefolded.
OWNED = {
    ("sender", "public", "samples.sender.forward"),
    ("sender", "public", "error"),
    ("sender", "public", "samples.receiver"),  # the proxy queue
    ("sender", "public", "proxy_error"),
    ("receiver", "public", "samples.receiver.forward"),
    ("receiver", "public", "error"),
    ("edge", "", "samples.edge.forward"),
    ("edge", "", "error"),
    ("store", "", "store.forward"),
    ("store", "", "store.errors"),
    ("mssql", "dbo", "samples.sender.forward"),
    ("mssql", "dbo", "error"),
    ("orders", "dbo", "orders.forward"),
    ("orders", "dbo", "orders.error"),
    ("orders", "dbo", "subscriptionrouting"),
}
DEFAULT_SCHEMA = {"postgresql": "public", "sqlserver": "dbo", "sqlite": None}


def allowed(destination: Destination, source: str) -> bool:
    """Whether a route allows `destination` (the oracle; see the module docstring)."""
    address = destination.address
    target = DATABASES[destination.database]
    key = (destination.database, (address.schema or "").casefold(), address.table.casefold())
    if key in OWNED or address.table.casefold().startswith("sfbridge_"):
        return False
    for route in ROUTES:
        if route.database != destination.database or not fnmatchcase(address.table, route.match):
            continue
        schemas = {DEFAULT_SCHEMA[target.dialect], route.schema, *route.schemas}
        catalogs = {c.casefold() for c in route.catalogs}
        schema_ok = address.schema in schemas
        catalog_ok = address.catalog is None or address.catalog.casefold() in catalogs
        return schema_ok and catalog_ok
    return False


def claimed(headers: dict[str, str | None] | str) -> ClaimedMessage:
    text = headers if isinstance(headers, str) else json.dumps(headers)
    return ClaimedMessage(uuid.uuid4(), False, None, text, b"{}", 1)


def decide_as_sent(forwarder: str, headers: dict[str, str | None] | str) -> object:
    """What the data path decides for a row claimed from `forwarder`'s queue (a sender's row,
    as `BatchForwarder.units_of` classifies it)."""
    return classify(claimed(headers), router_of(forwarder), outgoing_of(forwarder), trusted=False)


@functools.cache
def router_of(forwarder: str) -> Router:
    return forwarder_router(CONFIG, CONFIG.forwarder(forwarder))


@functools.cache
def outgoing_of(forwarder: str) -> Outgoing:
    return Outgoing.from_config(CONFIG, CONFIG.forwarder(forwarder).database)


def assert_contained(decision: object, source: str) -> None:
    if isinstance(decision, Forward):
        assert allowed(decision.destination, source), decision.destination
    else:
        assert isinstance(decision, Reject | Poison), decision
        text = decision.reason
        assert text.strip(), decision


# -- the bridge's own headers ------------------------------------------------------------------


def test_a_senders_address_database_header_does_not_pick_another_grammar() -> None:
    # Read in SQL Server's grammar, this would name database 'billing' by its catalog.
    forged = {
        DESTINATION_HEADER: "Samples.Billing@[dbo]@[BillingDb]",
        ADDRESS_DATABASE_HEADER: "billing",
    }
    decision = decide_as_sent("sender", forged)
    assert isinstance(decision, Reject), decision
    assert decision.reason_code == "unroutable"
    # Read as the PostgreSQL address it is: schema 'Samples', table 'Billing@[dbo]@[BillingDb]'.
    assert "'Billing@[dbo]@[BillingDb]'" in decision.reason
    assert ADDRESS_DATABASE_HEADER not in decision.headers


def test_a_sqlite_sender_cannot_pick_a_postgresql_schema() -> None:
    forged = {DESTINATION_HEADER: '"secret"."Store.Receiver"', ADDRESS_DATABASE_HEADER: "receiver"}
    decision = decide_as_sent("edge", forged)
    assert isinstance(decision, Reject), decision
    assert 'no route matches destination table \'"secret"."Store.Receiver"\'' in decision.reason


def test_the_bridge_header_in_retry_storage_is_still_honoured() -> None:
    # The bridge wrote it (a subscriber copy read from the orders database's table).
    router = forwarder_router(CONFIG, CONFIG.forwarder("sender"))
    decision = router.route("Orders.Billing@[dbo]@[OrdersDb]", "orders")
    assert isinstance(decision, Destination), decision
    assert (decision.database, decision.address.table) == ("orders", "Orders.Billing")


@pytest.mark.parametrize(
    "spelling",
    [
        "$.sfbridge.attempts",
        "$.\\u0073fbridge.attempts",  # JSON escapes spell the same key
        "\\u0024\\u002e\\u0073\\u0066\\u0062\\u0072\\u0069\\u0064\\u0067\\u0065.attempts",
    ],
)
def test_every_spelling_of_a_bridge_header_is_dropped(spelling: str) -> None:
    text = (
        f'{{"NServiceBus.MessageId":"m1","{spelling}":"99","{DESTINATION_HEADER}":"Nowhere",'
        f'"$.sfbridge.anything":"x"}}'
    )
    message = claimed(text)
    decision = classify(message, router_of("sender"), outgoing_of("sender"), trusted=False)
    assert isinstance(decision, Reject), decision
    kept = {"NServiceBus.MessageId": "m1", DESTINATION_HEADER: "Nowhere"}
    assert decision.headers == kept
    # What retry storage would keep of the row: the text without them.
    assert message.headers_text is not None and parse_headers(message.headers_text) == kept


def test_duplicate_keys_leave_no_bridge_header_behind() -> None:
    text = (
        '{"$.sfbridge.address-database":"billing","NServiceBus.MessageId":"m1",'
        '"$.sfbridge.address-database":"orders"}'
    )
    assert without_bridge_headers(parse_headers(text)) == {"NServiceBus.MessageId": "m1"}


def test_a_row_without_bridge_headers_keeps_its_text_and_retry_storage_keeps_its_own() -> None:
    text = json.dumps({DESTINATION_HEADER: '"Samples.Receiver"', "NServiceBus.Note": "sfbridge"})
    message = claimed(text)
    assert isinstance(
        classify(message, router_of("sender"), outgoing_of("sender"), trusted=False), Forward
    )
    assert message.headers_text is text
    # A copy in retry storage, written by the bridge: its mark is read, and kept.
    own = json.dumps(
        {DESTINATION_HEADER: "Orders.Shipping@[dbo]@[OrdersDb]", ADDRESS_DATABASE_HEADER: "orders"}
    )
    retried = claimed(own)
    decision = classify(retried, router_of("sender"), outgoing_of("sender"), trusted=True)
    assert isinstance(decision, Forward), decision
    assert decision.destination.database == "orders"
    assert retried.headers_text is own


def test_every_header_of_the_bridge_is_one_a_sender_cannot_set() -> None:
    from bridge import headers

    names = {
        value
        for value in vars(headers).values()
        if isinstance(value, str) and value.startswith(headers.BRIDGE_HEADER_PREFIX)
    }
    assert names - {headers.BRIDGE_HEADER_PREFIX} == headers.BRIDGE_HEADERS


def test_forged_failure_headers_do_not_reach_the_error_queue() -> None:
    forged = {
        DESTINATION_HEADER: "Nowhere",
        FAILURE_REASON_HEADER: "forged",
        ATTEMPTS_HEADER: "99",
    }
    decision = decide_as_sent("sender", forged)
    assert isinstance(decision, Reject), decision
    assert FAILURE_REASON_HEADER not in decision.headers
    assert ATTEMPTS_HEADER not in decision.headers


# -- the bridge's own tables ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("forwarder", "header", "use"),
    [
        ("sender", '"public"."Samples.Receiver.Forward"', "forwarding queue of forwarder"),
        ("sender", '"Samples.Receiver.FORWARD"', None),  # no route: its glob is case-sensitive
        ("sender", "error", "the error queue of forwarder 'receiver-out'"),
        ("sender", '"public"."ERROR"', None),
        ("mssql", "sfbridge_retry", "a table the bridge creates for itself"),
        ("mssql", "SFBRIDGE_LEDGER@[dbo]", None),  # no route matches the upper case
        ("edge", "sfbridge_ledger", "a table the bridge creates for itself"),
        ("mssql", "Orders.Forward@[dbo]@[OrdersDb]", "forwarding queue of forwarder 'orders-out'"),
        ("mssql", "Orders.Error", "the error queue of forwarder 'orders-out'"),
        ("mssql", "[Orders.Error]@[dbo]", "the error queue of forwarder 'orders-out'"),
        ("mssql", "[Orders.ERROR]", "the error queue of forwarder 'orders-out'"),
        ("edge", "Store.Forward", "forwarding queue of forwarder 'store-out'"),
        ("edge", "Store.Errors", "the error queue of forwarder 'store-out'"),
        ("mssql", "SubscriptionRouting@[dbo]@[OrdersDb]", "a subscription table the bridge"),
        # SQL Server ignores trailing spaces and (default collations) case in names.
        ("mssql", "Orders.Forward @[dbo]", "forwarding queue of forwarder 'orders-out'"),
        ("mssql", "Orders.Error  @[DBO]", "the error queue of forwarder 'orders-out'"),
    ],
)
def test_the_bridges_own_tables_are_refused_up_front(
    forwarder: str, header: str, use: str | None
) -> None:
    decision = decide_as_sent(forwarder, {DESTINATION_HEADER: header})
    assert isinstance(decision, Reject), decision
    assert decision.reason_code == "unroutable"
    if use is not None:
        assert use in decision.reason, decision.reason
        assert "the bridge never delivers a message into its own tables" in decision.reason


def test_a_subscription_table_the_bridge_reads_is_refused() -> None:
    router = forwarder_router(CONFIG, CONFIG.forwarder("mssql"))
    assert isinstance(router.route("SubscriptionRoutingArchive"), Destination)
    refused = router.route("SubscriptionRouting")
    assert not isinstance(refused, Destination)
    assert "a subscription table the bridge reads" in refused.reason


def test_a_proxy_queue_is_never_a_destination_but_the_proxy_still_delivers() -> None:
    # The proxy's own queue, addressed by a sender: a loop through the bridge.
    routed = decide_as_sent("sender", {DESTINATION_HEADER: '"Samples.Receiver.Forward"'})
    assert isinstance(routed, Reject), routed
    # An ordinary send into the proxy goes to its configured destination.
    proxied = decide_as_sent("to-receiver", {"NServiceBus.MessageId": "m1"})
    assert isinstance(proxied, Forward), proxied
    assert (proxied.destination.database, proxied.destination.canonical) == (
        "receiver",
        '"public"."Samples.Receiver"',
    )


# -- schemas and catalogs ------------------------------------------------------------------------


def test_a_schema_the_route_does_not_list_is_refused_with_the_key_to_change() -> None:
    decision = decide_as_sent("sender", {DESTINATION_HEADER: '"secret"."Samples.Receiver"'})
    assert isinstance(decision, Reject), decision
    assert decision.reason == (
        "destination '\"secret\".\"Samples.Receiver\"': routes[0] (match 'Samples.Receiver*') "
        "does not allow schema 'secret' (only 'public'); list it in that route's `schemas` to "
        "deliver there; fix the destination header"
    )


def test_a_schema_the_route_lists_is_delivered_into() -> None:
    decision = decide_as_sent("sender", {DESTINATION_HEADER: '"tenants"."Tenant.A"'})
    assert isinstance(decision, Forward), decision
    assert decision.destination.canonical == '"tenants"."Tenant.A"'
    refused = decide_as_sent("sender", {DESTINATION_HEADER: '"other"."Tenant.A"'})
    assert isinstance(refused, Reject)
    assert "only 'public', 'tenants'" in refused.reason


def test_a_catalog_never_chooses_a_database_no_route_leads_to() -> None:
    for header in ("Samples.Billing@[dbo]@[BillingDb]", "Invoices@[dbo]@[billingdb]"):
        decision = decide_as_sent("mssql", {DESTINATION_HEADER: header})
        assert isinstance(decision, Reject), decision
        assert "names database 'billing', and no route" in decision.reason


def test_a_catalog_of_no_configured_database_is_refused() -> None:
    decision = decide_as_sent("mssql", {DESTINATION_HEADER: "Orders.Archive@[dbo]@[ArchiveDb]"})
    assert isinstance(decision, Reject), decision
    assert "does not allow catalog [ArchiveDb]" in decision.reason


def test_a_routed_catalog_reaches_its_database() -> None:
    decision = decide_as_sent("mssql", {DESTINATION_HEADER: "Orders.Billing@[dbo]@[OrdersDb]"})
    assert isinstance(decision, Forward), decision
    assert (decision.destination.database, decision.destination.canonical) == (
        "orders",
        "Orders.Billing@[dbo]",
    )


# -- published events ----------------------------------------------------------------------------


def test_subscribers_reach_only_what_the_routes_allow() -> None:
    router: Router = forwarder_router(CONFIG, CONFIG.forwarder("sender"))
    subscribers = [
        Subscriber('"Samples.Receiver"', "yaml", "sender"),
        Subscriber('"secret"."Samples.Receiver.Audit"', "table", "sender"),
        Subscriber('"Samples.Receiver.Forward"', "table", "receiver"),
        Subscriber("Orders.Forward@[dbo]@[OrdersDb]", "table", "orders"),
        Subscriber("Orders.Shipping@[dbo]@[OrdersDb]", "table", "orders"),
        Subscriber("sfbridge_ledger@[dbo]@[OrdersDb]", "table", "orders"),
    ]
    publish = Publish({EVENT_TYPE_HEADER: "Shared.Evt, Shared"}, "Shared.Evt", ("Shared.Evt",))
    fanned = fan_out(publish, subscribers, router, outgoing_of("sender"), fallback_message_id="m")
    assert isinstance(fanned, Fanout)
    outcomes = {copy.subscriber.address: copy.decision for copy in fanned.copies}
    forwarded = {a for a, d in outcomes.items() if isinstance(d, Forward)}
    assert forwarded == {'"Samples.Receiver"', "Orders.Shipping@[dbo]@[OrdersDb]"}
    for decision in outcomes.values():
        assert_contained(decision, "sender")


# -- whatever a sender writes ----------------------------------------------------------------------

HOSTILE_PIECES = [
    "Samples.Receiver",
    "Samples.Receiver.Forward",
    "Tenant.A",
    "Orders",
    "Orders.Forward",
    "Store",
    "Store.Forward",
    "error",
    "ERROR",
    "sfbridge_retry",
    "SubscriptionRouting",
    "public",
    "secret",
    "tenants",
    "dbo",
    "OrdersDb",
    "BillingDb",
    "SenderDb",
    "ArchiveDb",
    '"',
    '""',
    ".",
    "@",
    "[",
    "]",
    "]]",
    " ",
    "\x00",
    "\ud800",
    "\u0435",  # Cyrillic е, which looks like e
    "\u202e",
    "\n",
    "*",
    "x" * 70,
    "é" * 40,
]


def hostile_addresses(count: int, seed: int) -> list[str]:
    generator = random.Random(seed)
    forms = []
    for _ in range(count):
        pieces = generator.choices(HOSTILE_PIECES, k=generator.randint(1, 6))
        forms.append("".join(pieces))
    grammars = [grammar_for(name) for name in ("postgresql", "sqlserver", "sqlite")]
    for grammar in grammars:  # well-formed addresses of every dialect, too
        for table in ("Samples.Receiver", "Orders.Forward", "error", "sfbridge_ledger"):
            for schema in (None, "public", "secret", "dbo", "tenants"):
                for catalog in (None, "OrdersDb", "BillingDb", "ArchiveDb"):
                    try:
                        forms.append(grammar.render(TableAddress(table, schema, catalog)))
                    except AddressError:  # a form that grammar cannot write
                        continue
    return forms


@pytest.mark.parametrize("forwarder", [f.name for f in FORWARDERS])
def test_no_address_reaches_more_than_the_routes_allow(forwarder: str) -> None:
    addresses = hostile_addresses(3000, seed=hash(forwarder) & 0xFFFF)
    other_databases = [None, *DATABASES, "nowhere"]
    for index, address in enumerate(addresses):
        headers: dict[str, str | None] = {DESTINATION_HEADER: address}
        forged = other_databases[index % len(other_databases)]
        if forged is not None:
            headers[ADDRESS_DATABASE_HEADER] = forged
        decision = decide_as_sent(forwarder, headers)
        assert_contained(decision, forwarder)
        if isinstance(decision, Forward | Reject):
            assert not any(key.startswith("$.sfbridge.") for key in decision.headers)


def test_names_of_any_length_are_refused_not_truncated() -> None:
    for length in (56, 64, 129, 10_000):
        decision = decide_as_sent("sender", {DESTINATION_HEADER: "Samples.Receiver" + "x" * length})
        assert isinstance(decision, Reject), decision
        assert "bytes in UTF-8; the PostgreSQL transport allows at most 55" in decision.reason


def test_nul_bytes_and_surrogates_in_addresses_are_refused() -> None:
    for forwarder in ("sender", "mssql", "edge"):
        for bad in ("Samples.Receiver\x00x", "Orders\x00", "Store\ud800"):
            text = json.dumps({DESTINATION_HEADER: bad})  # NUL and surrogates as escapes
            decision = decide_as_sent(forwarder, text)
            assert isinstance(decision, Reject), (forwarder, bad, decision)


def test_sql_server_schemas_compare_without_case_postgresql_ones_exactly() -> None:
    decision = decide_as_sent("mssql", {DESTINATION_HEADER: "Orders.Billing@[DBO]@[OrdersDb]"})
    assert isinstance(decision, Forward), decision
    assert decision.destination.address.schema == "DBO"
    refused = decide_as_sent("sender", {DESTINATION_HEADER: '"PUBLIC"."Samples.Receiver"'})
    assert isinstance(refused, Reject), refused  # another schema in PostgreSQL


def test_a_name_any_database_could_take_for_a_bridge_table_is_refused() -> None:
    everything = BridgeConfig(
        databases=DATABASES, forwarders=FORWARDERS, routes=(RouteConfig("*", "orders"),)
    )
    router = forwarder_router(everything, everything.forwarder("mssql"))
    for header in (
        "\uff53fbridge_ledger",  # a full-width s, which default collations take for s
        "SFBRIDGE_RETRY ",
        "Orders.Forward   ",
    ):
        table = json.loads(f'"{header}"')
        decision = router.route(table)
        assert not isinstance(decision, Destination), (table, decision)
