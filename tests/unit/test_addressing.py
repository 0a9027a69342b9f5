"""Specification of the queue address grammars (bridge.addressing)."""

from __future__ import annotations

import dataclasses

import pytest

from bridge.addressing import AddressGrammar, TableAddress
from bridge.dialects.postgresql import GRAMMAR as POSTGRESQL
from bridge.dialects.registry import dialects, grammar_for
from bridge.dialects.sqlite import GRAMMAR as SQLITE
from bridge.dialects.sqlserver import GRAMMAR as SQLSERVER
from bridge.exceptions import AddressError

GRAMMARS = {name: dialect.grammar for name, dialect in dialects().items()}

QA = TableAddress

# --------------------------------------------------------------------------------------------
# Shared API
# --------------------------------------------------------------------------------------------


def test_queue_address_is_frozen_and_defaults_schema_and_catalog_to_none() -> None:
    address = QA("Sales")
    assert address == QA("Sales", None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        address.table = "Other"  # type: ignore[misc]


def test_address_error_is_a_value_error() -> None:
    assert issubclass(AddressError, ValueError)


def test_grammars_are_keyed_by_their_dialect() -> None:
    assert GRAMMARS == {"postgresql": POSTGRESQL, "sqlserver": SQLSERVER, "sqlite": SQLITE}
    for dialect, grammar in GRAMMARS.items():
        assert grammar.dialect == dialect


@pytest.mark.parametrize("dialect", ["postgresql", "sqlserver", "sqlite"])
def test_grammar_for_returns_the_grammar_of_a_known_dialect(dialect: str) -> None:
    assert grammar_for(dialect) is GRAMMARS[dialect]


@pytest.mark.parametrize("dialect", ["mysql", "", "PostgreSQL", "sql server"])
def test_grammar_for_an_unknown_dialect_raises_key_error_naming_it_and_the_choices(
    dialect: str,
) -> None:
    with pytest.raises(KeyError) as info:
        grammar_for(dialect)
    message = str(info.value)
    assert repr(dialect) in message
    for known in ("postgresql", "sqlserver", "sqlite"):
        assert known in message


# --------------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("Sales", QA("Sales"), id="bare-table"),
        pytest.param('"Sales"', QA("Sales"), id="quoted-table"),
        pytest.param("Sales.Delayed", QA("Delayed", "Sales"), id="unquoted-dot-splits-schema"),
        pytest.param('"Samples.Receiver"', QA("Samples.Receiver"), id="quoted-dot-is-table"),
        pytest.param(
            '"public"."Samples.Receiver"',
            QA("Samples.Receiver", "public"),
            id="quoted-schema-and-dotted-table",
        ),
        pytest.param('"my.schema".q', QA("q", "my.schema"), id="dot-inside-quoted-schema"),
        pytest.param("a.b.c", QA("b.c", "a"), id="only-the-first-dot-splits"),
        pytest.param('a."b.c"', QA("b.c", "a"), id="bare-schema-quoted-table"),
        pytest.param('"a".b', QA("b", "a"), id="quoted-schema-bare-table"),
        pytest.param('"say ""hi"""', QA('say "hi"'), id="doubled-quotes-unescape"),
        pytest.param('""""', QA('"'), id="table-that-is-one-quote"),
        pytest.param('"a"".b"', QA('a".b'), id="dot-after-escaped-quote-stays-quoted"),
        pytest.param('"sch""ema"."t"', QA("t", 'sch"ema'), id="escaped-quote-in-schema"),
        pytest.param("My Queue", QA("My Queue"), id="spaces-kept"),
        pytest.param(" Sales . Delayed ", QA(" Delayed ", " Sales "), id="spaces-not-trimmed"),
        pytest.param("Verkäufe.Größe", QA("Größe", "Verkäufe"), id="unicode"),
        pytest.param('"日本"."キュー"', QA("キュー", "日本"), id="unicode-quoted"),
        pytest.param("Sales@[dbo]", QA("Sales@[dbo]"), id="sqlserver-form-is-just-a-name"),
        pytest.param("[dbo].[Sales]", QA("[Sales]", "[dbo]"), id="brackets-are-not-quotes"),
        pytest.param(
            '"x""; DROP TABLE y --"', QA('x"; DROP TABLE y --'), id="injection-stays-one-name"
        ),
    ],
)
def test_postgresql_parse(text: str, expected: TableAddress) -> None:
    assert POSTGRESQL.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("", "empty table", id="empty"),
        pytest.param("   ", "empty table", id="blank"),
        pytest.param('""', "empty table", id="empty-quoted"),
        pytest.param('"  "', "empty table", id="blank-quoted"),
        pytest.param("Sales.", "empty table", id="empty-table-after-dot"),
        pytest.param('Sales.""', "empty table", id="empty-quoted-table-after-dot"),
        pytest.param(".Sales", "empty schema", id="empty-schema-before-dot"),
        pytest.param('"".Sales', "empty schema", id="empty-quoted-schema"),
        pytest.param(".", "empty", id="lone-dot"),
        pytest.param('"Sales', "unbalanced double quotes", id="unterminated-quote"),
        pytest.param('Sales"', "unbalanced double quotes", id="stray-trailing-quote"),
        pytest.param('"a"."b', "unbalanced double quotes", id="unterminated-quoted-table"),
        pytest.param('"a"b"', "unbalanced double quotes", id="odd-quotes"),
        pytest.param('ab"c"', "contains a double quote", id="quote-inside-unquoted-name"),
        pytest.param('a.b"c"', "contains a double quote", id="quote-inside-unquoted-table"),
        pytest.param('"a"b"c"', "after the closing double quote", id="junk-after-quote"),
        pytest.param('"a" .b', "after the closing double quote", id="space-after-quoted-schema"),
        pytest.param('"a".b."c"', "contains a double quote", id="quoted-part-after-second-dot"),
        pytest.param('a."b".c', "after the closing double quote", id="junk-after-quoted-table"),
        pytest.param("Sa\x00les", "NUL", id="nul-in-table"),
        pytest.param("s\x00.t", "NUL", id="nul-in-schema"),
    ],
)
def test_postgresql_parse_rejects_malformed_addresses_naming_the_offending_text(
    text: str, fragment: str
) -> None:
    with pytest.raises(AddressError) as info:
        POSTGRESQL.parse(text)
    message = str(info.value)
    assert fragment in message
    assert repr(text) in message


