"""Failures in groups, handled in groups (`sfbridge errors summary`, `--group`, `errors archive`
and `restore`, `errors replay --to`), `--limit` and `--json` on every list and show, and `retries
fail`'s dry run and confirmation, against real PostgreSQL and SQLite forwarding databases."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from support import nsb_message_headers, write_config
from support.error_world import (
    ERROR,
    FORWARD,
    RECEIVER,
    World,
    park_in_retry,
    unroutable_in_error_queue,
)

from bridge.config import load_config
from bridge.connections import Connections
from bridge.dialects import dialect_for
from bridge.exceptions import ExitCode
from bridge.messages import utcnow
from bridge.storage.archive import expire_archives
from bridge.storage.audit import read_entries
from bridge.storage.tables import forwarder_tables

pytestmark = pytest.mark.integration


@pytest.fixture(params=["postgresql", "sqlite"])
def world(request: pytest.FixtureRequest, tmp_path: Path, new_pg_database: Any) -> World:
    return World(tmp_path, request.param, new_pg_database)


def without_routing_header_in_error_queue(world: World, count: int) -> dict[str, str]:
    """`count` messages without a routing header, failed (no-routing-header)."""
    headers = [nsb_message_headers(None) for _ in range(count)]
    ids = world.sender.send(FORWARD, [(h, b"{}", None) for h in headers])
    assert world.forward_all() == Counter({"sent-to-error-queue": count})
    return {str(i): str(h["NServiceBus.MessageId"]) for i, h in zip(ids, headers, strict=True)}


def archived_rows(world: World) -> int:
    config, _ = load_config(world.path)
    connections = Connections(config.databases)
    try:
        connection = connections.get("sender")
        dialect = dialect_for(config.databases["sender"].dialect)
        table = forwarder_tables(config, config.forwarders[0]).archive
        [[count]] = connection.query(
            f"SELECT count(*) FROM {dialect.grammar.qualified_name(table)}"
        )
        connection.rollback()
        return int(count)
    finally:
        connections.close()


def test_summary_groups_failures_and_a_group_is_archived_restored_replayed_and_purged(
    world: World,
) -> None:
    unroutable = unroutable_in_error_queue(world, 3)
    no_header = without_routing_header_in_error_queue(world, 2)

    summary = world.cli("errors", "summary")
    assert summary.returncode == 0, summary.stderr
    lines = summary.stdout.splitlines()
    assert lines[0].startswith("5 failed message(s) in 2 group(s) by reason: error queue ")
    assert lines[1].split()[:3] == ["GROUP", "COUNT", "REPLAYABLE"]
    assert lines[2].split()[:3] == ["reason:unroutable", "3", "3"]
    assert lines[3].split()[:3] == ["reason:no-routing-header", "2", "2"]
    by_type = json.loads(world.cli("errors", "summary", "--by", "type", "--json").stdout)
    assert [(g["group"], g["count"]) for g in by_type] == [("type:Shared.OrderSubmitted", 5)]
    assert by_type[0]["first_failure"] <= by_type[0]["last_failure"]
    by_destination = json.loads(
        world.cli("errors", "summary", "--by", "destination", "--json").stdout
    )
    assert [(g["value"], g["count"]) for g in by_destination] == [
        (world.sender.address(RECEIVER), 3),
        ("(none)", 2),
    ]
    cut = world.cli("errors", "summary", "--limit", "1")
    assert cut.stdout.splitlines()[-1] == (
        "... 1 more group(s), use --limit N (0 for all) or narrow the selection"
    )

    group = ["--group", "reason:no-routing-header"]
    listed = json.loads(world.cli("errors", "list", *group, "--json").stdout)
    assert {entry["id"] for entry in listed} == set(no_header)

    # Archive: asks, like purge; a dry run moves nothing; then out of the error queue.
    refused = world.cli("errors", "archive", *group)
    assert refused.returncode == 2
    assert "refusing to archive 2 message(s) without a confirmation" in refused.stderr
    dry = world.cli("errors", "archive", *group, "--dry-run")
    assert dry.stdout.splitlines()[-1] == (
        "dry run: would archive 2 message(s) (kept 30d); nothing was moved"
    )
    assert len(world.rows(ERROR)) == 5 and archived_rows(world) == 0
    archived = world.cli("errors", "archive", *group, "--yes")
    assert archived.returncode == 0, archived.stderr
    assert "archived 2 message(s) from error queue" in archived.stdout
    assert {row_id for row_id, _ in world.rows(ERROR)} == set(unroutable)
    assert archived_rows(world) == 2
    assert "reason:no-routing-header" not in world.cli("errors", "summary").stdout

    # Restore one by its MessageId: back as it was.
    first = sorted(no_header)[0]
    restored = world.cli("errors", "restore", "--id", no_header[first])
    assert restored.returncode == 0, restored.stderr
    assert "restored 1 message(s) to error queue" in restored.stdout
    back = dict(world.rows(ERROR))
    assert back[first]["NServiceBus.MessageId"] == no_header[first]
    assert back[first]["$.sfbridge.failure-reason"] == "no-routing-header"
    assert archived_rows(world) == 1

    # Replay and purge take a group too.
    world.add_route()
    replayed = world.cli("errors", "replay", "--group", "reason:unroutable")
    assert "replayed 3 message(s) into their forwarding queues; 0 skipped" in replayed.stdout
    assert world.forward_all() == Counter({"delivered": 3})
    purged = world.cli("errors", "purge", *group, "--yes")
    assert purged.returncode == 0, purged.stderr
    assert world.rows(ERROR) == [] and archived_rows(world) == 1

    bad = world.cli("errors", "summary", "--group", "colour:red")
    assert bad.returncode == 2
    assert "--group wants a group as 'sfbridge errors summary' names it" in bad.stderr


def test_archived_messages_are_deleted_after_the_retention(world: World) -> None:
    without_routing_header_in_error_queue(world, 2)
    assert world.cli("errors", "archive", "--yes").returncode == 0
    config, _ = load_config(world.path)
    assert expire_archives(config) == 0  # kept for the retention
    assert archived_rows(world) == 2
    later = utcnow() + timedelta(seconds=config.error_archive.retention + 60)
    assert expire_archives(config, now=lambda: later) == 2
    assert archived_rows(world) == 0 and world.rows(ERROR) == []


def test_replay_to_an_address_a_route_allows_and_refused_to_one_none_does(world: World) -> None:
    sent = unroutable_in_error_queue(world, 2)
    billing = world.sender.address("Samples.Billing")
    world.receiver.create_queue("Samples.Billing")

    refused = world.cli("errors", "replay", "--to", world.sender.address("Samples.Nowhere"))
    assert refused.returncode == 2
    assert "no route of forwarder 'orders' allows it" in refused.stderr
    assert "nothing was changed" in refused.stderr
    assert len(world.rows(ERROR)) == 2

    replayed = world.cli("errors", "replay", "--to", billing)
    assert replayed.returncode == 0, replayed.stderr
    assert f"redirected to {billing}" in replayed.stdout
    assert world.rows(ERROR) == []
    assert {h["$.store-and-forward.destination"] for _, h in world.rows(FORWARD)} == {billing}
    assert world.forward_all() == Counter({"delivered": 2})
    received = world.receiver.receive_all("Samples.Billing")
    assert {m["headers"]["NServiceBus.MessageId"] for m in received} == set(sent.values())
    assert world.receiver.receive_all(RECEIVER) == []

    config, _ = load_config(world.path)
    connections = Connections(config.databases)
    try:
        dialect = dialect_for(config.databases["sender"].dialect)
        table = forwarder_tables(config, config.forwarders[0]).audit
        [entry] = read_entries(connections.get("sender"), dialect, table, 10)
    finally:
        connections.close()
    assert entry.command == "errors replay" and f"--to {billing}" in entry.target
    assert entry.affected == 2


def test_retries_fail_has_a_dry_run_and_asks_like_purge(world: World) -> None:
    waiting = park_in_retry(world, 2)
    refused = world.cli("retries", "fail")
    assert refused.returncode == 2
    assert refused.stderr.startswith(
        "sfbridge retries fail: refusing to move 2 message(s) to the error queue without a "
        "confirmation: run it in a terminal to be asked, or add --yes"
    )
    dry = world.cli("retries", "fail", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert sorted(line.split()[2] for line in dry.stdout.splitlines()[:-1]) == sorted(waiting)
    assert dry.stdout.splitlines()[-1].startswith("dry run: would move 2 message(s)")
    assert len(json.loads(world.cli("retries", "list", "--json").stdout)) == 2
    assert world.rows(ERROR) == []
    failed = world.cli("retries", "fail", "--yes")
    assert failed.returncode == 0, failed.stderr
    assert len(world.rows(ERROR)) == 2


def test_every_list_and_show_takes_limit_and_json(world: World) -> None:
    sent = unroutable_in_error_queue(world, 3)
    park_in_retry(world, 3)
    a_message_id = sorted(sent.values())[0]
    for verb in (
        ["errors", "list"],
        ["errors", "summary", "--by", "exception"],
        ["retries", "list"],
        ["errors", "show", a_message_id],
        ["where", a_message_id],
    ):
        whole = world.cli(*verb, "--json")
        assert whole.returncode == 0, (verb, whole.stderr)
        records = json.loads(whole.stdout)
        assert records and all(isinstance(r, dict) for r in records), verb
        one = world.cli(*verb, "--json", "--limit", "1")
        assert one.returncode == 0, (verb, one.stderr)
        assert json.loads(one.stdout) == records[:1], verb
        if len(records) > 1:
            assert f"... {len(records) - 1} more" in one.stderr, verb
    for verb in (["errors", "list"], ["retries", "list"]):
        cut = world.cli(*verb, "--limit", "2")
        assert cut.returncode == 0, cut.stderr
        assert "3 message(s), the first 2 shown" in cut.stdout, verb
        assert cut.stdout.splitlines()[-1].startswith("... 1 more message(s), use --limit"), verb
        everything = world.cli(*verb, "--limit", "0")
        assert "more message(s)" not in everything.stdout, verb
    shown = json.loads(world.cli("errors", "show", a_message_id, "--json").stdout)
    assert shown[0]["message_id"] == a_message_id
    assert shown[0]["headers"]["$.sfbridge.failure-reason"] == "unroutable"
    assert shown[0]["body_text"] == '{"order": 1}'


def test_a_database_that_cannot_be_reached_leaves_the_other_error_queues_listed_and_summed(
    world: World,
) -> None:
    unroutable_in_error_queue(world, 3)
    # A second forwarding database whose server refuses connections: its error queue cannot
    # be read, the sender's still is, and the exit code says a database was unreachable.
    world.config["databases"]["gone"] = {
        "dialect": "postgresql",
        "connection": "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=1;Uid=postgres;"
        "Database=gone;",
    }
    world.config["forwarders"].append(
        {"name": "gone", "database": "gone", "queue": '"public"."Gone.Forward"'}
    )
    write_config(world.path, world.config)
    for verb, counted in (
        (["errors", "list"], lambda records: len(records)),
        (["errors", "summary"], lambda records: sum(r["count"] for r in records)),
    ):
        result = world.cli(*verb, "--json")
        assert result.returncode == ExitCode.UNAVAILABLE, (verb, result.stderr)
        assert counted(json.loads(result.stdout)) == 3, (verb, result.stdout)
        assert f"sfbridge {' '.join(verb)}: " in result.stderr, (verb, result.stderr)
