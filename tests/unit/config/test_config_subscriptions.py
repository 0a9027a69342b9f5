"""Configuration of publishing: `subscriptions`, `subscription_tables` and `publish`."""

from __future__ import annotations

import copy
import json
import types
from typing import Any

import pytest

from bridge.config import (
    BridgeConfig,
    Problem,
    PublishConfig,
    SubscriptionTableConfig,
    validate,
)
from bridge.config.reference import render_reference_markdown
from bridge.config.schema import SUBSCRIPTIONS
from bridge.config.topics import topic_problem

ENV = {"RECEIVER_ODBC": "Driver={PostgreSQL Unicode};Server=db2;Database=receiver;Uid=bridge"}
SENDER_ODBC = "Driver={PostgreSQL Unicode};Server=127.0.0.1;Database=sender;Uid=postgres"
TOPIC = "Shared.OrderSubmitted"
GENERIC = (
    "Shared.Envelope`1[[Shared.Order, Shared, Version=1.0.0.0, Culture=neutral, "
    "PublicKeyToken=null]]"
)


def document(**sections: object) -> dict[str, Any]:
    """A valid document forwarding from a sqlite database, where an address is the bare table
    name, to a postgresql one; `sections` are added or replace the defaults."""
    raw: dict[str, Any] = {
        "databases": {
            "sender": {"dialect": "postgresql", "connection": SENDER_ODBC},
            "receiver": {"dialect": "postgresql", "connection": "${RECEIVER_ODBC}"},
            "edge": {"dialect": "sqlite", "path": "/var/lib/sfbridge/edge.db"},
        },
        "forwarders": [{"name": "edge", "database": "edge", "queue": "forward"}],
        "routes": [{"match": "Samples.*", "database": "receiver"}],
    }
    raw.update(copy.deepcopy(sections))
    return raw


def with_postgresql_forwarder(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` plus a forwarder on the postgresql `sender` database."""
    result = copy.deepcopy(raw)
    result["forwarders"].append({"name": "sender", "database": "sender", "queue": "forward"})
    return result


def problems(raw: object) -> list[Problem]:
    return validate(raw, ENV)[1]


def errors(raw: object) -> list[str]:
    return [str(p) for p in problems(raw) if p.severity == "error"]


def warnings(raw: object) -> list[str]:
    return [str(p) for p in problems(raw) if p.severity == "warning"]


def the_error(raw: object) -> str:
    found = errors(raw)
    assert len(found) == 1, found
    return found[0]


def the_warning(raw: object) -> str:
    found = problems(raw)
    assert [p.severity for p in found] == ["warning"], [str(p) for p in found]
    return str(found[0])


def build(raw: object) -> BridgeConfig:
    config, found = validate(raw, ENV)
    assert config is not None, [str(p) for p in found]
    return config


def subscribers(*addresses: object) -> dict[str, Any]:
    return {"subscriptions": {TOPIC: list(addresses)}}


# --------------------------------------------------------------------------------------------
# Defaults and the built configuration
# --------------------------------------------------------------------------------------------


def test_without_the_three_sections_there_are_no_subscribers_and_the_default_policy() -> None:
    config = build(document())
    assert dict(config.subscriptions) == {}
    assert config.subscription_tables == ()
    assert config.publish == PublishConfig()


@pytest.mark.parametrize("section", ["subscriptions", "subscription_tables", "publish"])
def test_a_null_section_means_its_default(section: str) -> None:
    assert build(document(**{section: None})) == build(document())


def test_an_empty_subscriptions_mapping_is_valid() -> None:
    assert dict(build(document(subscriptions={})).subscriptions) == {}


def test_subscriptions_are_built_as_a_read_only_mapping_of_tuples_in_file_order() -> None:
    raw = document(
        subscriptions={
            TOPIC: ["Samples.Billing", "Samples.Shipping"],
            "Shared.OrderCancelled": ["Samples.Billing"],
        }
    )
    config = build(raw)
    assert isinstance(config.subscriptions, types.MappingProxyType)
    assert list(config.subscriptions.items()) == [
        (TOPIC, ("Samples.Billing", "Samples.Shipping")),
        ("Shared.OrderCancelled", ("Samples.Billing",)),
    ]
    with pytest.raises(TypeError):
        config.subscriptions["Shared.Other"] = ()  # type: ignore[index]


def test_subscriber_addresses_are_kept_as_written() -> None:
    raw = with_postgresql_forwarder(document(**subscribers('"Samples.Billing"')))
    raw["routes"].append({"match": "*", "database": "sender"})
    assert build(raw).subscriptions[TOPIC] == ('"Samples.Billing"',)


def test_subscription_tables_are_built_with_the_default_table_name() -> None:
    raw = document(
        subscription_tables=[
            {"database": "receiver"},
            {"database": "edge", "table": "Subscriptions"},
        ]
    )
    assert build(raw).subscription_tables == (
        SubscriptionTableConfig("receiver", "SubscriptionRouting"),
        SubscriptionTableConfig("edge", "Subscriptions"),
    )


def test_publish_settings_are_converted() -> None:
    raw = document(publish={"no_subscribers": "error", "cache": "500ms"})
    assert build(raw).publish == PublishConfig(no_subscribers="error", cache=0.5)


# --------------------------------------------------------------------------------------------
# Topics
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "topic",
    [
        TOPIC,
        "OrderSubmitted",
        "Shared.Outer+Nested",
        "Shared.Order[]",
        "Shared.Grid[,]",
        GENERIC,
        "Shared.Pair`2[[Shared.A, Shared],[Shared.B, Other, Version=2.0.0.0]]",
    ],
)
def test_a_full_type_name_is_a_valid_topic_even_with_assembly_qualified_generic_arguments(
    topic: str,
) -> None:
    assert topic_problem(topic) is None
    assert build(document(subscriptions={topic: ["Samples.Billing"]})).subscriptions[topic]


