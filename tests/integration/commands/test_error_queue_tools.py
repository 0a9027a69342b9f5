"""`sfbridge errors list / show / replay / purge` against real PostgreSQL and SQLite forwarding
databases: unroutable messages land in the error queue, the route is added, and a replay
delivers each exactly once."""

from __future__ import annotations

import json
import os
import pty
import sqlite3
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import (
    CommitFailsOnce,
    PostgresEndpoint,
    SqliteEndpoint,
    nsb_message_headers,
    sfbridge,
    write_config,
)
from support.error_world import (
    ERROR,
    FAILURE_HEADERS,
    FORWARD,
    RECEIVER,
    World,
    unroutable_in_error_queue,
)

from bridge.commands.audit import open_command
from bridge.commands.error_queues import error_queues, read_failed_messages, replay_messages
from bridge.config import load_config
from bridge.connections import Connections, connect
from bridge.dialects import dialect_for
from bridge.exceptions import ConnectionLost
from bridge.forwarding.spine import BatchForwarder
from bridge.storage.audit import read_entries
from bridge.storage.tables import forwarder_tables

pytestmark = pytest.mark.integration


@pytest.fixture(params=["postgresql", "sqlite"])
def world(request: pytest.FixtureRequest, tmp_path: Path, new_pg_database: Any) -> World:
    return World(tmp_path, request.param, new_pg_database)


def test_unroutable_messages_are_listed_then_delivered_exactly_once_after_the_route_is_added(
    world: World,
) -> None:
    sent = unroutable_in_error_queue(world, 3)

    listed = world.cli("errors", "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert (
        lines[0] == f"error queue {world.sender.address(ERROR)} in database 'sender': 3 message(s)"
    )
    assert lines[1].split() == [
        "ID", "MESSAGE", "ID", "FAILED", "AT", "(UTC)", "REASON", "DESTINATION", "ATTEMPTS",
        "FORWARDER", "EXCEPTION",
    ]  # fmt: skip
    for row_id in sent:
        [line] = [line for line in lines if row_id in line]
        columns = line.split()
        assert columns[1] == sent[row_id]  # the NServiceBus.MessageId
        assert columns[4:8] == ["unroutable", world.sender.address(RECEIVER), "-", "orders"]
        assert "no route matches destination table 'Samples.Receiver'" in line

    as_json = json.loads(world.cli("errors", "list", "--json").stdout)
    assert {entry["id"] for entry in as_json} == set(sent)
    assert {entry["message_id"] for entry in as_json} == set(sent.values())
    assert all(entry["replayable"] and entry["forwarder"] == "orders" for entry in as_json)
    assert {entry["reason"] for entry in as_json} == {"unroutable"}

    world.add_route()
    replayed = world.cli("errors", "replay", "--reason", "unroutable")
    assert replayed.returncode == 0, replayed.stderr
    moved = [line for line in replayed.stdout.splitlines() if line.startswith("moved ")]
    assert sorted(line.split()[1] for line in moved) == sorted(sent)
    assert all(
        m.endswith(f"to {world.sender.address(FORWARD)} (forwarder 'orders')") for m in moved
    )
    assert "still no route" not in replayed.stdout
    assert "replayed 3 message(s) into their forwarding queues; 0 skipped" in replayed.stdout
    assert world.rows(ERROR) == []
    in_queue = world.rows(FORWARD)
    assert {row_id for row_id, _ in in_queue} == set(sent)
    for _, headers in in_queue:
        assert not FAILURE_HEADERS & set(headers)
        assert not [name for name in headers if name.startswith("NServiceBus.ExceptionInfo.")]
        assert headers["$.store-and-forward.destination"] == world.sender.address(RECEIVER)
        assert headers["NServiceBus.EnclosedMessageTypes"].startswith("Shared.OrderSubmitted")

    assert world.forward_all() == Counter({"delivered": 3})
    received = world.receiver.receive_all(RECEIVER)
    assert Counter(m["headers"]["NServiceBus.MessageId"] for m in received) == Counter(
        sent.values()
    )
    assert {m["body"] for m in received} == {b'{"order": 1}'}
    assert world.rows(ERROR) == [] and world.rows(FORWARD) == []
    again = world.cli("errors", "replay")
    assert again.returncode == 0
    assert again.stdout == "no failed messages match; nothing to replay\n"


