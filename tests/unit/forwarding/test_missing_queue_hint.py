"""The 'did you mean' of a missing destination queue names an endpoint's table that the route
allows, never one of the bridge's own (a proxy queue above all: a message sent there would go
back through the bridge), nor one outside the route (a sender reading its error queue must not
learn other tables' names). On a real SQLite database."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from bridge.addressing import TableAddress
from bridge.config.model import (
    BridgeConfig,
    DatabaseConfig,
    FixedDestination,
    ForwarderConfig,
)
from bridge.connections import connect
from bridge.dialects import dialect_for
from bridge.forwarding.table_failures import missing_queue_failure
from bridge.routing import Destination
from bridge.storage.tables import bridge_queue_names

SQLITE = dialect_for("sqlite")


def config(tmp_path: Path) -> BridgeConfig:
    databases = {
        name: DatabaseConfig(name, "sqlite", path=str(tmp_path / f"{name}.db"))
        for name in ("sender", "receiver")
    }
    return BridgeConfig(
        databases=databases,
        forwarders=(
            ForwarderConfig("to-receiver", "sender", "Samples.Sender.Forward"),
            # The proxy named after the Sender, in the receiver's database, for the replies.
            ForwarderConfig(
                "to-sender",
                "receiver",
                "Samples.Sender",
                error_queue="bridge_error",
                destination=FixedDestination("sender"),
            ),
        ),
    )


def hint_for(tmp_path: Path, tables: list[str], missing: str, match: str | None = None) -> str:
    tmp_path.mkdir(exist_ok=True)
    bridge = config(tmp_path)
    with sqlite3.connect(tmp_path / "receiver.db") as raw:
        for table in tables:
            raw.execute(f'CREATE TABLE "{table}" (Id TEXT)')
    connection = connect(bridge.databases["receiver"])
    try:
        failed = missing_queue_failure(
            connection,
            SQLITE,
            Destination("receiver", TableAddress(missing), missing, match=match),
            bridge_queue_names(bridge, "receiver"),
        )
    finally:
        connection.close()
    return failed.error


def test_the_bridge_queues_of_a_database_are_its_forwarders_and_error_queues(
    tmp_path: Path,
) -> None:
    bridge = config(tmp_path)
    assert bridge_queue_names(bridge, "receiver") == {"samples.sender", "bridge_error"}
    assert bridge_queue_names(bridge, "sender") == {"samples.sender.forward", "error"}


def test_a_proxy_queue_is_never_suggested_for_a_missing_endpoint_queue(tmp_path: Path) -> None:
    reason = hint_for(
        tmp_path, ["Samples.Sender", "sfbridge_ledger", "bridge_error"], "Samples.Receiver"
    )
    assert "does not exist in database 'receiver'" in reason
    assert "did you mean" not in reason, reason


def test_an_endpoint_table_close_to_the_name_is_suggested(tmp_path: Path) -> None:
    reason = hint_for(tmp_path, ["Samples.Sender", "Samples.Receivers"], "Samples.Receiver")
    assert "(did you mean 'Samples.Receivers'?)" in reason, reason


def test_only_a_table_the_route_matches_is_suggested(tmp_path: Path) -> None:
    tables = ["Samples.Receivers", "Payroll.Salaries"]
    routed = hint_for(tmp_path, tables, "Samples.Receiver", match="Samples.*")
    assert "(did you mean 'Samples.Receivers'?)" in routed, routed
    # The route allows Samples.* only: the close name outside it is not given away.
    probing = hint_for(tmp_path / "again", tables, "Payroll.Salary", match="Samples.*")
    assert "did you mean" not in probing, probing