@pytest.mark.parametrize(
    ("topic", "message"),
    [
        ("", "a topic must not be empty"),
        ("   ", "a topic must not be empty"),
        (
            " Shared.OrderSubmitted",
            "has leading or trailing whitespace; write 'Shared.OrderSubmitted'",
        ),
        ("Shared.OrderSubmitted\t", "has leading or trailing whitespace"),
        (
            "Shared.OrderSubmitted, Shared",
            "names an assembly ('Shared'); a topic is the event type's full name without the "
            "assembly part: write 'Shared.OrderSubmitted'",
        ),
        ("Shared.OrderSubmitted,Shared", "names an assembly ('Shared')"),
        (
            "Shared.OrderSubmitted, Shared, Version=1.0.0.0, Culture=neutral",
            "write 'Shared.OrderSubmitted'",
        ),
        (
            "Shared.Envelope`1[[Shared.Order, Shared, Version=1.0.0.0]], Shared",
            "write 'Shared.Envelope`1[[Shared.Order, Shared, Version=1.0.0.0]]'",
        ),
        ("Shared.Envelope`1[[Shared.Order, Shared]", "has unbalanced '[' and ']'"),
        ("Shared.Order]", "has unbalanced '[' and ']'"),
    ],
)
def test_an_invalid_topic_is_an_error_at_its_quoted_key(topic: str, message: str) -> None:
    error = the_error(document(subscriptions={topic: ["Samples.Billing"]}))
    assert error.startswith(f"subscriptions[{json.dumps(topic)}]: ")
    assert message in error


def test_a_topic_that_is_not_a_string_is_an_error() -> None:
    raw = document(subscriptions={1: ["Samples.Billing"]})
    assert the_error(raw) == "subscriptions: topics must be strings, got an integer (1)"


@pytest.mark.parametrize("value", [["Samples.Billing"], "Samples.Billing", 3])
def test_subscriptions_that_are_not_a_mapping_are_an_error(value: object) -> None:
    assert the_error(document(subscriptions=value)).startswith(
        "subscriptions: expected a mapping of topic to a list of subscribers, got "
    )


# --------------------------------------------------------------------------------------------
# Subscriber lists
# --------------------------------------------------------------------------------------------