def test_a_replay_while_the_route_is_missing_fails_once_more_with_a_fresh_time(
    world: World,
) -> None:
    sent = unroutable_in_error_queue(world, 2)
    before = {row_id: headers for row_id, headers in world.rows(ERROR)}

    replayed = world.cli("errors", "replay")
    assert replayed.returncode == 0, replayed.stderr
    moved = [line for line in replayed.stdout.splitlines() if line.startswith("moved ")]
    assert len(moved) == 2
    assert all(line.endswith(" (still no route in this config)") for line in moved)
    assert (
        "note: 2 message(s) still have no route in this config (no route matches destination "
        "table 'Samples.Receiver'" in replayed.stdout
    )
    assert "the forwarder will put them back in the error queue with a fresh reason" in (
        replayed.stdout
    )
    assert world.rows(ERROR) == []

    assert world.forward_all() == Counter({"sent-to-error-queue": 2})
    assert world.forward_all() == Counter()  # nothing goes round again
    after = world.rows(ERROR)
    assert sorted(row_id for row_id, _ in after) == sorted(sent)
    for row_id, headers in after:
        assert headers["$.sfbridge.failure-reason"] == "unroutable"
        assert headers["NServiceBus.FailedQ"] == world.sender.address(FORWARD)
        assert headers["NServiceBus.TimeOfFailure"] > before[row_id]["NServiceBus.TimeOfFailure"]
        assert headers["NServiceBus.MessageId"] == sent[row_id]
    assert world.rows(FORWARD) == []