@pytest.mark.parametrize(
    ("table", "accepted"),
    [
        pytest.param("a" * 55, True, id="55-ascii-bytes-accepted"),
        pytest.param("a" * 56, False, id="56-ascii-bytes-rejected"),
        pytest.param("é" * 27 + "a", True, id="27-two-byte-chars-plus-1-is-55-bytes"),
        pytest.param("é" * 28, False, id="28-two-byte-chars-is-56-bytes"),
        pytest.param("日" * 18 + "a", True, id="18-three-byte-chars-plus-1-is-55-bytes"),
        pytest.param("日" * 19, False, id="19-three-byte-chars-is-57-bytes"),
        pytest.param("😀" * 13 + "abc", True, id="13-four-byte-chars-plus-3-is-55-bytes"),
        pytest.param("😀" * 14, False, id="14-four-byte-chars-is-56-bytes"),
        pytest.param('"' * 55, True, id="55-quotes-counted-unescaped"),
    ],
)
def test_postgresql_table_names_are_limited_to_55_utf8_bytes(table: str, accepted: bool) -> None:
    for text in (POSTGRESQL.quote_identifier(table), "s." + POSTGRESQL.quote_identifier(table)):
        if accepted:
            assert POSTGRESQL.parse(text).table == table
        else:
            with pytest.raises(AddressError) as info:
                POSTGRESQL.parse(text)
            assert "55" in str(info.value)
            assert repr(table) in str(info.value)


def test_postgresql_table_limit_counts_bytes_not_characters() -> None:
    table = "é" * 28
    assert len(table) == 28
    with pytest.raises(AddressError, match="56 bytes"):
        POSTGRESQL.parse(table)


def test_postgresql_table_limit_applies_to_hand_built_addresses_too() -> None:
    address = QA("a" * 56, "public")
    with pytest.raises(AddressError):
        POSTGRESQL.render(address)
    with pytest.raises(AddressError):
        POSTGRESQL.qualified_name(address)
    with pytest.raises(AddressError):
        POSTGRESQL.resolve(QA("a" * 56), None, None)


def test_postgresql_schema_names_over_63_bytes_are_rejected_rather_than_truncated() -> None:
    assert POSTGRESQL.parse("a" * 63 + ".t") == QA("t", "a" * 63)
    with pytest.raises(AddressError, match="63"):
        POSTGRESQL.parse("a" * 64 + ".t")
    with pytest.raises(AddressError, match="63"):
        POSTGRESQL.resolve(QA("t"), "é" * 32, None)


# Every form of address NServiceBus writes (its TableAddress and CanonicalQueueAddress, in
# src/NServiceBus.Transport.SqlServer/Addressing/ of the transport's repository): the table
# raw, schema and catalog each bracket-quoted with `]` doubled, a catalog without a schema as
# `@[]@[catalog]`, and the canonical `table@[schema]@[catalog]` that transports from 7.0 write
# in headers (with the endpoint's own catalog, and `dbo` when no schema is configured).
NSERVICEBUS_FORMS = [
    pytest.param("Samples.Receiver", QA("Samples.Receiver"), id="table-only-v1-v2"),
    pytest.param("Samples.Receiver@[dbo]", QA("Samples.Receiver", "dbo"), id="with-schema"),
    pytest.param(
        "Samples.Receiver@[dbo]@[SenderDb]",
        QA("Samples.Receiver", "dbo", "SenderDb"),
        id="canonical-with-the-senders-catalog",
    ),
    pytest.param(
        "Samples.Receiver@[]@[ReceiverDb]",
        QA("Samples.Receiver", None, "ReceiverDb"),
        id="catalog-without-schema",
    ),
    pytest.param("my.table@[my]]schema]", QA("my.table", "my]schema"), id="schema-escaped"),
    pytest.param(
        "my.table@[my]]schema]@[my]]catalog]",
        QA("my.table", "my]schema", "my]catalog"),
        id="schema-and-catalog-escaped",
    ),
    pytest.param(
        "my.tb[e@[my.[sch@ma]@[my.c@ta]]og]",
        QA("my.tb[e", "my.[sch@ma", "my.c@ta]og"),
        id="transport-canonical-example",
    ),
    pytest.param("my table@[my schema]", QA("my table", "my schema"), id="spaces"),
    pytest.param("my]table@[dbo]@[nsb]", QA("my]table", "dbo", "nsb"), id="raw-table-bracket"),
    pytest.param("Sales.Delayed@[dbo]@[nsb]", QA("Sales.Delayed", "dbo", "nsb"), id="delayed"),
]