def test_a_single_address_instead_of_a_list_is_an_error_that_shows_the_list_form() -> None:
    raw = document(subscriptions={TOPIC: "Samples.Billing"})
    assert the_error(raw) == (
        'subscriptions["Shared.OrderSubmitted"]: expected a list of subscribers, got a string '
        "('Samples.Billing'); write [\"Samples.Billing\"] for a single one"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "expected a list of subscribers, got null"),
        ({"a": "b"}, "expected a list of subscribers, got a mapping"),
        ([], "the list of subscribers is empty; leave the entry out instead"),
    ],
)
def test_a_subscriber_list_must_be_a_non_empty_list(value: object, message: str) -> None:
    raw = document(subscriptions={TOPIC: value})
    assert the_error(raw) == f'subscriptions["Shared.OrderSubmitted"]: {message}'


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "expected a string, got null"),
        (7, "expected a string, got an integer (7); quote the value if it is meant as text"),
        ("", "must not be empty"),
        ("  ", "must not be empty"),
        (["a"], "expected a string, got a list"),
    ],
)
def test_every_subscriber_must_be_a_non_empty_string(value: object, message: str) -> None:
    raw = document(**subscribers("Samples.Billing", value))
    assert the_error(raw) == f'subscriptions["Shared.OrderSubmitted"][1]: {message}'


def test_a_repeated_subscriber_is_a_warning_and_is_built_once() -> None:
    raw = document(**subscribers("Samples.Billing", "Samples.Shipping", "Samples.Billing"))
    assert the_warning(raw) == (
        "subscriptions[\"Shared.OrderSubmitted\"][2]: warning: 'Samples.Billing' is the same "
        'subscriber as subscriptions["Shared.OrderSubmitted"][0]; it gets the event once'
    )
    assert build(raw).subscriptions[TOPIC] == ("Samples.Billing", "Samples.Shipping")


def test_two_spellings_of_the_same_queue_in_every_forwarding_grammar_are_a_repeat() -> None:
    raw = document(**subscribers("billing.Queue", '"billing"."Queue"'))
    raw["forwarders"] = [{"name": "sender", "database": "sender", "queue": "forward"}]
    raw["routes"] = [{"match": "*", "database": "receiver"}]
    assert "is the same subscriber as" in the_warning(raw)


def test_spellings_that_differ_in_some_forwarding_grammar_are_not_a_repeat() -> None:
    # The same PostgreSQL queue, but two different SQLite tables.
    raw = with_postgresql_forwarder(document(**subscribers("billing.Queue", '"billing"."Queue"')))
    raw["routes"] = [{"match": "*", "database": "receiver"}]
    assert problems(raw) == []


def test_the_same_subscriber_under_two_topics_is_fine() -> None:
    raw = document(
        subscriptions={TOPIC: ["Samples.Billing"], "Shared.OrderCancelled": ["Samples.Billing"]}
    )
    assert problems(raw) == []


# --------------------------------------------------------------------------------------------
# Subscriber addresses: grammars and routes
# --------------------------------------------------------------------------------------------


def test_a_subscriber_address_must_parse_in_the_grammar_of_every_forwarding_database() -> None:
    # Valid SQLite (a bare table name), but not PostgreSQL.
    raw = with_postgresql_forwarder(document(**subscribers("Samples.Billing", 'Samples."Billing')))
    raw["routes"].append({"match": "*", "database": "receiver"})
    assert the_error(raw) == (
        'subscriptions["Shared.OrderSubmitted"][1]: invalid postgresql address: unbalanced '
        "double quotes in address 'Samples.\"Billing'"
    )


def test_an_address_invalid_in_several_forwarding_grammars_is_reported_for_each() -> None:
    raw = with_postgresql_forwarder(document(**subscribers('a@b@c@"d')))
    found = errors(raw)
    assert [line.split(": ")[1] for line in found] == [
        "invalid sqlite address",
        "invalid postgresql address",
    ]


def test_a_subscriber_that_no_route_matches_is_an_error_with_the_nearest_route() -> None:
    raw = document(**subscribers("Samples.Billing", "Sample.Billing"))
    raw["routes"] = [
        {"match": "Samples.Billing", "database": "receiver"},
        {"match": "Samples.Shipping", "database": "receiver"},
    ]
    assert the_error(raw) == (
        'subscriptions["Shared.OrderSubmitted"][1]: no route matches subscriber table '
        "'Sample.Billing' (did you mean a destination matching 'Samples.Billing'?); routes: "
        "'Samples.Billing', 'Samples.Shipping'"
    )


def test_routes_are_matched_on_the_table_name_as_each_forwarding_grammar_reads_it() -> None:
    # PostgreSQL reads `Samples.Billing` as table `Billing` in schema `Samples`.
    raw = with_postgresql_forwarder(document(**subscribers("Samples.Billing")))
    assert the_error(raw) == (
        'subscriptions["Shared.OrderSubmitted"][0]: no route matches subscriber table '
        "'Billing'; postgresql reads 'Samples.Billing' as table 'Billing', write "
        "'\"Samples.Billing\"' for a table with a dot; routes: 'Samples.*'"
    )