def test_a_dry_run_moves_nothing(world: World) -> None:
    sent = unroutable_in_error_queue(world, 2)
    world.add_route()
    dry = world.cli("errors", "replay", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    would = [line.split()[2] for line in dry.stdout.splitlines() if line.startswith("would move")]
    assert sorted(would) == sorted(sent)
    assert dry.stdout.splitlines()[-1] == (
        "dry run: would move 2 message(s) back to their forwarding queues; 0 skipped; "
        "nothing was moved"
    )
    assert sorted(row_id for row_id, _ in world.rows(ERROR)) == sorted(sent)
    assert world.rows(FORWARD) == []


def test_an_endpoints_failed_message_and_a_poison_row_are_listed_but_not_replayed(
    world: World,
) -> None:
    sent = unroutable_in_error_queue(world, 1)
    billing = world.sender.address("Samples.Billing")
    endpoint_headers = nsb_message_headers(
        None,
        **{
            "NServiceBus.FailedQ": billing,
            "NServiceBus.ExceptionInfo.Message": "handler threw",
            "NServiceBus.TimeOfFailure": "2026-11-21 10:06:20:123456 Z",
        },
    )
    [endpoints] = world.sender.send(ERROR, [(endpoint_headers, b"\x00\x01binary", None)])
    [poison] = world.sender.send(ERROR, [("not json", b"x", None)])

    listed = world.cli("errors", "list")
    assert listed.returncode == 0, listed.stderr
    assert "3 message(s)" in listed.stdout.splitlines()[0]
    [endpoint_line] = [line for line in listed.stdout.splitlines() if str(endpoints) in line]
    assert endpoint_line.split()[4:9] == ["-", "-", "-", "-", "handler"]
    [poison_line] = [line for line in listed.stdout.splitlines() if str(poison) in line]
    assert poison_line.split()[1:4] == ["-", "-", "poison"]
    assert (
        f"not replayed by 'errors replay': 1 message(s) marked '-': it failed in {billing}, which "
        "no forwarder in database 'sender' drains (an endpoint's failed message: retry it from "
        "ServicePulse)" in listed.stdout
    )

    world.add_route()
    replayed = world.cli("errors", "replay")
    assert replayed.returncode == 0, replayed.stderr
    lines = replayed.stdout.splitlines()
    assert f"skipped {endpoints}: it failed in {billing}, which no forwarder" in replayed.stdout
    assert any(line.startswith(f"skipped {poison}: its headers cannot be read") for line in lines)
    assert "replayed 1 message(s) into their forwarding queues; 2 skipped" in lines[-1]
    assert sorted(row_id for row_id, _ in world.rows(ERROR)) == sorted(
        [str(endpoints), str(poison)]
    )
    assert [row_id for row_id, _ in world.rows(FORWARD)] == list(sent)

    shown = world.cli("errors", "show", str(endpoints))
    assert shown.returncode == 0, shown.stderr
    assert f"  NServiceBus.FailedQ: {billing}" in shown.stdout.splitlines()
    assert "body (binary, 8 bytes):" in shown.stdout
    assert "00000000  00 01 62 69 6e 61 72 79" in shown.stdout


def test_show_prints_headers_and_the_body_and_names_an_unknown_id(world: World) -> None:
    [(row_id, message_id)] = unroutable_in_error_queue(world, 1).items()
    shown = world.cli("errors", "show", row_id.upper())
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert (
        lines[0]
        == f"message {row_id} in error queue {world.sender.address(ERROR)} in database 'sender'"
    )
    assert lines[1] == (
        f"  failed in {world.sender.address(FORWARD)} (forwarder 'orders'); "
        f"'sfbridge errors replay --id {row_id}' sends it back there"
    )
    assert "  reason: unroutable" in lines
    assert "  $.sfbridge.failure-reason: unroutable" in lines
    assert lines[-2:] == ["body (text, 12 bytes):", '  {"order": 1}']
    assert f"  message id: {message_id}" in lines
    # The NServiceBus.MessageId (what `sfbridge send` and the endpoints print) names it too,
    # and the list shows it.
    by_message_id = world.cli("errors", "show", message_id)
    assert by_message_id.stdout == shown.stdout, by_message_id.stderr
    listed = world.cli("errors", "list").stdout.splitlines()
    assert listed[1].split()[:3] == ["ID", "MESSAGE", "ID"]
    assert listed[2].split()[:2] == [row_id, message_id]
    dry_run = world.cli("errors", "replay", "--dry-run", "--id", message_id)
    assert f"would move {row_id} " in dry_run.stdout, dry_run.stdout + dry_run.stderr

    unknown = str(uuid.uuid4())
    missing = world.cli("errors", "show", unknown)
    assert missing.returncode == 2
    assert missing.stderr.startswith(f"sfbridge errors show: no message with id {unknown} in ")
    replay = world.cli("errors", "replay", "--id", row_id, "--id", unknown)
    assert replay.returncode == 2
    assert (
        f"no message with id {unknown}" in replay.stderr and "nothing was changed" in replay.stderr
    )
    assert [r for r, _ in world.rows(ERROR)] == [row_id]


def test_purge_asks_refuses_without_a_terminal_and_deletes_with_yes(world: World) -> None:
    sent = unroutable_in_error_queue(world, 3)
    refused = world.cli("errors", "purge")
    assert refused.returncode == 2
    assert refused.stderr == (
        "sfbridge errors purge: refusing to delete 3 message(s) without a confirmation: run it "
        "in a terminal to be asked, or add --yes\n"
    )
    assert len(world.rows(ERROR)) == 3

    first, *others = sorted(sent)
    declined = _in_a_terminal(world, ["errors", "purge", "--id", first], "n\n")
    assert declined.endswith("kept the messages in error queue " + _name(world) + "\n")
    question = f"delete 1 message(s) from error queue {_name(world)}? [y/N] "
    assert question in declined
    assert len(world.rows(ERROR)) == 3
    confirmed = _in_a_terminal(world, ["errors", "purge", "--id", first], "y\n")
    assert question in confirmed
    assert f"deleted 1 message(s) from error queue {_name(world)}" in confirmed
    assert sorted(row_id for row_id, _ in world.rows(ERROR)) == others

    purged = world.cli("errors", "purge", "--reason", "unroutable", "--yes")
    assert purged.returncode == 0, purged.stderr
    assert purged.stdout == f"deleted 2 message(s) from error queue {_name(world)}\n"
    assert world.rows(ERROR) == [] and world.rows(FORWARD) == []


def _name(world: World) -> str:
    return f"{world.sender.address(ERROR)} (database 'sender')"


def _in_a_terminal(world: World, args: list[str], answer: str) -> str:
    """Runs the CLI with a terminal as its input, answers its question; returns its output."""
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "bridge", "-c", str(world.path), *args],
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.write(controller, answer.encode())
        output, errors = process.communicate(timeout=60)
    finally:
        os.close(controller)
        os.close(terminal)
    assert process.returncode == 0, errors
    return output


