"""A configuration's fingerprint (bridge.config.fingerprint): the same for the same
configuration however written, different for another, and blind to secrets."""

from __future__ import annotations

from bridge.config.fingerprint import FINGERPRINT_LENGTH, config_fingerprint
from bridge.config.load import load_config_text

BASE = """
databases:
  sender: {{dialect: postgresql, connection: "Server=db;Uid=bridge;Pwd={password};Database=s"}}
  receiver: {{dialect: postgresql, connection: "Server=db;Uid=bridge;Database=r;Pwd=x"}}
forwarders:
  - {{name: orders, database: sender, queue: {queue}}}
routes:
  - {{match: "*", database: receiver}}
"""

REORDERED = """
routes:
  - {match: "*", database: receiver}
forwarders:
  - {queue: orders, database: sender, name: orders}
databases:
  receiver: {connection: "Server=db;Uid=bridge;Database=r;Pwd=x", dialect: postgresql}
  sender: {connection: "Server=db;Uid=bridge;Pwd=secret;Database=s", dialect: postgresql}
"""


def fingerprint(text: str, source: str = "/etc/sfbridge/a.yaml") -> str:
    config, _ = load_config_text(text, source, {})
    return config_fingerprint(config)


def test_the_same_configuration_has_the_same_fingerprint_however_written_or_where() -> None:
    first = fingerprint(BASE.format(password="secret", queue="orders"))
    assert len(first) == FINGERPRINT_LENGTH and int(first, 16) >= 0
    assert fingerprint(REORDERED, "/srv/other/place.yaml") == first


def test_another_forwarder_queue_is_another_configuration() -> None:
    assert fingerprint(BASE.format(password="secret", queue="orders")) != fingerprint(
        BASE.format(password="secret", queue="bills")
    )


def test_a_password_takes_no_part() -> None:
    assert fingerprint(BASE.format(password="secret", queue="orders")) == fingerprint(
        BASE.format(password="changed-it", queue="orders")
    )