def test_a_subscriber_routed_by_a_later_route_is_fine() -> None:
    raw = document(**subscribers("Billing"))
    raw["routes"].append({"match": "Bill*", "database": "sender"})
    assert problems(raw) == []


def test_subscribers_are_not_checked_against_routes_that_have_errors_themselves() -> None:
    raw = document(**subscribers("Billing"))
    raw["routes"].append({"database": "sender"})
    assert errors(raw) == ["routes[1].match: required key is missing"]


def test_subscriber_addresses_are_not_parsed_when_no_forwarder_database_is_known() -> None:
    raw = document(**subscribers('a@b@c@"d'))
    raw["forwarders"][0]["database"] = "egde"
    assert errors(raw) == [
        "forwarders[0].database: no database named 'egde' (did you mean 'edge'?)"
    ]


# --------------------------------------------------------------------------------------------
# Subscription tables
# --------------------------------------------------------------------------------------------


def test_a_subscription_table_in_an_unknown_database_is_an_error_with_the_nearest_name() -> None:
    raw = document(subscription_tables=[{"database": "reciever"}])
    assert the_error(raw) == (
        "subscription_tables[0].database: no database named 'reciever' (did you mean 'receiver'?)"
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({}, "subscription_tables[0].database: required key is missing"),
        (
            {"database": "receiver", "tabel": "x"},
            "subscription_tables[0].tabel: unknown key (did you mean 'table'?)",
        ),
        ({"database": "receiver", "table": ""}, "subscription_tables[0].table: must not be empty"),
        (
            {"database": "receiver", "table": 5},
            "subscription_tables[0].table: expected a string, got an integer (5)",
        ),
        (
            "receiver",
            "subscription_tables[0]: expected a mapping of subscription table settings, got a "
            "string ('receiver')",
        ),
    ],
)
def test_subscription_table_entry_rules(entry: object, message: str) -> None:
    assert the_error(document(subscription_tables=[entry])).startswith(message)


def test_subscription_tables_that_are_not_a_list_are_an_error() -> None:
    assert the_error(document(subscription_tables={"database": "receiver"})) == (
        "subscription_tables: expected a list of subscription tables, got a mapping"
    )


@pytest.mark.parametrize(
    ("database", "table", "message"),
    [
        ("receiver", '"nsb.SubscriptionRouting', "invalid postgresql table address: unbalanced"),
        ("edge", "a@b@c@d", "invalid sqlite table address: too many '@'-separated parts"),
    ],
)
def test_a_subscription_table_must_parse_in_its_own_databases_grammar(
    database: str, table: str, message: str
) -> None:
    raw = document(subscription_tables=[{"database": database, "table": table}])
    assert the_error(raw).startswith(f"subscription_tables[0].table: {message}")


def test_a_subscription_table_is_read_in_its_databases_grammar_not_the_forwarders() -> None:
    # A plain PostgreSQL table name, though the sqlite forwarder would read it as SQL Server
    # form with too many parts.
    raw = document(subscription_tables=[{"database": "receiver", "table": "a@b@c@d"}])
    assert problems(raw) == []


def test_the_same_subscription_table_twice_is_a_warning() -> None:
    raw = document(
        subscription_tables=[
            {"database": "receiver"},
            {"database": "receiver", "table": "public.SubscriptionRouting"},
        ]
    )
    assert the_warning(raw) == (
        "subscription_tables[1].table: warning: subscription_tables[0] already names this table "
        "in database 'receiver'; it is read once"
    )


def test_tables_of_the_same_name_in_different_databases_or_schemas_are_fine() -> None:
    raw = document(
        subscription_tables=[
            {"database": "receiver"},
            {"database": "sender"},
            {"database": "receiver", "table": "nsb.SubscriptionRouting"},
        ]
    )
    assert problems(raw) == []


# --------------------------------------------------------------------------------------------
# Publish policy
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("no_subscribers", "erorr", "'erorr' is not one of drop, error (did you mean 'error'?)"),
        ("no_subscribers", "ignore", "'ignore' is not one of drop, error"),
        ("no_subscribers", True, "expected one of drop, error, got a boolean (true)"),
        ("cache", 0, "must be greater than 0s, got 0s"),
        ("cache", "0s", "must be greater than 0s, got 0s"),
        ("cache", "soon", "invalid duration 'soon'"),
        ("cache", -1, "invalid duration -1: must be a finite number"),
        ("expiry", "5s", "unknown key (expected one of: no_subscribers, cache)"),
    ],
)
def test_publish_key_rules(key: str, value: object, message: str) -> None:
    assert the_error(document(publish={key: value})).startswith(f"publish.{key}: {message}")