@pytest.mark.parametrize(("text", "expected"), NSERVICEBUS_FORMS)
def test_sqlserver_reads_every_form_nservicebus_writes(text: str, expected: TableAddress) -> None:
    assert SQLSERVER.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("Samples.Receiver", "Samples.Receiver@[dbo]@[nsb]"),
        ("Samples.Receiver@[dbo]", "Samples.Receiver@[dbo]@[nsb]"),
        ("Samples.Receiver@[dbo]@[SenderDb]", "Samples.Receiver@[dbo]@[SenderDb]"),
        ("Samples.Receiver@[]@[ReceiverDb]", "Samples.Receiver@[dbo]@[ReceiverDb]"),
        ("Samples.Receiver@sales", "Samples.Receiver@[sales]@[nsb]"),
        ("my.table@[my]]schema]", "my.table@[my]]schema]@[nsb]"),
        ("my.tb[e@[my.[sch@ma]@[my.c@ta]]og]", "my.tb[e@[my.[sch@ma]@[my.c@ta]]og]"),
    ],
)
def test_sqlserver_writes_the_canonical_form_as_nservicebus_writes_it(
    text: str, canonical: str
) -> None:
    # The transport fills in `dbo` and its connection's catalog (here `nsb`), then writes
    # `table@[schema]@[catalog]`; a canonical address comes back unchanged.
    resolved = SQLSERVER.resolve(SQLSERVER.parse(text), None, "nsb")
    assert SQLSERVER.render(resolved) == canonical
    assert SQLSERVER.render(SQLSERVER.parse(canonical)) == canonical


@pytest.mark.parametrize(
    ("address", "default_schema", "default_catalog", "expected"),
    [
        pytest.param(QA("t"), None, None, QA("t", "public"), id="falls-back-to-public"),
        pytest.param(QA("t"), "sales", None, QA("t", "sales"), id="default-schema-used"),
        pytest.param(QA("t", "own"), "sales", None, QA("t", "own"), id="explicit-schema-wins"),
        pytest.param(QA("t", ""), "sales", None, QA("t", "sales"), id="empty-schema-is-unset"),
        pytest.param(QA("t"), "", None, QA("t", "public"), id="empty-default-is-unset"),
        pytest.param(QA("t", "s", "db"), None, "db2", QA("t", "s"), id="catalog-always-dropped"),
        pytest.param(QA("t"), None, "db", QA("t", "public"), id="default-catalog-ignored"),
    ],
)
def test_postgresql_resolve(
    address: TableAddress,
    default_schema: str | None,
    default_catalog: str | None,
    expected: TableAddress,
) -> None:
    assert POSTGRESQL.resolve(address, default_schema, default_catalog) == expected


@pytest.mark.parametrize(
    ("address", "rendered"),
    [
        pytest.param(QA("Sales", "public"), '"public"."Sales"', id="plain"),
        pytest.param(QA("Sales"), '"public"."Sales"', id="no-schema-renders-as-public"),
        pytest.param(QA("Sales", ""), '"public"."Sales"', id="empty-schema-renders-as-public"),
        pytest.param(QA("Samples.Receiver", "public"), '"public"."Samples.Receiver"', id="dot"),
        pytest.param(QA('say "hi"', 'my"s'), '"my""s"."say ""hi"""', id="quotes-doubled"),
        pytest.param(QA("My Queue", "s"), '"s"."My Queue"', id="spaces"),
        pytest.param(QA("Größe", "Verkäufe"), '"Verkäufe"."Größe"', id="unicode"),
        pytest.param(QA("t", "s", "db"), '"s"."t"', id="catalog-not-rendered"),
        pytest.param(
            QA('x"; DROP TABLE y --', "s"), '"s"."x""; DROP TABLE y --"', id="injection-quoted"
        ),
    ],
)
def test_postgresql_render_and_qualified_name_are_the_quoted_two_part_name(
    address: TableAddress, rendered: str
) -> None:
    assert POSTGRESQL.render(address) == rendered
    assert POSTGRESQL.qualified_name(address) == rendered


@pytest.mark.parametrize(
    ("name", "quoted"),
    [
        ("Sales", '"Sales"'),
        ("", '""'),
        ('"', '""""'),
        ('a"b', '"a""b"'),
        ("a.b", '"a.b"'),
        ("x]; DROP TABLE y --", '"x]; DROP TABLE y --"'),
    ],
)
def test_postgresql_quote_identifier_wraps_in_double_quotes_and_doubles_them(
    name: str, quoted: str
) -> None:
    assert POSTGRESQL.quote_identifier(name) == quoted


@pytest.mark.parametrize(
    "address",
    [QA(""), QA("   "), QA("a\x00b", "s"), QA("t", "s\x00")],
    ids=["empty", "blank", "nul-in-table", "nul-in-schema"],
)
def test_postgresql_refuses_to_render_or_resolve_invalid_hand_built_addresses(
    address: TableAddress,
) -> None:
    for operation in (POSTGRESQL.render, POSTGRESQL.qualified_name):
        with pytest.raises(AddressError):
            operation(address)
    with pytest.raises(AddressError):
        POSTGRESQL.resolve(address, None, None)


