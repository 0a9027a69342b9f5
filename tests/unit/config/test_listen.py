"""`metrics.listen` addresses: what is accepted, and what each mistake is told."""

from __future__ import annotations

import pytest

from bridge.config.listen import parse_listen


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("0.0.0.0:1", ("0.0.0.0", 1)),
        ("[::1]:9464", ("::1", 9464)),
        ("[::]:65535", ("::", 65535)),
        ("localhost:9464", ("localhost", 9464)),
        ("metrics.internal.example:80", ("metrics.internal.example", 80)),
        (" 127.0.0.1:9464 ", ("127.0.0.1", 9464)),
    ],
)
def test_listen_addresses_that_are_accepted(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("9464", "has no port"),
        ("127.0.0.1", "has no port"),
        ("127.0.0.1:", "the port '' is not a number"),
        ("127.0.0.1:http", "the port 'http' is not a number"),
        ("127.0.0.1:0", "the port must be between 1 and 65535, got 0"),
        ("127.0.0.1:65536", "the port must be between 1 and 65535, got 65536"),
        (":9464", "has no host: write '0.0.0.0:9464' for every interface"),
        ("::1:9464", "write an IPv6 address in brackets, as in '[::1]:9464'"),
        ("[fe80::zz]:9464", "'fe80::zz' in brackets is not an IPv6 address"),
        ("300.1.1.1:9464", "'300.1.1.1' is not an IPv4 address"),
        ("my_host:9464", "'my_host' is neither an IP address nor a host name"),
        ("-bad.example:9464", "is neither an IP address nor a host name"),
    ],
)
def test_listen_mistakes_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=None) as raised:
        parse_listen(text)
    assert message in str(raised.value)
