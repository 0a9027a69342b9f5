"""Specification of cutting the routing headers out of the Headers text
(bridge.headers.without_routing_headers_text): always exactly what parsing, dropping them and
serialising again gives, whichever way the text was written."""

from __future__ import annotations

import json
import random

import pytest

from bridge.headers import (
    ADDRESS_DATABASE_HEADER,
    DESTINATION_HEADER,
    EVENT_TYPE_HEADER,
    ROUTING_HEADERS,
    PoisonHeaders,
    is_serialized_form,
    parse_headers,
    serialize_headers,
    without_routing_headers,
    without_routing_headers_text,
)

# Characters that matter to JSON and to the length count: quotes, backslashes, control
# characters, non-ASCII (BMP and astral), a lone surrogate, and the separators themselves.
ALPHABET = [
    "a",
    "Z",
    "0",
    " ",
    '"',
    "\\",
    "/",
    "\n",
    "\t",
    "\x01",
    "\x7f",
    "é",
    "漢",
    "😀",
    "\ud800",
    ",",
    ":",
    "{",
    "}",
    "null",
    "\u2028",
]
HEADER_NAMES = [
    "NServiceBus.MessageId",
    "NServiceBus.ReplyToAddress",
    "a",
    "",
    "é",
    *ROUTING_HEADERS,
]


def random_value(rng: random.Random) -> str | None:
    if rng.random() < 0.15:
        return None
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 8)))


def random_text(rng: random.Random) -> str:
    """A Headers text written one of the ways endpoints and tools write JSON."""
    names = rng.sample(HEADER_NAMES, rng.randrange(0, len(HEADER_NAMES) + 1))
    if rng.random() < 0.3:
        names.append("plain")  # some texts have only plain values
    headers = {name: random_value(rng) for name in names}
    style = rng.randrange(5)
    if style == 0:
        return serialize_headers(headers)
    if style == 1:
        return json.dumps(headers)  # spaces after ':' and ','; non-ASCII escaped
    if style == 2:
        return json.dumps(headers, ensure_ascii=False, separators=(",", ":"))
    if style == 3:  # a key written twice: the parser keeps the last value
        text = serialize_headers(headers)
        if not headers:
            return text
        name = rng.choice(list(headers))
        extra = json.dumps(name, ensure_ascii=False) + ':"earlier"'
        return "{" + extra + ("," if len(text) > 2 else "") + text[1:]
    return " " + serialize_headers(headers) + "\n"


def expected(text: str) -> str:
    return serialize_headers(without_routing_headers(parse_headers(text)))


def test_random_texts_give_exactly_the_reserialised_headers() -> None:
    rng = random.Random(20261125)
    seen_fast = seen_slow = 0
    for _ in range(20_000):
        text = random_text(rng)
        try:
            headers = parse_headers(text)
        except ValueError:
            continue  # a lone surrogate written raw is not valid everywhere; not the point here
        assert without_routing_headers_text(text, headers) == expected(text), text
        fast = is_serialized_form(text, headers)
        # Recognised exactly when it is the serialized form, but for escaped strings, which
        # are never taken for it (they would need decoding to count).
        serialized = text == serialize_headers(headers)
        assert fast == (serialized and "\\" not in text), text
        seen_fast += fast
        seen_slow += not fast
    # Both ways were taken many times, so the comparison above covers each.
    assert seen_fast > 1500 and seen_slow > 3000


@pytest.mark.parametrize(
    "headers",
    [
        {DESTINATION_HEADER: "q"},
        {DESTINATION_HEADER: "q", "a": "1"},
        {"a": "1", DESTINATION_HEADER: "q"},
        {"a": "1", DESTINATION_HEADER: "q", "b": None},
        {EVENT_TYPE_HEADER: "E, A", DESTINATION_HEADER: "", ADDRESS_DATABASE_HEADER: None},
        {"a": None, EVENT_TYPE_HEADER: None, "b": "x"},
        # A routing header's text inside another header's value is not a member.
        {"a": f'"{DESTINATION_HEADER}":"q"', DESTINATION_HEADER: "q"},
        {"note": "x", DESTINATION_HEADER: "x"},
    ],
)
def test_each_routing_header_is_cut_with_its_comma(headers: dict[str, str | None]) -> None:
    text = serialize_headers(headers)
    assert is_serialized_form(text, parse_headers(text)) == ("\\" not in text)
    assert without_routing_headers_text(text, parse_headers(text)) == expected(text)


def test_the_serialized_form_is_recognised_for_transport_headers() -> None:
    text = (
        '{"NServiceBus.MessageId":"1","NServiceBus.ReplyToAddress":"Sender@[dbo]@[s]",'
        f'"NServiceBus.TimeSent":"2026-11-25 00:00:00:000000 Z","{DESTINATION_HEADER}":"r"}}'
    )
    headers = parse_headers(text)
    assert is_serialized_form(text, headers)
    assert without_routing_headers_text(text, headers) == text.replace(
        f',"{DESTINATION_HEADER}":"r"', ""
    )


@pytest.mark.parametrize(
    "text",
    [
        '{"a":"1", "b":"2"}',  # a space
        '{"a":"1","a":"1"}',  # a key twice, same value
        '{"a":"\\u0031"}',  # an escape the encoder would not write
        '{"a":"\\/"}',
        "null",
        " {}",
        '{"a":null }',
    ],
)
def test_texts_not_in_the_serialized_form_are_serialised_again(text: str) -> None:
    headers = parse_headers(text)
    assert not is_serialized_form(text, headers)
    assert without_routing_headers_text(text, headers) == expected(text)


def test_no_text_is_no_headers() -> None:
    assert without_routing_headers_text(None, {}) == "{}"


def test_headers_parse_exactly_as_the_standard_library_parses_them() -> None:
    # orjson parses first (it is faster); the result must be the standard library's, in
    # value, type and key order, for every text, and so must the verdict on poison.
    rng = random.Random(7)
    texts = [random_text(rng) for _ in range(5000)]
    texts += [
        '{"a":"1","b":"2","a":"3"}',
        '{"a":NaN}',
        '{"a":1e400}',
        '{"a":123456789012345678901234}',
    ]
    texts += ['{"a":"\\ud800"}', "[" * 2000 + "]" * 2000, '{"a":"\\u0000"}', "{}", " null "]
    for text in texts:
        try:
            expected: object = json.loads(text)
        except (ValueError, RecursionError):
            expected = PoisonHeaders
        try:
            got: object = parse_headers(text)
        except PoisonHeaders:
            got = PoisonHeaders
        if isinstance(expected, dict):
            if any(v is not None and not isinstance(v, str) for v in expected.values()):
                expected = PoisonHeaders
        elif expected is None:
            expected = {}
        elif expected is not PoisonHeaders:
            expected = PoisonHeaders
        assert got == expected, text
        if isinstance(got, dict):
            assert list(got) == list(expected), text  # type: ignore[call-overload]