# --------------------------------------------------------------------------------------------
# SQL Server
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("Sales", QA("Sales"), id="bare-table"),
        pytest.param("Sales@[dbo]@[nsb]", QA("Sales", "dbo", "nsb"), id="canonical"),
        pytest.param("Sales@dbo@nsb", QA("Sales", "dbo", "nsb"), id="bare-parts"),
        pytest.param("Sales@[dbo]", QA("Sales", "dbo"), id="schema-only"),
        pytest.param("Sales@dbo", QA("Sales", "dbo"), id="bare-schema-only"),
        pytest.param("Sales@", QA("Sales"), id="trailing-at-is-table-only"),
        pytest.param("Sales@[]", QA("Sales"), id="empty-brackets-schema"),
        pytest.param("Sales@[]@[]", QA("Sales"), id="both-empty-brackets"),
        pytest.param("Sales@@", QA("Sales"), id="both-empty-bare"),
        pytest.param("Sales@[dbo]@", QA("Sales", "dbo"), id="trailing-at-after-schema"),
        pytest.param("Sales@[]@[nsb]", QA("Sales", None, "nsb"), id="catalog-without-schema"),
        pytest.param("Sales@@nsb", QA("Sales", None, "nsb"), id="catalog-without-bare-schema"),
        pytest.param("q@[sch@ema]@[cat]", QA("q", "sch@ema", "cat"), id="at-inside-brackets"),
        pytest.param("q@[s]@[c@t@x]", QA("q", "s", "c@t@x"), id="ats-inside-catalog"),
        pytest.param("q@[@]@[@@]", QA("q", "@", "@@"), id="only-ats-in-brackets"),
        pytest.param("q@[my]]schema]", QA("q", "my]schema"), id="escaped-bracket"),
        pytest.param("q@[a]]]", QA("q", "a]"), id="escaped-bracket-at-end"),
        pytest.param("q@[]]]]]", QA("q", "]]"), id="only-escaped-brackets"),
        pytest.param("q@[a]]@b]@c", QA("q", "a]@b", "c"), id="at-after-escaped-bracket"),
        pytest.param("q@[[x]", QA("q", "[x"), id="open-bracket-inside-brackets"),
        pytest.param("[a@b]@[dbo]", QA("[a", "b]", "dbo"), id="brackets-do-not-protect-table-at"),
        pytest.param("q@[dbo]]]", QA("q", "dbo]"), id="escaped-bracket-before-close"),
        pytest.param("q@[]]]@[]]]", QA("q", "]", "]"), id="lone-escaped-bracket-parts"),
        pytest.param("q@[]@", QA("q"), id="empty-schema-then-trailing-at"),
        pytest.param("q@@[nsb]", QA("q", None, "nsb"), id="empty-bare-schema-bracketed-catalog"),
        pytest.param("q@[]@nsb", QA("q", None, "nsb"), id="empty-bracketed-schema-bare-catalog"),
        pytest.param("q@[a]]b]]]@[c]", QA("q", "a]b]", "c"), id="escapes-everywhere"),
        pytest.param("q@[ ]@[ ]", QA("q", " ", " "), id="blank-bracketed-parts-are-names"),
        pytest.param("q@d]bo", QA("q", "d]bo"), id="bare-part-keeps-close-bracket"),
        pytest.param("q@d[bo", QA("q", "d[bo"), id="bare-part-keeps-open-bracket"),
        pytest.param("[Sales]@[dbo]", QA("Sales", "dbo"), id="bracketed-table-is-unquoted"),
        pytest.param("[Sales]", QA("Sales"), id="bracketed-table-alone"),
        pytest.param("[my]]table]@[dbo]", QA("my]table", "dbo"), id="bracketed-table-escapes"),
        pytest.param("[[t]]]", QA("[t]"), id="bracketed-table-holding-brackets"),
        pytest.param("[a]b]@[dbo]", QA("[a]b]", "dbo"), id="lone-bracket-table-stays-raw"),
        pytest.param("[Sales", QA("[Sales"), id="half-bracketed-table-stays-raw"),
        pytest.param("Sales]", QA("Sales]"), id="close-bracket-only-table-stays-raw"),
        pytest.param("my]table", QA("my]table"), id="table-with-close-bracket"),
        pytest.param("my]table@[dbo]", QA("my]table", "dbo"), id="table-bracket-with-schema"),
        pytest.param("Samples.Receiver", QA("Samples.Receiver"), id="dots-in-table"),
        pytest.param("a.b@[c.d]@[e.f]", QA("a.b", "c.d", "e.f"), id="dots-everywhere"),
        pytest.param("My Queue@[my schema]@[my db]", QA("My Queue", "my schema", "my db"), id="sp"),
        pytest.param(" q @ dbo ", QA(" q ", " dbo "), id="spaces-not-trimmed"),
        pytest.param("q@[ ]", QA("q", " "), id="bracketed-space-is-a-name"),
        pytest.param("Größe@[Verkäufe]@[日本]", QA("Größe", "Verkäufe", "日本"), id="unicode"),
        pytest.param('"q"@["s"]', QA('"q"', '"s"'), id="double-quotes-are-plain-chars"),
        pytest.param(
            "x]; DROP TABLE y --", QA("x]; DROP TABLE y --"), id="injection-table-is-one-name"
        ),
        pytest.param(
            "q@[x]]; DROP TABLE y --]",
            QA("q", "x]; DROP TABLE y --"),
            id="injection-schema-is-one-name",
        ),
    ],
)
def test_sqlserver_parse(text: str, expected: TableAddress) -> None:
    assert SQLSERVER.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("", "empty table", id="empty"),
        pytest.param("   ", "empty table", id="blank"),
        pytest.param("@[dbo]", "empty table", id="empty-table-with-schema"),
        pytest.param("@", "empty table", id="lone-at"),
        pytest.param(" @dbo", "empty table", id="blank-table-with-schema"),
        pytest.param("t@[abc", "unterminated '['", id="unterminated-schema"),
        pytest.param("t@[abc]]", "unterminated '['", id="escaped-bracket-is-not-a-close"),
        pytest.param("t@[a]]@b", "unterminated '['", id="even-brackets-before-at"),
        pytest.param("t@[", "unterminated '['", id="lone-open-bracket"),
        pytest.param("t@[s]@[c", "unterminated '['", id="unterminated-catalog"),
        pytest.param("[]@[dbo]", "empty table", id="empty-bracketed-table"),
        pytest.param("[ ]", "empty table", id="blank-bracketed-table"),
        pytest.param("t@[a]b@c", "after the closing ']'", id="junk-after-schema-bracket"),
        pytest.param("t@[a]b", "after the closing ']'", id="junk-at-end"),
        pytest.param("t@[s]@[c]x", "after the closing ']'", id="junk-after-catalog-bracket"),
        pytest.param("t@[a] @c", "after the closing ']'", id="space-after-bracket"),
        pytest.param("a@b@c@d", "too many", id="four-parts"),
        pytest.param("a@b@c@", "too many", id="trailing-at-after-catalog"),
        pytest.param("a@[b]@[c]@[d]", "too many", id="four-bracketed-parts"),
        pytest.param("a@@@", "too many", id="four-empty-parts"),
        pytest.param("t\x00@dbo", "NUL", id="nul-in-table"),
        pytest.param("t@[d\x00bo]", "NUL", id="nul-in-schema"),
        pytest.param("t@dbo@n\x00sb", "NUL", id="nul-in-catalog"),
    ],
)
def test_sqlserver_parse_rejects_malformed_addresses_naming_the_offending_text(
    text: str, fragment: str
) -> None:
    with pytest.raises(AddressError) as info:
        SQLSERVER.parse(text)
    message = str(info.value)
    assert fragment in message
    assert repr(text) in message