def test_filters_and_names_a_person_can_correct(world: World) -> None:
    unroutable_in_error_queue(world, 1)
    for args, expected in [
        (["--forwarder", "order"], "no forwarder named 'order' (did you mean 'orders'?)"),
        (["--reason", "unroutabel"], "no failure reason 'unroutabel' (did you mean 'unroutable'?"),
        (["--since", "yesterday"], "--since wants a duration back from now such as 2h"),
    ]:
        wrong = world.cli("errors", "list", *args)
        assert wrong.returncode == 2
        assert wrong.stderr.startswith(f"sfbridge errors list: {expected}"), wrong.stderr
    header = f"error queue {world.sender.address(ERROR)} in database 'sender'"
    for args, count in [
        (["--since", "1h"], 1),
        (["--since", "2099-01-01T00:00:00Z"], 0),
        (["--destination", "Samples.*"], 1),
        (["--destination", "Other.*"], 0),
        (["--reason", "delivery-failed"], 0),
        (["--forwarder", "orders"], 1),
    ]:
        listed = sfbridge("errors", "list", *args, "-c", str(world.path))
        assert listed.returncode == 0, listed.stderr
        of = "" if count else " (of 1)"
        assert listed.stdout.splitlines()[0] == f"{header}: {count} message(s){of}", args


def test_two_forwarders_sharing_an_error_queue_each_get_their_own_messages_back(
    tmp_path: Path,
) -> None:
    edge, receiver = SqliteEndpoint(tmp_path / "edge.db"), SqliteEndpoint(tmp_path / "r.db")
    config: dict[str, Any] = {
        "databases": {"edge": edge.database_entry(), "receiver": receiver.database_entry()},
        "forwarders": [
            {"name": "orders", "database": "edge", "queue": "Orders.Forward"},
            {"name": "billing", "database": "edge", "queue": "Billing.Forward"},
        ],
        "routes": [{"match": "Nowhere", "database": "receiver"}],
    }
    path = write_config(tmp_path / "sfbridge.yaml", config)
    assert sfbridge("-c", str(path), "install").returncode == 0
    receiver.create_queue(RECEIVER)
    sent = {
        queue: {str(i) for i in edge.send(queue, [(nsb_message_headers(RECEIVER), b"x", None)])}
        for queue in ("Orders.Forward", "Billing.Forward")
    }
    loaded, _ = load_config(path)
    connections = Connections(loaded.databases)
    for forwarder in loaded.forwarders:
        BatchForwarder(loaded, forwarder, connections).forward_batch()
    connections.close()

    listed = json.loads(sfbridge("-c", str(path), "errors", "list", "--json").stdout)
    assert {(entry["id"], entry["forwarder"]) for entry in listed} == {
        (*sent["Orders.Forward"], "orders"),
        (*sent["Billing.Forward"], "billing"),
    }
    config["routes"].append({"match": "Samples.*", "database": "receiver"})
    write_config(path, config)
    replayed = sfbridge("-c", str(path), "errors", "replay", "--forwarder", "billing")
    assert replayed.returncode == 0, replayed.stderr
    [moved] = [line for line in replayed.stdout.splitlines() if line.startswith("moved ")]
    assert moved.endswith("to Billing.Forward (forwarder 'billing')")
    with sqlite3.connect(tmp_path / "edge.db") as connection:
        in_billing = {row[0] for row in connection.execute('SELECT Id FROM "Billing.Forward"')}
        in_orders = connection.execute('SELECT count(*) FROM "Orders.Forward"').fetchone()[0]
        in_error = {row[0] for row in connection.execute('SELECT Id FROM "error"')}
    assert in_billing == sent["Billing.Forward"] and in_orders == 0
    assert in_error == sent["Orders.Forward"]
    rest = sfbridge("-c", str(path), "errors", "replay")
    assert rest.stdout.splitlines()[0].endswith("to Orders.Forward (forwarder 'orders')")


