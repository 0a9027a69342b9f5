"""`sfbridge send Samples.Receiver` in PostgreSQL means table Receiver in schema Samples: it
still sends, and warns how to write the dotted table name."""

from __future__ import annotations

import json

import pytest
from support import pg_rows
from support.pairs import PgPair


@pytest.mark.integration
def test_send_warns_on_stderr_and_still_sends(pg_pair: PgPair) -> None:
    result = pg_pair.cli("send", "Samples.Receiver")
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith("sfbridge send: warning: 'Samples.Receiver' names table")
    [(headers,)] = pg_rows(pg_pair.sender, f"SELECT headers FROM {pg_pair.forward}")
    assert json.loads(headers)["$.store-and-forward.destination"] == "Samples.Receiver"
    quoted = pg_pair.cli("send", '"Samples.Receiver"')
    assert quoted.returncode == 0 and quoted.stderr == "", quoted.stderr
