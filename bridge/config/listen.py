"""Listen addresses (`metrics.listen`): `host:port`, as a person writes them for a server.

Pure, so that validation and the daemon read the same text the same way.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final

__all__ = ["LISTEN_FORMS", "parse_listen"]

LISTEN_FORMS: Final = (
    "HOST:PORT, such as '127.0.0.1:9464', '0.0.0.0:9464' (every IPv4 interface), "
    "'[::1]:9464' or 'localhost:9464'"
)
# A DNS name: labels of letters, digits and inner hyphens.
_HOSTNAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


def parse_listen(text: str) -> tuple[str, int]:
    """`(host, port)` of a listen address; an IPv6 host comes back without its brackets.

    Raises ValueError saying what is wrong: no port, a port outside 1..65535, a host that is
    neither an IP address nor a host name.
    """
    text = text.strip()
    host, colon, port_text = text.rpartition(":")
    if not colon:
        raise ValueError(f"{text!r} has no port: expected {LISTEN_FORMS}")
    if not port_text.isdigit():
        raise ValueError(f"{text!r}: the port {port_text!r} is not a number")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"{text!r}: the port must be between 1 and 65535, got {port}")
    if host.startswith("[") and host.endswith("]"):
        inner = host[1:-1]
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            raise ValueError(f"{text!r}: {inner!r} in brackets is not an IPv6 address") from None
        return inner, port
    if ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, as in '[::1]:{port}'")
    if not host:
        raise ValueError(f"{text!r} has no host: write '0.0.0.0:{port}' for every interface")
    if re.fullmatch(r"[\d.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"{text!r}: {host!r} is not an IPv4 address") from None
        return host, port
    if not _HOSTNAME.fullmatch(host):
        raise ValueError(f"{text!r}: {host!r} is neither an IP address nor a host name")
    return host, port
