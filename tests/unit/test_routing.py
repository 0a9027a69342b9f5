"""Specification of routing (bridge.routing): destination header -> database and queue address."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from bridge import routing
from bridge.addressing import TableAddress
from bridge.config.catalogs import databases_of_catalog
from bridge.config.model import DatabaseConfig, RouteConfig
from bridge.routing import (
    Destination,
    RouteChoice,
    Router,
    Unroutable,
    choose_route,
    first_matching_route,
    nearest_table,
    resolve_for_target,
    route_destination,
)

SENDER = DatabaseConfig("sender", "postgresql", connection="Driver=x")
RECEIVER = DatabaseConfig("receiver", "postgresql", connection="Driver=y")
INBOX = DatabaseConfig("inbox", "postgresql", connection="Driver=z", schema="inbox")
EDGE = DatabaseConfig("edge", "sqlite", path="/var/lib/sfbridge/edge.db")
STORE = DatabaseConfig("store", "sqlite", path="/var/lib/sfbridge/store.db")
MSSQL = DatabaseConfig("mssql", "sqlserver", connection="Driver=w")
MSSQL_SALES = DatabaseConfig("mssql_sales", "sqlserver", connection="Driver=v", schema="sales")

DATABASES = {db.name: db for db in (SENDER, RECEIVER, INBOX, EDGE, STORE, MSSQL, MSSQL_SALES)}


def _route(header: str, source: DatabaseConfig, *routes: RouteConfig) -> Destination | Unroutable:
    return route_destination(header, source, routes, DATABASES)


def _destination(header: str, source: DatabaseConfig, *routes: RouteConfig) -> Destination:
    decision = _route(header, source, *routes)
    assert isinstance(decision, Destination), decision
    return decision


def _reason(header: str, source: DatabaseConfig, *routes: RouteConfig) -> str:
    decision = _route(header, source, *routes)
    assert isinstance(decision, Unroutable), decision
    return decision.reason


# --------------------------------------------------------------------------------------------
# Route matching
# --------------------------------------------------------------------------------------------


def test_the_first_matching_route_wins() -> None:
    routes = (
        RouteConfig("Receiver*", "receiver"),
        RouteConfig("Receiver", "edge"),
        RouteConfig("*", "inbox"),
    )
    assert _destination("Receiver", SENDER, *routes).database == "receiver"


def test_a_later_route_is_used_when_earlier_ones_do_not_match() -> None:
    routes = (RouteConfig("Billing*", "receiver"), RouteConfig("*", "edge"))
    assert _destination("Shipping", SENDER, *routes).database == "edge"


def test_route_order_decides_not_specificity() -> None:
    routes = (RouteConfig("*", "edge"), RouteConfig("Receiver", "receiver"))
    assert _destination("Receiver", SENDER, *routes).database == "edge"


@pytest.mark.parametrize(
    ("pattern", "table", "matches"),
    [
        ("Receiver", "Receiver", True),
        ("Receiver", "receiver", False),
        ("receiver", "Receiver", False),
        ("RECEIVER", "Receiver", False),
        ("Receiver", "Receiver2", False),
        ("Receiver", "MyReceiver", False),
        ("*", "anything", True),
        ("*", "Samples.Receiver", True),
        ("Samples.*", "Samples.Receiver", True),
        ("Samples.*", "Samples.", True),
        ("Samples.*", "SamplesXReceiver", False),
        ("*.Receiver", "Samples.Receiver", True),
        ("Sales*", "Sales", True),
        ("Sales*", "sales.orders", False),
        ("Queue?", "Queue1", True),
        ("Queue?", "Queue", False),
        ("Queue?", "Queue12", False),
        ("Queue[abc]", "Queueb", True),
        ("Queue[abc]", "QueueB", False),
        ("Queue[abc]", "Queued", False),
        ("Queue[!abc]", "Queued", True),
        ("Queue[a-c]", "Queueb", True),
        ("Queue[0-9]*", "Queue7.high", True),
    ],
)
def test_route_globs_match_the_table_name_case_sensitively(
    pattern: str, table: str, matches: bool
) -> None:
    route = RouteConfig(pattern, "receiver")
    assert (first_matching_route(table, [route]) is route) is matches


def test_no_routes_match_nothing() -> None:
    assert first_matching_route("Receiver", []) is None


def test_first_matching_route_returns_the_route_itself() -> None:
    first = RouteConfig("R*", "receiver")
    second = RouteConfig("*", "edge")
    assert first_matching_route("Receiver", [first, second]) is first
    assert first_matching_route("Other", [first, second]) is second


def test_routes_match_the_table_name_not_the_schema() -> None:
    # The glob sees only the table part of the address.
    route = RouteConfig("sales", "receiver", schemas=("sales",))
    assert isinstance(_route('"sales"."orders"', SENDER, route), Unroutable)
    assert _destination('"sales"."sales"', SENDER, route).address.table == "sales"


# --------------------------------------------------------------------------------------------
# Unroutable: what to fix
# --------------------------------------------------------------------------------------------


def test_unroutable_reason_names_the_table_and_lists_the_routes() -> None:
    reason = _reason(
        "Shipping",
        SENDER,
        RouteConfig("Billing*", "receiver"),
        RouteConfig("Sales", "edge"),
    )
    assert "'Shipping'" in reason
    assert "routes: 'Billing*', 'Sales'." in reason
    assert "Add a route" in reason


def test_unroutable_reason_suggests_the_nearest_route_pattern() -> None:
    reason = _reason(
        "Recever",
        SENDER,
        RouteConfig("Billing", "receiver"),
        RouteConfig("Receiver", "receiver"),
    )
    assert "did you mean a destination matching 'Receiver'?" in reason


def test_unroutable_reason_makes_no_suggestion_when_nothing_is_close() -> None:
    reason = _reason("Shipping", SENDER, RouteConfig("Billing", "receiver"))
    assert "did you mean" not in reason


def test_unroutable_reason_says_when_there_are_no_routes_at_all() -> None:
    reason = _reason("Receiver", SENDER)
    assert "routes: none." in reason


def test_a_route_differing_only_in_case_is_suggested_not_used() -> None:
    reason = _reason("receiver", SENDER, RouteConfig("Receiver", "receiver"))
    assert "'receiver'" in reason
    assert "did you mean a destination matching 'Receiver'?" in reason


def test_the_unroutable_reason_names_the_parsed_table_not_the_whole_header() -> None:
    reason = _reason('"sales"."orders"', SENDER, RouteConfig("billing", "receiver"))
    assert "destination table 'orders'" in reason


# --------------------------------------------------------------------------------------------
# PostgreSQL header grammar
# --------------------------------------------------------------------------------------------

ALL = RouteConfig("*", "receiver")


def _with_schemas(route: RouteConfig, *schemas: str) -> RouteConfig:
    return RouteConfig(route.match, route.database, schemas=schemas)


def test_a_quoted_postgresql_address_names_schema_and_table() -> None:
    destination = _destination('"public"."Samples.Receiver"', SENDER, ALL)
    assert destination.address == TableAddress("Samples.Receiver", "public")
    assert destination.canonical == '"public"."Samples.Receiver"'


def test_an_unquoted_dotted_postgresql_address_is_schema_samples_table_receiver() -> None:
    # The documented gotcha: `Samples.Receiver` is NOT the table "Samples.Receiver".
    destination = _destination("Samples.Receiver", SENDER, _with_schemas(ALL, "Samples"))
    assert destination.address == TableAddress("Receiver", "Samples")
    assert destination.canonical == '"Samples"."Receiver"'


def test_the_gotcha_an_unquoted_dotted_address_misses_a_route_for_the_dotted_table() -> None:
    route = RouteConfig("Samples.*", "receiver")
    reason = _reason("Samples.Receiver", SENDER, route)
    assert "destination table 'Receiver'" in reason
    # Quoting the whole name makes it one table, which the route matches.
    assert _destination('"Samples.Receiver"', SENDER, route).address.table == "Samples.Receiver"


def test_a_quoted_dotted_table_without_schema_gets_the_default_schema() -> None:
    destination = _destination('"Samples.Receiver"', SENDER, ALL)
    assert destination.address == TableAddress("Samples.Receiver", "public")


def test_a_bare_postgresql_table_gets_the_public_schema() -> None:
    destination = _destination("Receiver", SENDER, ALL)
    assert destination.address == TableAddress("Receiver", "public")
    assert destination.canonical == '"public"."Receiver"'


def test_quoted_postgresql_names_keep_their_case_and_escaped_quotes() -> None:
    destination = _destination('"My""Schema"."Re""ceiver"', SENDER, _with_schemas(ALL, 'My"Schema'))
    assert destination.address == TableAddress('Re"ceiver', 'My"Schema')
    assert destination.canonical == '"My""Schema"."Re""ceiver"'


# --------------------------------------------------------------------------------------------
# SQLite header grammar
# --------------------------------------------------------------------------------------------


def test_a_sqlite_header_is_the_whole_table_name_dots_included() -> None:
    destination = _destination("Samples.Receiver", EDGE, RouteConfig("Samples.*", "store"))
    assert destination.database == "store"
    assert destination.address == TableAddress("Samples.Receiver")
    assert destination.canonical == "Samples.Receiver"


def test_a_sqlite_header_with_quotes_is_still_just_the_table_name() -> None:
    destination = _destination('"public"."Receiver"', EDGE, RouteConfig("*", "store"))
    assert destination.address == TableAddress('"public"."Receiver"')


def test_a_sqlite_source_accepts_sql_server_form_and_keeps_only_the_table() -> None:
    destination = _destination("Receiver@[dbo]@[Sales]", EDGE, RouteConfig("Receiver", "store"))
    assert destination.address == TableAddress("Receiver")


def test_a_sqlite_table_routed_to_postgresql_gets_the_target_default_schema() -> None:
    destination = _destination("Samples.Receiver", EDGE, RouteConfig("*", "inbox"))
    assert destination.address == TableAddress("Samples.Receiver", "inbox")
    assert destination.canonical == '"inbox"."Samples.Receiver"'


# --------------------------------------------------------------------------------------------
# Schema and catalog resolution
# --------------------------------------------------------------------------------------------


def test_the_address_schema_is_carried_between_databases_of_the_same_dialect() -> None:
    route = RouteConfig("*", "inbox", schemas=("sales",))
    destination = _destination('"sales"."Receiver"', SENDER, route)
    assert destination.address == TableAddress("Receiver", "sales")


def test_the_address_schema_is_dropped_between_different_dialects() -> None:
    to_sqlserver = _destination('"ops"."Receiver"', SENDER, RouteConfig("*", "mssql_sales"))
    assert to_sqlserver.address == TableAddress("Receiver", "sales")
    to_dbo = _destination('"ops"."Receiver"', SENDER, RouteConfig("*", "mssql"))
    assert to_dbo.address == TableAddress("Receiver", "dbo")
    assert to_dbo.canonical == "Receiver@[dbo]"


def test_a_postgresql_schema_does_not_reach_a_sqlite_target() -> None:
    destination = _destination('"sales"."Receiver"', SENDER, RouteConfig("*", "edge"))
    assert destination.address == TableAddress("Receiver")
    assert destination.canonical == "Receiver"


def test_schema_and_catalog_are_carried_between_sql_server_databases() -> None:
    route = RouteConfig("*", "mssql_sales", schemas=("ops",), catalogs=("Sales",))
    destination = _destination("Receiver@[ops]@[Sales]", MSSQL, route)
    assert destination.address == TableAddress("Receiver", "ops", "Sales")
    assert destination.canonical == "Receiver@[ops]@[Sales]"


def test_a_sql_server_catalog_and_schema_do_not_reach_postgresql() -> None:
    destination = _destination("Receiver@[ops]@[Sales]", MSSQL, RouteConfig("*", "receiver"))
    assert destination.address == TableAddress("Receiver", "public")


def test_the_route_schema_overrides_the_address_schema() -> None:
    route = RouteConfig("*", "receiver", schema="routed")
    destination = _destination('"sales"."Receiver"', SENDER, route)
    assert destination.address == TableAddress("Receiver", "routed")
    assert destination.canonical == '"routed"."Receiver"'


def test_the_route_schema_overrides_the_target_default_schema() -> None:
    route = RouteConfig("*", "inbox", schema="routed")
    assert _destination("Receiver", SENDER, route).address == TableAddress("Receiver", "routed")


def test_the_route_schema_applies_across_dialects() -> None:
    route = RouteConfig("*", "receiver", schema="routed")
    assert _destination("Receiver", EDGE, route).address == TableAddress("Receiver", "routed")
    route = RouteConfig("*", "mssql", schema="routed")
    assert _destination('"x"."Receiver"', SENDER, route).address == TableAddress(
        "Receiver", "routed"
    )


def test_a_route_schema_means_nothing_to_a_sqlite_target() -> None:
    route = RouteConfig("*", "edge", schema="routed")
    assert _destination("Receiver", SENDER, route).address == TableAddress("Receiver")


def test_the_target_default_schema_fills_an_address_without_one() -> None:
    assert _destination("Receiver", SENDER, RouteConfig("*", "inbox")).address == TableAddress(
        "Receiver", "inbox"
    )


def test_an_address_schema_beats_the_target_default_schema() -> None:
    route = RouteConfig("*", "inbox", schemas=("public",))
    destination = _destination('"public"."Receiver"', SENDER, route)
    assert destination.address == TableAddress("Receiver", "public")


def test_the_source_default_schema_is_not_used_for_the_target() -> None:
    # INBOX's default schema is "inbox"; RECEIVER has none, so the dialect default applies.
    destination = _destination("Receiver", INBOX, RouteConfig("*", "receiver"))
    assert destination.address == TableAddress("Receiver", "public")


def test_resolve_for_target_directly() -> None:
    parsed = TableAddress("Receiver", "sales")
    route = RouteConfig("*", "inbox", schemas=("sales",))
    assert resolve_for_target(parsed, SENDER, INBOX, route) == TableAddress("Receiver", "sales")
    assert resolve_for_target(parsed, SENDER, EDGE, RouteConfig("*", "edge")) == TableAddress(
        "Receiver"
    )
    assert resolve_for_target(
        parsed, SENDER, MSSQL, RouteConfig("*", "mssql", schema="x")
    ) == TableAddress("Receiver", "x")


# --------------------------------------------------------------------------------------------
# Destination
# --------------------------------------------------------------------------------------------


def test_the_destination_names_the_target_database() -> None:
    assert _destination("Receiver", SENDER, RouteConfig("*", "edge")).database == "edge"


@pytest.mark.parametrize(
    ("source", "header", "target", "canonical"),
    [
        (SENDER, "Receiver", "receiver", '"public"."Receiver"'),
        (SENDER, '"Samples.Receiver"', "inbox", '"inbox"."Samples.Receiver"'),
        (SENDER, "Receiver", "edge", "Receiver"),
        (SENDER, "Receiver", "mssql", "Receiver@[dbo]"),
        (EDGE, "Receiver", "mssql_sales", "Receiver@[sales]"),
        (MSSQL, "Re]ceiver@[o]]ps]@[S]]ales]", "mssql", "Re]ceiver@[o]]ps]@[S]]ales]"),
        (EDGE, 'Re"ceiver', "receiver", '"public"."Re""ceiver"'),
    ],
)
def test_the_canonical_form_is_the_target_dialects_rendering(
    source: DatabaseConfig, header: str, target: str, canonical: str
) -> None:
    route = RouteConfig("*", target, schemas=("o]ps",), catalogs=("S]ales",))
    assert _destination(header, source, route).canonical == canonical


def test_equivalent_headers_share_one_canonical_form() -> None:
    # The canonical form is the dedup-ledger key, so spellings of one queue must agree.
    route = RouteConfig("*", "receiver")
    forms = {
        _destination(header, SENDER, route).canonical
        for header in ("Receiver", '"Receiver"', 'public."Receiver"', '"public".Receiver')
    }
    assert forms == {'"public"."Receiver"'}


# --------------------------------------------------------------------------------------------
# Invalid addresses
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        "",
        "   ",
        '"unbalanced',
        '"public"."Receiver',
        '"sch"x.Receiver',
        'Rec"eiver',
        ".Receiver",
        '"".Receiver',
        "public.",
        "x" * 56,
        "Rec\x00eiver",
    ],
)
def test_an_invalid_postgresql_address_is_unroutable_and_points_at_the_header(
    header: str,
) -> None:
    reason = _reason(header, SENDER, ALL)
    assert repr(header) in reason
    assert "not a valid postgresql address" in reason
    assert "'$.store-and-forward.destination'" in reason


@pytest.mark.parametrize("header", ["", "Receiver@[unterminated", "Receiver@[a]x", "Rec\x00"])
def test_an_invalid_sqlite_address_is_unroutable_and_points_at_the_header(header: str) -> None:
    reason = _reason(header, EDGE, RouteConfig("*", "store"))
    assert "not a valid sqlite address" in reason
    assert "'$.store-and-forward.destination'" in reason


@pytest.mark.parametrize(
    ("source", "header", "target"),
    [
        (SENDER, '"a@b"', "edge"),
        (SENDER, '"a@b"', "mssql"),
        (EDGE, "T" + "x" * 60, "receiver"),
        (MSSQL, "T" + "x" * 60, "receiver"),
        (EDGE, "Tü" + "x" * 53, "receiver"),
    ],
)
def test_a_table_the_target_grammar_cannot_express_is_unroutable_not_an_exception(
    source: DatabaseConfig, header: str, target: str
) -> None:
    decision = _route(header, source, RouteConfig("*", target))
    assert isinstance(decision, Unroutable)


# --------------------------------------------------------------------------------------------
# Router
# --------------------------------------------------------------------------------------------


def _router(source: DatabaseConfig = SENDER, routes: Sequence[RouteConfig] = (ALL,)) -> Router:
    return Router(source, routes, DATABASES)


def test_the_router_routes_like_route_destination() -> None:
    router = _router(routes=(RouteConfig("Rec*", "inbox"),))
    assert router.route("Receiver") == _route("Receiver", SENDER, RouteConfig("Rec*", "inbox"))
    assert isinstance(router.route("Other"), Unroutable)


def test_the_router_caches_decisions_per_header(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = routing.route_destination

    def counting(header: str, *args: object, **keywords: object) -> Destination | Unroutable:
        calls.append(header)
        return real(header, *args, **keywords)  # type: ignore[arg-type]

    monkeypatch.setattr(routing, "route_destination", counting)
    router = _router()
    first = router.route("Receiver")
    assert router.route("Receiver") is first
    assert router.route("Other") is not first
    assert router.route("Other") is router.route("Other")
    assert calls == ["Receiver", "Other"]


def test_the_router_caches_unroutable_decisions_too() -> None:
    router = _router(routes=())
    decision = router.route("Receiver")
    assert isinstance(decision, Unroutable)
    assert router.route("Receiver") is decision


def test_the_router_cache_is_keyed_by_the_exact_header_text() -> None:
    router = _router()
    quoted = router.route('"public"."Receiver"')
    bare = router.route("Receiver")
    assert quoted is not bare
    assert quoted == bare


def test_the_router_copies_its_routes() -> None:
    routes = [RouteConfig("*", "receiver")]
    router = _router(routes=routes)
    routes[0] = RouteConfig("*", "edge")
    assert isinstance(router.route("Receiver"), Destination)
    assert router.route("Receiver").database == "receiver"  # type: ignore[union-attr]


def test_the_router_cache_is_bounded() -> None:
    router = _router()
    for n in range(10_000):
        router.route(f"Q{n}")
    beyond = router.route("Beyond")
    assert router.route("Beyond") is not beyond
    assert router.route("Beyond") == beyond
    # Entries cached before the bound was reached stay cached.
    assert router.route("Q0") is router.route("Q0")


# --------------------------------------------------------------------------------------------
# nearest_table
# --------------------------------------------------------------------------------------------


def test_nearest_table_finds_a_close_spelling() -> None:
    assert nearest_table("Recever", ["Sender", "Receiver", "error"]) == "Receiver"


def test_nearest_table_prefers_an_exact_name() -> None:
    assert nearest_table("Receiver", ["receiver", "Receiver", "Receivers"]) == "Receiver"


def test_nearest_table_falls_back_to_a_case_insensitive_match() -> None:
    assert nearest_table("RECEIVER", ["receiver", "sender"]) == "receiver"
    assert nearest_table("AB", ["ab"]) == "ab"


def test_nearest_table_is_none_when_nothing_is_close() -> None:
    assert nearest_table("Shipping", ["Receiver", "error"]) is None


def test_nearest_table_of_no_tables_is_none() -> None:
    assert nearest_table("Receiver", []) is None


def test_nearest_table_accepts_any_sequence() -> None:
    assert nearest_table("Recever", ("Receiver",)) == "Receiver"


# --------------------------------------------------------------------------------------------
# SQL Server catalogs: what the catalog of an address does
# --------------------------------------------------------------------------------------------

SENDER_DB = DatabaseConfig(
    "sender", "sqlserver", connection="Driver={FreeTDS};Server=sql1;Database=SenderDb"
)
RECEIVER_DB = DatabaseConfig(
    "receiver", "sqlserver", connection="Driver={FreeTDS};Server=sql2;Initial Catalog=ReceiverDb"
)
# Its connection names no database: the `catalog` key says which it is.
BILLING_DB = DatabaseConfig(
    "billing", "sqlserver", connection="Driver={FreeTDS};Server=sql3", catalog="BillingDb"
)
PG_RECEIVER = DatabaseConfig("pg", "postgresql", connection="Server=pg;Database=ReceiverDb")
CATALOG_DATABASES = {db.name: db for db in (SENDER_DB, RECEIVER_DB, BILLING_DB, PG_RECEIVER)}
TO_RECEIVER = RouteConfig("Samples.Receiver*", "receiver")


def _choice(header: str, *routes: RouteConfig, source: DatabaseConfig = SENDER_DB) -> RouteChoice:
    return choose_route(header, source, routes, CATALOG_DATABASES)


@pytest.mark.parametrize(
    "header",
    [
        "Samples.Receiver@[dbo]@[SenderDb]",  # the sender's own catalog: NServiceBus's default
        "Samples.Receiver@[dbo]@[senderdb]",  # database names compare without case
        "Samples.Receiver@[dbo]",
        "Samples.Receiver",
        "[Samples.Receiver]@[dbo]@[ReceiverDb]",  # the receiver's catalog, the table quoted
        "Samples.Receiver@[]@[ReceiverDb]",
    ],
)
def test_every_form_of_the_receivers_address_reaches_its_table_in_its_database(
    header: str,
) -> None:
    choice = _choice(header, TO_RECEIVER)
    destination = choice.decision
    assert isinstance(destination, Destination), destination
    assert destination.database == "receiver"
    # Two-part: the table is in the database the receiver's connection opens.
    assert destination.address == TableAddress("Samples.Receiver", "dbo")
    assert destination.canonical == "Samples.Receiver@[dbo]"


def test_the_senders_own_catalog_lets_the_route_decide() -> None:
    choice = _choice("Samples.Receiver@[dbo]@[SenderDb]", TO_RECEIVER)
    assert choice.route == 0
    assert choice.catalog is not None
    assert "the forwarding database 'sender' itself" in choice.catalog
    assert "the route decides" in choice.catalog


def test_a_catalog_naming_a_configured_database_without_a_route_to_it_is_refused() -> None:
    # A sender must not reach a database no route leads to by naming its catalog.
    choice = _choice("Samples.Billing@[dbo]@[BillingDb]", TO_RECEIVER)
    assert choice.decision == Unroutable(
        "catalog [BillingDb] names database 'billing', and no route for table "
        "'Samples.Billing' leads to it. Add a route for it to that database, or fix the "
        "destination header."
    )
    assert choice.route is None
    assert choice.catalog == "[BillingDb] is database 'billing': a route to it decides"


def test_a_subscriber_address_needs_a_route_like_any_other() -> None:
    # Read from the billing database's subscription table, in its own catalog: still no route.
    router = Router(SENDER_DB, [TO_RECEIVER], CATALOG_DATABASES)
    refused = router.route("Samples.Billing@[dbo]@[BillingDb]", "billing")
    assert isinstance(refused, Unroutable), refused
    assert "names database 'billing', and no route" in refused.reason
    routed = Router(
        SENDER_DB, [TO_RECEIVER, RouteConfig("Samples.Billing", "billing")], CATALOG_DATABASES
    ).route("Samples.Billing@[dbo]@[BillingDb]", "billing")
    assert isinstance(routed, Destination), routed
    assert (routed.database, routed.address) == ("billing", TableAddress("Samples.Billing", "dbo"))


def test_only_a_database_whose_subscription_table_is_read_may_mark_an_address() -> None:
    # The mark is the bridge's, on copies it read from that table; a forged one is refused.
    routes = [TO_RECEIVER, RouteConfig("Samples.Billing", "billing")]
    router = Router(SENDER_DB, routes, CATALOG_DATABASES, address_databases=frozenset({"billing"}))
    assert isinstance(router.route("Samples.Billing@[dbo]@[BillingDb]", "billing"), Destination)
    forged = router.route("Samples.Receiver@[dbo]@[ReceiverDb]", "receiver")
    assert forged == Unroutable(
        "the address 'Samples.Receiver@[dbo]@[ReceiverDb]' is marked as written in database "
        "'receiver', whose subscription table the bridge does not read (only a subscriber's "
        "address read there carries that mark)"
    )


def test_a_catalog_beats_a_route_to_another_database_and_takes_a_route_to_its_own() -> None:
    routes = (
        RouteConfig("*", "receiver"),
        RouteConfig("Samples.*", "billing", schema="ops", transaction="at-least-once"),
    )
    choice = _choice("Samples.Billing@[dbo]@[BillingDb]", *routes)
    destination = choice.decision
    assert isinstance(destination, Destination), destination
    assert destination.database == "billing"
    assert destination.address == TableAddress("Samples.Billing", "ops")
    assert destination.transaction == "at-least-once"
    assert choice.route == 1


def test_a_catalog_of_no_configured_database_is_refused_unless_the_route_lists_it() -> None:
    refused = _choice("Samples.Receiver@[dbo]@[ArchiveDb]", TO_RECEIVER).decision
    assert refused == Unroutable(
        "destination 'Samples.Receiver@[dbo]@[ArchiveDb]': routes[0] (match 'Samples.Receiver*')"
        " does not allow catalog [ArchiveDb] (another database on the server of 'receiver'); "
        "list it in that route's `catalogs` to deliver there; fix the destination header"
    )
    # Another catalog on the receiver's server: reached with a three-part name.
    route = RouteConfig("Samples.Receiver*", "receiver", catalogs=("archivedb",))
    choice = _choice("Samples.Receiver@[dbo]@[ArchiveDb]", route)
    destination = choice.decision
    assert isinstance(destination, Destination), destination
    assert destination.database == "receiver"
    assert destination.address == TableAddress("Samples.Receiver", "dbo", "ArchiveDb")
    assert destination.canonical == "Samples.Receiver@[dbo]@[ArchiveDb]"
    assert choice.catalog is not None and "no configured database's" in choice.catalog


def test_a_catalog_of_no_configured_database_still_needs_a_route() -> None:
    decision = _choice("Samples.Other@[dbo]@[ArchiveDb]", TO_RECEIVER).decision
    assert isinstance(decision, Unroutable)
    assert "no route matches destination table 'Samples.Other'" in decision.reason


def test_the_catalog_does_not_travel_to_another_dialect() -> None:
    decision = _choice("Samples.Receiver@[dbo]@[ArchiveDb]", RouteConfig("*", "pg")).decision
    assert isinstance(decision, Destination), decision
    assert decision.address == TableAddress("Samples.Receiver", "public")


def test_a_postgresql_database_is_never_named_by_a_catalog() -> None:
    # PG_RECEIVER's connection opens `ReceiverDb` too; only SQL Server databases have catalogs.
    assert databases_of_catalog("ReceiverDb", CATALOG_DATABASES) == (RECEIVER_DB,)


def test_one_catalog_on_several_servers_is_decided_by_a_route_or_refused() -> None:
    twin = DatabaseConfig("twin", "sqlserver", connection="Server=sql4;Database=ReceiverDb")
    databases = {**CATALOG_DATABASES, "twin": twin}
    header = "Samples.Receiver@[dbo]@[ReceiverDb]"
    routed = route_destination(header, SENDER_DB, [RouteConfig("Samples.*", "twin")], databases)
    assert isinstance(routed, Destination) and routed.database == "twin"
    refused = route_destination(header, SENDER_DB, [RouteConfig("x", "sender")], databases)
    assert isinstance(refused, Unroutable)
    assert refused.reason == (
        "catalog [ReceiverDb] names databases 'receiver', 'twin' (databases of one name on "
        "several servers), and no route for table 'Samples.Receiver' leads to one of them. Add "
        "a route for it to the database meant."
    )


def test_a_route_into_the_forwarding_database_drops_its_own_catalog() -> None:
    decision = _choice("Samples.Local@[dbo]@[SenderDb]", RouteConfig("*", "sender")).decision
    assert isinstance(decision, Destination), decision
    assert (decision.database, decision.address) == ("sender", TableAddress("Samples.Local", "dbo"))


def test_a_subscriber_address_from_another_databases_table_is_read_in_its_grammar() -> None:
    # Written by a subscriber in the receiver database: its catalog is where it lives.
    routes = [RouteConfig("*", "sender"), RouteConfig("*", "receiver")]
    router = Router(SENDER_DB, routes, CATALOG_DATABASES)
    decision = router.route("Samples.Receiver@[dbo]@[ReceiverDb]", "receiver")
    assert isinstance(decision, Destination), decision
    assert decision.database == "receiver"