def test_a_replay_that_dies_before_its_commit_leaves_every_message_in_the_error_queue(
    world: World,
) -> None:
    sent = unroutable_in_error_queue(world, 3)
    config, _ = load_config(world.path)
    [queue] = error_queues(config)
    dialect = dialect_for(config.databases["sender"].dialect)
    # The audit record is written first; each batch counts itself in its own transaction.
    recorder = connect(config.databases["sender"])
    audit = open_command(config, recorder, "sender", "errors replay", "test")
    assert audit.seq is not None

    def affected() -> int:
        [entry] = read_entries(
            recorder, dialect, forwarder_tables(config, config.forwarders[0]).audit, 5
        )
        return entry.affected

    connection = CommitFailsOnce(connect(config.databases["sender"]))
    try:
        messages = read_failed_messages(connection, dialect, queue)
        assert messages is not None and len(messages) == 3
        with pytest.raises(ConnectionLost):
            replay_messages(connection, dialect, queue, messages, batch_size=2, in_batch=audit.add)
        assert sorted(row_id for row_id, _ in world.rows(ERROR)) == sorted(sent)
        assert world.rows(FORWARD) == []
        assert affected() == 0  # the batch that died counted nothing

        report = replay_messages(
            connection, dialect, queue, messages, batch_size=2, in_batch=audit.add
        )
        assert affected() == 3
    finally:
        connection.close()
        recorder.close()
    assert sorted(m.row_id for m in report.moved) == sorted(sent) and report.gone == []
    assert world.rows(ERROR) == []
    assert sorted(row_id for row_id, _ in world.rows(FORWARD)) == sorted(sent)


def test_a_copy_in_another_databases_grammar_is_replayed_through_retry_storage(
    tmp_path: Path, new_pg_database: Any
) -> None:
    # A SQLite edge whose event went to a PostgreSQL subscriber read from that database's
    # subscription table: its copy names the queue in PostgreSQL's grammar, and says so in a
    # bridge header that the forwarding queue would not keep (a sender could forge it).
    edge = SqliteEndpoint(tmp_path / "edge.db")
    central = PostgresEndpoint(new_pg_database())
    path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {"edge": edge.database_entry(), "central": central.database_entry()},
            "forwarders": [{"name": "orders", "database": "edge", "queue": FORWARD}],
            "routes": [{"match": "Samples.Receiver*", "database": "central"}],
            "subscription_tables": [{"database": "central"}],
        },
    )
    assert sfbridge("-c", str(path), "install").returncode == 0
    central.create_queue(RECEIVER)
    copy = nsb_message_headers(
        '"public"."Samples.Receiver"',
        **{
            "$.sfbridge.address-database": "central",
            "NServiceBus.FailedQ": FORWARD,
            "$.sfbridge.failure-reason": "missing-queue",
        },
    )
    edge.send(ERROR, [(copy, b"{}", None)])

    replayed = sfbridge("-c", str(path), "errors", "replay")
    assert replayed.returncode == 0, replayed.stderr
    with sqlite3.connect(edge.path) as connection:
        waiting = connection.execute("SELECT headers, attempts FROM sfbridge_retry").fetchall()
        queued = connection.execute(f'SELECT count(*) FROM "{FORWARD}"').fetchone()[0]
    assert queued == 0
    [(headers, attempts)] = waiting
    assert json.loads(headers)["$.sfbridge.address-database"] == "central"
    assert attempts == 0

    config, _ = load_config(path)
    connections = Connections(config.databases)
    try:
        forwarder = BatchForwarder(config, config.forwarders[0], connections)
        assert forwarder.forward_batch("retry").counts == Counter({"delivered": 1})
        # The same headers written by a sender into the forwarding queue: the bridge header
        # is dropped, and the address read in SQLite's grammar matches no route.
        edge.send(FORWARD, [(copy, b"{}", None)])
        assert forwarder.forward_batch().counts == Counter({"sent-to-error-queue": 1})
    finally:
        connections.close()
    [received] = central.receive_all(RECEIVER)
    assert received["headers"]["NServiceBus.MessageId"] == copy["NServiceBus.MessageId"]