def test_sqlserver_parse_names_the_part_that_is_malformed() -> None:
    with pytest.raises(AddressError, match="schema"):
        SQLSERVER.parse("t@[abc")
    with pytest.raises(AddressError, match="catalog"):
        SQLSERVER.parse("t@[s]@[c")
    with pytest.raises(AddressError, match="'b'"):
        SQLSERVER.parse("t@[a]b@c")


@pytest.mark.parametrize(
    ("address", "default_schema", "default_catalog", "expected"),
    [
        pytest.param(QA("t"), None, None, QA("t", "dbo"), id="falls-back-to-dbo"),
        pytest.param(QA("t"), "sales", None, QA("t", "sales"), id="default-schema-used"),
        pytest.param(QA("t", "own"), "sales", None, QA("t", "own"), id="explicit-schema-wins"),
        pytest.param(QA("t", ""), None, None, QA("t", "dbo"), id="empty-schema-is-unset"),
        pytest.param(QA("t"), "", None, QA("t", "dbo"), id="empty-default-schema-is-unset"),
        pytest.param(QA("t"), None, "db", QA("t", "dbo", "db"), id="default-catalog-used"),
        pytest.param(QA("t", None, "own"), None, "db", QA("t", "dbo", "own"), id="catalog-wins"),
        pytest.param(QA("t", None, ""), None, "db", QA("t", "dbo", "db"), id="empty-catalog"),
        pytest.param(QA("t"), None, "", QA("t", "dbo"), id="empty-default-catalog-stays-none"),
        pytest.param(QA("t", "s", "c"), "x", "y", QA("t", "s", "c"), id="fully-qualified-kept"),
    ],
)
def test_sqlserver_resolve(
    address: TableAddress,
    default_schema: str | None,
    default_catalog: str | None,
    expected: TableAddress,
) -> None:
    assert SQLSERVER.resolve(address, default_schema, default_catalog) == expected


@pytest.mark.parametrize(
    ("address", "rendered"),
    [
        pytest.param(QA("Sales", "dbo", "nsb"), "Sales@[dbo]@[nsb]", id="canonical"),
        pytest.param(QA("Sales", "dbo"), "Sales@[dbo]", id="no-catalog-part"),
        pytest.param(QA("Sales"), "Sales@[dbo]", id="no-schema-renders-as-dbo"),
        pytest.param(QA("Sales", None, "nsb"), "Sales@[dbo]@[nsb]", id="catalog-without-schema"),
        pytest.param(QA("Sales", "dbo", ""), "Sales@[dbo]", id="empty-catalog-omitted"),
        pytest.param(QA("q", "sch@ema", "c@t"), "q@[sch@ema]@[c@t]", id="ats-bracketed"),
        pytest.param(QA("q", "my]schema"), "q@[my]]schema]", id="close-bracket-doubled"),
        pytest.param(QA("my]table", "dbo"), "my]table@[dbo]", id="table-stays-raw"),
        pytest.param(QA("[t]", "[s]"), "[[t]]]@[[s]]]", id="bracketed-table-quoted-to-read-back"),
        pytest.param(QA("[t", "s"), "[t@[s]", id="half-bracketed-table-stays-raw"),
        pytest.param(QA("[a]b]", "s"), "[a]b]@[s]", id="lone-bracket-table-stays-raw"),
        pytest.param(QA("My Queue", "my schema"), "My Queue@[my schema]", id="spaces"),
        pytest.param(QA("a.b", "c.d", "e.f"), "a.b@[c.d]@[e.f]", id="dots"),
        pytest.param(QA("Größe", "Verkäufe"), "Größe@[Verkäufe]", id="unicode"),
        pytest.param(
            QA("q", "x]; DROP TABLE y --"), "q@[x]]; DROP TABLE y --]", id="injection-escaped"
        ),
    ],
)
def test_sqlserver_render_is_raw_table_then_bracketed_schema_and_catalog(
    address: TableAddress, rendered: str
) -> None:
    assert SQLSERVER.render(address) == rendered


