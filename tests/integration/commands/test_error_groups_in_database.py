"""`errors summary` groups in the database and `errors list` pages there (issue 35): the
groups are those the tools make of every row read one by one (`failure_groups.summarize`),
poison rows, empty headers and odd times of failure included, against real PostgreSQL and
SQLite forwarding databases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.error_world import ERROR, FORWARD, World, unroutable_in_error_queue

from bridge.commands.errors import read_error_queues
from bridge.commands.failure_groups import GROUP_BY, summarize
from bridge.commands.selection import Selection
from bridge.config import load_config
from bridge.connections import Connections
from bridge.exceptions import DatabaseError

pytestmark = pytest.mark.integration


@pytest.fixture(params=["postgresql", "sqlite"])
def world(request: pytest.FixtureRequest, tmp_path: Path, new_pg_database: Any) -> World:
    return World(tmp_path, request.param, new_pg_database)


def failed_headers(world: World, **changes: str | None) -> dict[str, str | None]:
    """The headers of a message the bridge failed in the forwarder's queue, changed."""
    headers: dict[str, str | None] = {
        "NServiceBus.MessageId": "m-1",
        "NServiceBus.EnclosedMessageTypes": "Shared.OrderSubmitted, Shared, Version=1.0.0.0",
        "$.store-and-forward.destination": "Samples.Billing",
        "NServiceBus.FailedQ": world.sender.address(FORWARD),
        "NServiceBus.TimeOfFailure": "2026-11-27 09:30:12:123456 Z",
        "NServiceBus.ExceptionInfo.ExceptionType": "System.TimeoutException",
        "$.sfbridge.failure-reason": "delivery-failed",
    }
    headers.update(changes)
    return headers


def tools_groups(world: World, by: str) -> list[dict[str, Any]]:
    """The groups as the tools make them of every row read one by one, as `errors summary
    --json` prints them."""
    config, _ = load_config(world.path)
    connections = Connections(config.databases)
    problems: list[DatabaseError] = []
    try:
        found = read_error_queues(config, Selection(), connections, problems)
    finally:
        connections.close()
    assert not problems
    groups = summarize(
        by, ((m, each.place.destination_of) for each in found for m in each.messages)
    )
    return [
        {
            "group": group.name,
            "count": group.count,
            "replayable": group.replayable,
            "first_failure": group.first_failure.isoformat() if group.first_failure else None,
            "last_failure": group.last_failure.isoformat() if group.last_failure else None,
        }
        for group in groups
    ]


def summary(world: World, by: str) -> list[dict[str, Any]]:
    result = world.cli("errors", "summary", "--by", by, "--json", "--limit", "0")
    assert result.returncode == 0, result.stderr
    keys = ("group", "count", "replayable", "first_failure", "last_failure")
    return [{key: group[key] for key in keys} for group in json.loads(result.stdout)]


def test_summary_in_the_database_matches_the_tools_on_a_mixed_error_queue(world: World) -> None:
    unroutable_in_error_queue(world, 3)
    rows: list[dict[str, str | None] | str] = [
        failed_headers(world),
        failed_headers(world, **{"NServiceBus.TimeOfFailure": "2026-11-20 08:00:00:000001 Z"}),
        # A time of failure not in the wire form, and none at all.
        failed_headers(world, **{"NServiceBus.TimeOfFailure": "2026-11-19 07:00:00:5 Z"}),
        failed_headers(world, **{"NServiceBus.TimeOfFailure": "yesterday"}),
        failed_headers(world, **{"NServiceBus.TimeOfFailure": None}),
        # Several types, an event, an endpoint's failure (no forwarder), spaces to fold.
        failed_headers(world, **{"NServiceBus.EnclosedMessageTypes": "Shared.Other;Shared.B"}),
        failed_headers(
            world,
            **{"$.store-and-forward.destination": None, "$.store-and-forward.eventtype": "E.X"},
        ),
        failed_headers(world, **{"NServiceBus.FailedQ": "Samples.SomeEndpoint"}),
        failed_headers(world, **{"NServiceBus.ExceptionInfo.ExceptionType": " System.Io  Err "}),
        failed_headers(world, **{"$.sfbridge.failure-reason": 'caf\u00e9 "quoted": 1'}),
        # Headers missing, empty, JSON null, a number among them (poison), not an object.
        {},
        "",
        "null",
        json.dumps({**failed_headers(world), "$.sfbridge.attempts": 3}),
        "[1, 2]",
    ]
    world.sender.send(ERROR, [(headers, b"{}", None) for headers in rows])
    for by in GROUP_BY:
        assert summary(world, by) == tools_groups(world, by), by

    # Headers that are not JSON at all: PostgreSQL's cast fails, the checked form counts them.
    world.sender.send(ERROR, [("{not json", b"{}", None), ('{"a": "\\ud800"}', b"{}", None)])
    for by in GROUP_BY:
        assert summary(world, by) == tools_groups(world, by), by
    by_reason = {group["group"]: group["count"] for group in summary(world, "reason")}
    assert by_reason["reason:poison"] == 3  # a lone surrogate escape is JSON to the tools
    assert by_reason["reason:unroutable"] == 3
    assert sum(by_reason.values()) == 3 + len(rows) + 2


def test_list_pages_in_the_database(world: World) -> None:
    sent = unroutable_in_error_queue(world, 5)
    world.sender.send(ERROR, [("{not json", b"{}", None)])
    in_order = [row_id for row_id, _ in world.rows(ERROR)]
    assert set(in_order[:5]) == set(sent)

    first = world.cli("errors", "list", "--limit", "2", "--json")
    assert first.returncode == 0, first.stderr
    assert [entry["id"] for entry in json.loads(first.stdout)] == in_order[:2]
    assert "... 4 more message(s)" in first.stderr

    text = world.cli("errors", "list", "--limit", "3").stdout.splitlines()
    assert text[0].endswith(": 6 message(s), the first 3 shown")
    assert [line.split()[0] for line in text[2:5]] == in_order[:3]
    assert text[-1].startswith("... 3 more message(s)")

    every = world.cli("errors", "list", "--limit", "0", "--json")
    assert [entry["id"] for entry in json.loads(every.stdout)] == in_order
