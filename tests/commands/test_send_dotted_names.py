"""`sfbridge send Samples.Receiver` in PostgreSQL means table Receiver in schema Samples: it
still sends, and warns how to write the dotted table name."""

from __future__ import annotations

import json

import pytest
from support import pg_rows
from support.pairs import PgPair

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


@pytest.mark.integration
def test_send_warns_on_stderr_and_still_sends(pg_pair: PgPair) -> None:
    result = pg_pair.cli("send", "Samples.Receiver")
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith("sfbridge send: warning: 'Samples.Receiver' names table")
    [(headers,)] = pg_rows(pg_pair.sender, f"SELECT headers FROM {pg_pair.forward}")
    assert json.loads(headers)["$.store-and-forward.destination"] == "Samples.Receiver"
    quoted = pg_pair.cli("send", '"Samples.Receiver"')
    assert quoted.returncode == 0 and quoted.stderr == "", quoted.stderr