@pytest.mark.parametrize(
    ("address", "qualified"),
    [
        pytest.param(QA("Sales", "dbo"), "[dbo].[Sales]", id="two-part"),
        pytest.param(QA("Sales"), "[dbo].[Sales]", id="no-schema-is-dbo"),
        pytest.param(QA("Sales", "dbo", "nsb"), "[nsb].[dbo].[Sales]", id="three-part"),
        pytest.param(QA("Sales", None, "nsb"), "[nsb].[dbo].[Sales]", id="catalog-no-schema"),
        pytest.param(QA("Sales", "dbo", ""), "[dbo].[Sales]", id="empty-catalog-two-part"),
        pytest.param(QA("my]table", "dbo"), "[dbo].[my]]table]", id="table-bracket-escaped"),
        pytest.param(QA("t", "[my]]schema]"), "[[my]]]]schema]]].[t]", id="bracketed-schema"),
        pytest.param(QA("a.b", "c.d", "e.f"), "[e.f].[c.d].[a.b]", id="dots-stay-inside"),
        pytest.param(QA('say "hi"', "s"), '[s].[say "hi"]', id="double-quotes-untouched"),
        pytest.param(
            QA("x]; DROP TABLE y --", "dbo"),
            "[dbo].[x]]; DROP TABLE y --]",
            id="injection-stays-one-name",
        ),
    ],
)
def test_sqlserver_qualified_name_brackets_every_part(
    address: TableAddress, qualified: str
) -> None:
    assert SQLSERVER.qualified_name(address) == qualified


@pytest.mark.parametrize(
    ("name", "quoted"),
    [
        ("Sales", "[Sales]"),
        ("", "[]"),
        ("]", "[]]]"),
        ("[", "[[]"),
        ("my]table", "[my]]table]"),
        ("x]; DROP TABLE y --", "[x]]; DROP TABLE y --]"),
        ('a"b', '[a"b]'),
    ],
)
def test_sqlserver_quote_identifier_wraps_in_brackets_and_doubles_closing_ones(
    name: str, quoted: str
) -> None:
    assert SQLSERVER.quote_identifier(name) == quoted


@pytest.mark.parametrize(
    "address",
    [
        QA(""),
        QA("  ", "dbo"),
        QA("a@b", "dbo"),
        QA("t\x00"),
        QA("t", "s\x00"),
        QA("t", "s", "\x00"),
    ],
    ids=["empty", "blank", "at-in-table", "nul-in-table", "nul-in-schema", "nul-in-catalog"],
)
def test_sqlserver_refuses_to_render_or_resolve_addresses_it_could_not_read_back(
    address: TableAddress,
) -> None:
    for operation in (SQLSERVER.render, SQLSERVER.qualified_name):
        with pytest.raises(AddressError):
            operation(address)
    with pytest.raises(AddressError):
        SQLSERVER.resolve(address, None, None)


def test_sqlserver_injection_through_the_table_cannot_escape_the_quoted_name() -> None:
    address = SQLSERVER.resolve(SQLSERVER.parse("x]; DROP TABLE y --"), None, "nsb")
    qualified = SQLSERVER.qualified_name(address)
    assert qualified == "[nsb].[dbo].[x]]; DROP TABLE y --]"
    # Removing every escaped pair must leave only the three delimiters of each part.
    assert qualified.replace("]]", "").count("]") == 3


# --------------------------------------------------------------------------------------------
# SQLite
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("Sales", QA("Sales"), id="bare-table"),
        pytest.param("Samples.Receiver", QA("Samples.Receiver"), id="dot-is-part-of-the-name"),
        pytest.param('"Sales"', QA('"Sales"'), id="double-quotes-are-part-of-the-name"),
        pytest.param("[Sales]", QA("[Sales]"), id="brackets-are-part-of-the-name"),
        pytest.param("My Queue", QA("My Queue"), id="spaces"),
        pytest.param(" Sales ", QA(" Sales "), id="spaces-not-trimmed"),
        pytest.param("Größe 日本", QA("Größe 日本"), id="unicode"),
        pytest.param("x]; DROP TABLE y --", QA("x]; DROP TABLE y --"), id="injection-is-a-name"),
        pytest.param("Sales@[dbo]@[nsb]", QA("Sales"), id="sqlserver-form-keeps-table"),
        pytest.param("Sales@dbo", QA("Sales"), id="sqlserver-bare-schema-dropped"),
        pytest.param("Sales@", QA("Sales"), id="sqlserver-trailing-at"),
        pytest.param("a.b@[c]", QA("a.b"), id="sqlserver-dotted-table"),
        pytest.param("q@[sch@ema]@[cat]", QA("q"), id="sqlserver-at-in-brackets"),
        pytest.param("q@[]@[nsb]", QA("q"), id="sqlserver-catalog-without-schema"),
        pytest.param("a" * 200, QA("a" * 200), id="no-length-limit"),
    ],
)
def test_sqlite_parse(text: str, expected: TableAddress) -> None:
    assert SQLITE.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("", "empty table", id="empty"),
        pytest.param("   ", "empty table", id="blank"),
        pytest.param("\t\n", "empty table", id="whitespace"),
        pytest.param("@[dbo]", "empty table", id="sqlserver-form-empty-table"),
        pytest.param("t@[abc", "unterminated '['", id="sqlserver-form-unterminated"),
        pytest.param("t@[a]b@c", "after the closing ']'", id="sqlserver-form-junk"),
        pytest.param("a@b@c@d", "too many", id="sqlserver-form-four-parts"),
        pytest.param("a\x00b", "NUL", id="nul"),
    ],
)
def test_sqlite_parse_rejects_malformed_addresses_naming_the_offending_text(
    text: str, fragment: str
) -> None:
    with pytest.raises(AddressError) as info:
        SQLITE.parse(text)
    message = str(info.value)
    assert fragment in message
    assert repr(text) in message


@pytest.mark.parametrize(
    ("address", "default_schema", "default_catalog"),
    [
        (QA("t"), None, None),
        (QA("t", "dbo"), None, None),
        (QA("t", "dbo", "nsb"), "s", "c"),
        (QA("t"), "main", "db"),
    ],
)
def test_sqlite_resolve_drops_schema_and_catalog(
    address: TableAddress, default_schema: str | None, default_catalog: str | None
) -> None:
    assert SQLITE.resolve(address, default_schema, default_catalog) == QA("t")


