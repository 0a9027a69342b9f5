"""The `servicecontrol` section (bridge/config/schema/servicecontrol.py,
bridge/config/servicecontrol.py)."""

from __future__ import annotations

from typing import Any

from bridge.config.model import ServiceControlConfig
from bridge.config.servicecontrol import servicecontrol_queue
from bridge.dialects.registry import grammar_for
from tests.unit.config.test_config import build, errors, minimal, with_


def with_servicecontrol(**values: Any) -> dict[str, Any]:
    return with_(minimal(), "servicecontrol", values)


def test_without_the_section_there_is_no_servicecontrol() -> None:
    assert build(minimal()).servicecontrol is None


def test_the_section_with_its_database_gets_nservicebus_defaults() -> None:
    settings = build(with_servicecontrol(database="receiver")).servicecontrol
    assert settings == ServiceControlConfig(database="receiver")
    assert settings.heartbeat_interval == 10.0
    assert settings.heartbeat_ttl == 40.0
    assert settings.check_ttl == 4 * settings.check_interval


def test_time_to_be_received_applies_to_both_kinds() -> None:
    settings = build(
        with_servicecontrol(database="receiver", time_to_be_received="1m")
    ).servicecontrol
    assert settings is not None
    assert (settings.heartbeat_ttl, settings.check_ttl) == (60.0, 60.0)


def test_the_section_without_its_database_is_an_error() -> None:
    assert errors(with_servicecontrol(queue="x")) == [
        "servicecontrol.database: required key is missing"
    ]


def test_an_unknown_database_is_reported_with_a_suggestion() -> None:
    assert errors(with_servicecontrol(database="recever")) == [
        "servicecontrol.database: no database named 'recever' (did you mean 'receiver'?)"
    ]


def test_a_sqlite_database_cannot_hold_servicecontrols_queue() -> None:
    [error] = errors(with_servicecontrol(database="edge"))
    assert error.startswith("servicecontrol.database: database 'edge' is sqlite")


def test_a_queue_that_is_no_address_in_the_databases_dialect_is_reported() -> None:
    [error] = errors(with_servicecontrol(database="receiver", queue='"unclosed'))
    assert error.startswith("servicecontrol.queue: invalid postgresql queue address")


def test_the_default_queue_is_one_table_with_a_dot_in_the_default_schema() -> None:
    postgresql = grammar_for("postgresql")
    address = servicecontrol_queue(postgresql, None, None)
    assert postgresql.qualified_name(address) == '"public"."Particular.ServiceControl"'
    sqlserver = grammar_for("sqlserver")
    address = servicecontrol_queue(sqlserver, None, "sc")
    assert sqlserver.qualified_name(address) == "[sc].[Particular.ServiceControl]"


def test_an_unquoted_dotted_queue_is_schema_and_table_as_the_transport_reads_it() -> None:
    grammar = grammar_for("postgresql")
    address = servicecontrol_queue(grammar, "Particular.ServiceControl", None)
    assert (address.schema, address.table) == ("Particular", "ServiceControl")