def test_a_publish_cache_above_a_minute_is_a_warning_that_subscriptions_are_seen_late() -> None:
    raw = document(publish={"cache": "2m"})
    assert the_warning(raw) == (
        "publish.cache: warning: 2m is more than the usual maximum 1m; new subscriptions would "
        "be seen late"
    )
    assert build(raw).publish.cache == 120.0


@pytest.mark.parametrize("cache", ["1ms", "5s", "1m"])
def test_a_publish_cache_up_to_a_minute_draws_no_warning(cache: str) -> None:
    assert problems(document(publish={"cache": cache})) == []


# --------------------------------------------------------------------------------------------
# All at once, never a traceback
# --------------------------------------------------------------------------------------------


def test_every_problem_of_the_publishing_sections_is_reported_at_once_with_its_path() -> None:
    raw = document(
        subscriptions={"Shared.OrderSubmitted, Shared": ["Samples.Billing", 3], TOPIC: []},
        subscription_tables=[{"database": "recever"}],
        publish={"no_subscribers": "keep", "cache": 0},
    )
    assert [line.split(": ")[0] for line in errors(raw)] == [
        'subscriptions["Shared.OrderSubmitted, Shared"]',
        'subscriptions["Shared.OrderSubmitted, Shared"][1]',
        'subscriptions["Shared.OrderSubmitted"]',
        "publish.no_subscribers",
        "publish.cache",
        "subscription_tables[0].database",
    ]


_GARBAGE: list[object] = [None, True, 0, 1.5, "", "x" * 500, [], [None], [[1]], {}, {1: 2}]


@pytest.mark.parametrize(
    "place",
    [
        lambda v: {"subscriptions": v},
        lambda v: {"subscriptions": {TOPIC: v}},
        lambda v: {"subscriptions": {TOPIC: [v]}},
        lambda v: {"subscriptions": {v if isinstance(v, str | int) else "x": ["Samples.B"]}},
        lambda v: {"subscription_tables": v},
        lambda v: {"subscription_tables": [v]},
        lambda v: {"subscription_tables": [{"database": v}]},
        lambda v: {"subscription_tables": [{"database": "edge", "table": v}]},
        lambda v: {"publish": v},
        lambda v: {"publish": {"cache": v}},
        lambda v: {"publish": {"no_subscribers": v}},
    ],
)
def test_validation_never_raises_whatever_the_publishing_sections_hold(place: Any) -> None:
    for value in _GARBAGE:
        config, found = validate(document(**place(value)), ENV)
        assert (config is None) == any(p.severity == "error" for p in found)


# --------------------------------------------------------------------------------------------
# The reference documents it from the same declaration
# --------------------------------------------------------------------------------------------


def test_the_reference_documents_topics_and_their_subscriber_lists() -> None:
    markdown = render_reference_markdown()
    assert "### `subscriptions.<topic>`" in markdown
    assert "| `<topic>` | type full name | — |" in markdown
    assert "| `<topic>[]` | non-empty list; each a queue address | — |" in markdown
    assert SUBSCRIPTIONS.items is not None
    assert "a list even for one" in SUBSCRIPTIONS.items.description


@pytest.mark.parametrize(
    "row",
    [
        "| `table` | queue address | `SubscriptionRouting` |",
        "| `no_subscribers` | one of `drop`, `error` | `drop` |",
        "| `cache` | duration > 0 | `5s` |",
    ],
)
def test_the_reference_shows_the_publishing_keys_with_their_defaults(row: str) -> None:
    assert row in render_reference_markdown()


def test_the_multimap_examples_in_the_schema_are_valid() -> None:
    assert SUBSCRIPTIONS.name_key is not None and SUBSCRIPTIONS.items is not None
    topic, address = SUBSCRIPTIONS.name_key.example, SUBSCRIPTIONS.items.example
    assert problems(document(subscriptions={topic: [address]})) == []


def test_an_absent_subscriptions_section_is_built_read_only_too() -> None:
    assert isinstance(build(document()).subscriptions, types.MappingProxyType)