@pytest.mark.parametrize(
    ("address", "rendered", "qualified"),
    [
        pytest.param(QA("Sales"), "Sales", '"Sales"', id="plain"),
        pytest.param(QA("Sales", "dbo", "nsb"), "Sales", '"Sales"', id="schema-ignored"),
        pytest.param(QA("Samples.Receiver"), "Samples.Receiver", '"Samples.Receiver"', id="dot"),
        pytest.param(QA('say "hi"'), 'say "hi"', '"say ""hi"""', id="quotes-doubled"),
        pytest.param(QA("my]table"), "my]table", '"my]table"', id="bracket-untouched"),
        pytest.param(QA("Größe"), "Größe", '"Größe"', id="unicode"),
        pytest.param(
            QA('x"; DROP TABLE y --'),
            'x"; DROP TABLE y --',
            '"x""; DROP TABLE y --"',
            id="injection-stays-one-name",
        ),
    ],
)
def test_sqlite_render_is_the_table_and_qualified_name_double_quotes_it(
    address: TableAddress, rendered: str, qualified: str
) -> None:
    assert SQLITE.render(address) == rendered
    assert SQLITE.qualified_name(address) == qualified


def test_sqlite_quote_identifier_wraps_in_double_quotes_and_doubles_them() -> None:
    assert SQLITE.quote_identifier('a"b') == '"a""b"'
    assert SQLITE.quote_identifier("") == '""'
    assert SQLITE.quote_identifier("[x]") == '"[x]"'


@pytest.mark.parametrize(
    "address",
    [QA(""), QA(" "), QA("a@b"), QA("a\x00b")],
    ids=["empty", "blank", "at-would-read-back-as-sqlserver-form", "nul"],
)
def test_sqlite_refuses_to_render_or_resolve_addresses_it_could_not_read_back(
    address: TableAddress,
) -> None:
    for operation in (SQLITE.render, SQLITE.qualified_name):
        with pytest.raises(AddressError):
            operation(address)
    with pytest.raises(AddressError):
        SQLITE.resolve(address, None, None)


def test_sqlite_accepts_what_sqlserver_renders() -> None:
    rendered = SQLSERVER.render(QA("Sales.Orders", "my]schema", "n@sb"))
    assert SQLITE.parse(rendered) == QA("Sales.Orders")


# --------------------------------------------------------------------------------------------
# Unpaired surrogates: a .NET string may hold one (JSON `\ud800` decodes to it), but no
# database can store it, and UTF-8 cannot even encode it.
# --------------------------------------------------------------------------------------------

SURROGATE_ADDRESSES: list[tuple[AddressGrammar, str, str, str]] = [
    (POSTGRESQL, "Recei\ud800ver", "table", "Recei\ud800ver"),
    (POSTGRESQL, '"public"."Recei\udfffver"', "table", "Recei\udfffver"),
    (POSTGRESQL, "s\udc00.Receiver", "schema", "s\udc00"),
    (POSTGRESQL, '"s\ud800"."Receiver"', "schema", "s\ud800"),
    (SQLSERVER, "Recei\ud800ver", "table", "Recei\ud800ver"),
    (SQLSERVER, "Receiver@[s\ud800]", "schema", "s\ud800"),
    (SQLSERVER, "Receiver@dbo@c\udfff", "catalog", "c\udfff"),
    (SQLITE, "Recei\ud800ver", "table", "Recei\ud800ver"),
    (SQLITE, "Recei\ud800ver@[dbo]", "table", "Recei\ud800ver"),
]


@pytest.mark.parametrize(
    ("grammar", "text", "what", "name"),
    SURROGATE_ADDRESSES,
    ids=[f"{grammar.dialect}:{what}:{text!r}" for grammar, text, what, _ in SURROGATE_ADDRESSES],
)
def test_an_unpaired_surrogate_in_any_part_is_an_address_error_naming_the_part(
    grammar: AddressGrammar, text: str, what: str, name: str
) -> None:
    with pytest.raises(AddressError) as info:
        grammar.parse(text)
    message = str(info.value)
    surrogate = next(char for char in name if "\ud800" <= char <= "\udfff")
    escaped = repr(surrogate)[1:-1]  # \ud800, as Python and JSON write it
    assert (
        f"{what} name {name!r} contains an unpaired surrogate ({escaped}), "
        "which no database can store"
    ) in message
    assert repr(text) in message


def test_the_surrogate_message_can_be_written_to_a_utf8_log() -> None:
    with pytest.raises(AddressError) as info:
        POSTGRESQL.parse("Recei\ud800ver")
    assert str(info.value) == (
        "table name 'Recei\\ud800ver' contains an unpaired surrogate (\\ud800), which no "
        "database can store (address 'Recei\\ud800ver')"
    )
    str(info.value).encode("utf-8")


SURROGATE_HAND_BUILT: list[tuple[AddressGrammar, TableAddress]] = [
    (POSTGRESQL, QA("t\ud800")),
    (POSTGRESQL, QA("t", "s\ud800")),
    (SQLSERVER, QA("t\ud800")),
    (SQLSERVER, QA("t", "s\ud800")),
    (SQLSERVER, QA("t", "s", "c\ud800")),
    (SQLITE, QA("t\ud800")),
]


@pytest.mark.parametrize(
    ("grammar", "address"),
    SURROGATE_HAND_BUILT,
    ids=[f"{grammar.dialect}:{address}" for grammar, address in SURROGATE_HAND_BUILT],
)
def test_every_grammar_refuses_to_render_or_resolve_an_address_with_a_surrogate(
    grammar: AddressGrammar, address: TableAddress
) -> None:
    for operation in (grammar.render, grammar.qualified_name):
        with pytest.raises(AddressError, match="unpaired surrogate"):
            operation(address)
    with pytest.raises(AddressError, match="unpaired surrogate"):
        grammar.resolve(address, None, None)


