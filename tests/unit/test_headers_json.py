"""Specification of the JSON work on headers (bridge.headers), done by orjson for speed: it must
give exactly what the standard library gives, for every headers text and every header value."""

from __future__ import annotations

import json
import random

from bridge.exceptions import PoisonHeaders
from bridge.headers import parse_headers, serialize_headers

# Characters that matter to JSON writers: every control character, quotes, backslashes, DEL,
# non-ASCII (BMP and astral), unpaired surrogates, line and paragraph separators, the
# separators themselves.
ALPHABET = [
    *(chr(code) for code in range(0x20)),
    *'aZ0 "\\/,:{}',
    "\x7f", "é", "漢", "😀", "\ud800", "\udfff", "\u2028", "\u2029", "\ufeff", "null",
]  # fmt: skip
NAMES = ["NServiceBus.MessageId", "a", "", "é", "$.store-and-forward.destination", "\n", '"']


def stdlib_serialized(headers: dict[str, str | None]) -> str:
    """What the bridge wrote before orjson: compact, non-ASCII raw, all escaped when the raw
    text cannot be UTF-8."""
    text = json.dumps(headers, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(headers, separators=(",", ":"))
    return text


def random_headers(rng: random.Random) -> dict[str, str | None]:
    def text() -> str:
        return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 10)))

    names = rng.sample(NAMES, rng.randrange(0, len(NAMES) + 1)) + [text() for _ in range(2)]
    return {name: None if rng.random() < 0.15 else text() for name in names}


def test_headers_serialize_exactly_as_the_standard_library_writes_them() -> None:
    rng = random.Random(20261125)
    surrogates = 0
    for _ in range(20_000):
        headers = random_headers(rng)
        expected = stdlib_serialized(headers)
        assert serialize_headers(headers) == expected, headers
        surrogates += expected.isascii() and "\\ud" in expected
    assert surrogates > 1000  # the fallback was taken often, so it is compared too


def test_headers_parse_exactly_as_the_standard_library_parses_them() -> None:
    # The value, the types, the key order, and the verdict on poison, for texts written every
    # way endpoints and tools write JSON, and for texts orjson refuses.
    rng = random.Random(7)
    texts = []
    for _ in range(5000):
        headers = random_headers(rng)
        texts.append(stdlib_serialized(headers))
        texts.append(json.dumps(headers))  # spaces after ':' and ','; non-ASCII escaped
        texts.append(" " + json.dumps(headers, indent=1) + "\n")
    texts += [
        '{"a":"1","b":"2","a":"3"}',
        '{"a":NaN}',
        '{"a":1e400}',
        '{"a":1234567890123456789012}',
    ]
    texts += ['{"a":"\\ud800"}', "[" * 2000 + "]" * 2000, '{"a":"\\u0000"}', '{"a":"\x01"}']
    texts += ["{}", " null ", "", '"text"', "[1]", '{"a":{"b":"c"}}', '{"a":true}', "{"]
    for text in texts:
        try:
            expected: object = json.loads(text) if text.strip() else None
        except (ValueError, RecursionError):
            expected = PoisonHeaders
        if expected is None:
            expected = {}
        elif not isinstance(expected, dict) or any(
            value is not None and not isinstance(value, str) for value in expected.values()
        ):
            expected = PoisonHeaders
        try:
            parsed: object = parse_headers(text)
        except PoisonHeaders:
            parsed = PoisonHeaders
        assert parsed == expected, text
        if isinstance(parsed, dict) and isinstance(expected, dict):
            assert list(parsed) == list(expected), text
