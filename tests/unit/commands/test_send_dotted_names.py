"""`sfbridge send Samples.Receiver` in PostgreSQL means table Receiver in schema Samples: it
still sends, and warns how to write the dotted table name."""

from __future__ import annotations

import pytest

from bridge.commands.send import dotted_name_warning
from bridge.config.model import BridgeConfig, DatabaseConfig, ForwarderConfig

CONFIG = BridgeConfig(
    databases={"sender": DatabaseConfig("sender", "postgresql", connection="Server=x")},
    forwarders=(ForwarderConfig("sender", "sender", "Samples.Sender.Forward"),),
)
FORWARDER = CONFIG.forwarders[0]


def test_an_unquoted_dot_draws_a_warning_with_the_quoted_form() -> None:
    warning = dotted_name_warning(CONFIG, FORWARDER, "Samples.Receiver")
    assert warning == (
        '\'Samples.Receiver\' names table "Receiver" in schema "Samples" (an unquoted dot '
        "separates schema and table); for the table Samples.Receiver in the default schema, "
        "quote it: sfbridge send '\"Samples.Receiver\"'"
    )


@pytest.mark.parametrize(
    "address", ['"Samples.Receiver"', '"public"."Samples.Receiver"', "Receiver", ".Receiver"]
)
def test_quoted_plain_or_unparsable_addresses_draw_none(address: str) -> None:
    assert dotted_name_warning(CONFIG, FORWARDER, address) is None