@pytest.mark.parametrize("grammar", [POSTGRESQL, SQLSERVER, SQLITE], ids=lambda g: g.dialect)
def test_characters_beyond_the_basic_plane_are_not_surrogates(grammar: AddressGrammar) -> None:
    # json.loads joins an escaped pair (\ud83c\udf89) into the one character it encodes.
    assert grammar.parse("Party\U0001f389").table == "Party\U0001f389"


# --------------------------------------------------------------------------------------------
# Round trips: parse(render(resolve(x))) == resolve(x)
# --------------------------------------------------------------------------------------------

ROUND_TRIP_CASES: list[tuple[AddressGrammar, str]] = [
    (POSTGRESQL, "Sales"),
    (POSTGRESQL, "Sales.Delayed"),
    (POSTGRESQL, '"Samples.Receiver"'),
    (POSTGRESQL, '"public"."Samples.Receiver"'),
    (POSTGRESQL, '"my.schema"."a.b.c"'),
    (POSTGRESQL, "a.b.c"),
    (POSTGRESQL, '"say ""hi"""'),
    (POSTGRESQL, '"sch""ema"."t"'),
    (POSTGRESQL, '""""'),
    (POSTGRESQL, "My Queue"),
    (POSTGRESQL, "Verkäufe.Größe"),
    (POSTGRESQL, "é" * 27 + "a"),
    (POSTGRESQL, "[dbo].[Sales]"),
    (POSTGRESQL, "Sales@[dbo]"),
    (POSTGRESQL, "x]; DROP TABLE y --"),
    (POSTGRESQL, '"x""; DROP TABLE y --"'),
    (SQLSERVER, "Sales"),
    (SQLSERVER, "Sales@[dbo]@[nsb]"),
    (SQLSERVER, "Sales@dbo"),
    (SQLSERVER, "Sales@"),
    (SQLSERVER, "Sales@[]@[nsb]"),
    (SQLSERVER, "q@[sch@ema]@[cat]"),
    (SQLSERVER, "q@[@]@[@@]"),
    (SQLSERVER, "q@[my]]schema]"),
    (SQLSERVER, "q@[]]]]]"),
    (SQLSERVER, "q@[a]]@b]@c"),
    (SQLSERVER, "q@d]bo"),
    (SQLSERVER, "[Sales]@[[dbo]]]"),
    (SQLSERVER, "my]table"),
    (SQLSERVER, "a.b@[c.d]@[e.f]"),
    (SQLSERVER, "My Queue@[my schema]@[my db]"),
    (SQLSERVER, "Größe@[Verkäufe]@[日本]"),
    (SQLSERVER, '"q"@["s"]'),
    (SQLSERVER, "x]; DROP TABLE y --"),
    (SQLSERVER, "q@[x]]; DROP TABLE y --]"),
    (SQLITE, "Sales"),
    (SQLITE, "Samples.Receiver"),
    (SQLITE, '"Sales"'),
    (SQLITE, "[Sales]"),
    (SQLITE, "My Queue"),
    (SQLITE, "Größe 日本"),
    (SQLITE, "x]; DROP TABLE y --"),
    (SQLITE, "Sales@[dbo]@[nsb]"),
]

DEFAULTS: list[tuple[str | None, str | None]] = [
    (None, None),
    ("sales", None),
    (None, "nsb"),
    ("my]sch@ema", 'c"at'),
]


@pytest.mark.parametrize(("default_schema", "default_catalog"), DEFAULTS)
@pytest.mark.parametrize(
    ("grammar", "text"),
    ROUND_TRIP_CASES,
    ids=[f"{grammar.dialect}:{text}" for grammar, text in ROUND_TRIP_CASES],
)
def test_parse_of_rendered_resolved_address_gives_back_the_resolved_address(
    grammar: AddressGrammar,
    text: str,
    default_schema: str | None,
    default_catalog: str | None,
) -> None:
    resolved = grammar.resolve(grammar.parse(text), default_schema, default_catalog)
    assert grammar.parse(grammar.render(resolved)) == resolved


@pytest.mark.parametrize(
    ("grammar", "text"),
    ROUND_TRIP_CASES,
    ids=[f"{grammar.dialect}:{text}" for grammar, text in ROUND_TRIP_CASES],
)
def test_resolve_is_idempotent_and_render_output_is_stable(
    grammar: AddressGrammar, text: str
) -> None:
    resolved = grammar.resolve(grammar.parse(text), "s", "c")
    assert grammar.resolve(resolved, "other", "other") == resolved
    rendered = grammar.render(resolved)
    assert grammar.render(grammar.parse(rendered)) == rendered


@pytest.mark.parametrize(
    "text",
    ["Sales@[dbo]@[nsb]", "q@[sch@ema]@[c]]at]", "x]; DROP TABLE y --@[a b]", "t@[]@[db]"],
)
def test_sqlserver_canonical_addresses_render_back_to_the_same_text(text: str) -> None:
    assert SQLSERVER.render(SQLSERVER.parse(text)) == text.replace("@[]@", "@[dbo]@")


@pytest.mark.parametrize(
    "text",
    ['"public"."Sales"', '"my.schema"."Samples.Receiver"', '"s"."say ""hi"""'],
)
def test_postgresql_canonical_addresses_render_back_to_the_same_text(text: str) -> None:
    assert POSTGRESQL.render(POSTGRESQL.parse(text)) == text
