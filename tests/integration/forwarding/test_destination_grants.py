"""A destination queue the bridge's login may not write, or may write but not read: the first
waits in retry storage with the exact GRANT a DBA must run, the second is written with INSERT
statements, since the column types COPY needs cannot be read."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import ERROR_QUEUE as ERROR
from support import RETRY_TABLE as RETRY
from support import SAMPLES_RECEIVER as RECEIVER
from support import SENDER_FORWARD as FORWARD
from support import (
    DaemonProcess,
    message_ids,
    pg_connect,
    pg_count,
    pg_create_queue,
    pg_rows,
    pg_send,
    sfbridge,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration


def installed(tmp_path: Path, strings: dict[str, str], destination: str) -> Path:
    """A config whose forwarder in `sender` routes everything to `destination`, installed."""
    config = {
        "databases": {
            key: {"dialect": "postgresql", "connection": string} for key, string in strings.items()
        },
        "forwarders": [{"name": "sender", "database": "sender", "queue": FORWARD}],
        "routes": [{"match": "*", "database": destination}],
        "retries": {"delay": "1s"},
    }
    path = write_config(tmp_path / "sfbridge.yaml", config)
    result = sfbridge("-c", str(path), "install")
    assert result.returncode == 0, result.stdout + result.stderr
    return path


def connect_as(path: Path, database: str, role: str) -> None:
    """The config reaches `database` as `role` from now on."""
    raw = yaml.safe_load(path.read_text())
    connection = raw["databases"][database]["connection"]
    raw["databases"][database]["connection"] = connection.replace("Uid=postgres", f"Uid={role}")
    write_config(path, raw)


@contextmanager
def login(postgres: Any, connect_to: str, databases: Iterable[str]) -> Iterator[str]:
    """A new login that may connect to database `connect_to` and nothing more; at the end it
    and `databases` are dropped."""
    role = f"sfb_grants_{uuid.uuid4().hex[:8]}"
    with postgres.admin() as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f'GRANT CONNECT ON DATABASE "{connect_to}" TO {role}')
    try:
        yield role
    finally:
        with postgres.admin() as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ?", role
            )
            for name in databases:
                admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            admin.execute(f"DROP ROLE {role}")


@pytest.fixture
def world(tmp_path: Path, postgres: Any) -> Iterator[dict[str, Any]]:
    """A sender and a receiver database, installed, the receiver's queue created, and a login
    `role` that may connect to the receiver and use the bridge's ledger there, but has no
    right on the queue yet; the config reaches the receiver as that login."""
    names = {"sender": postgres.create_database(), "receiver": postgres.create_database()}
    strings = {key: postgres.connection_string(name) for key, name in names.items()}
    path = installed(tmp_path, strings, "receiver")
    pg_create_queue(strings["receiver"], RECEIVER)
    with login(postgres, names["receiver"], names.values()) as role:
        with pg_connect(strings["receiver"]) as connection:
            connection.execute(f"GRANT SELECT, INSERT, DELETE ON public.sfbridge_ledger TO {role}")
            connection.commit()
        connect_as(path, "receiver", role)
        yield {"config": path, "role": role, **strings}


def grant(world: dict[str, Any], *statements: str) -> None:
    with pg_connect(world["receiver"]) as connection:
        for statement in statements:
            connection.execute(statement.format(role=world["role"], queue=RECEIVER))
        connection.commit()


def test_a_queue_the_login_may_not_write_keeps_its_messages_waiting_with_the_grant_to_run(
    world: dict[str, Any], tmp_path: Path
) -> None:
    grant(world, "GRANT SELECT ON {queue} TO {role}")  # may read, may not write
    with DaemonProcess(world["config"], tmp_path / "daemon.log") as daemon:
        ids = pg_send(world["sender"], FORWARD, 12, body=b"x" * 100)

        def waiting() -> list[tuple[Any, ...]]:
            return pg_rows(world["sender"], f"SELECT last_error, attempts FROM {RETRY}")

        wait_until(lambda: len(waiting()) == 12, 30, "every message in retry storage")
        errors = {error for error, _ in waiting()}
        assert len(errors) == 1, errors
        (error,) = errors
        role = world["role"]
        assert "may not write rows into destination queue" in error
        assert "permission denied" in error
        # Both rights it lacks, exactly: INSERT on the queue and its Seq column's sequence.
        assert f'GRANT INSERT ON "public"."Samples.Receiver" TO "{role}";' in error
        assert f'GRANT USAGE ON SEQUENCE public."Samples.Receiver_seq_seq" TO "{role}";' in error
        grant(
            world,
            "GRANT INSERT ON {queue} TO {role}",
            'GRANT USAGE ON SEQUENCE public."Samples.Receiver_seq_seq" TO {role}',
        )
        wait_until(lambda: pg_count(world["receiver"], RECEIVER) == 12, 30, "delivery")
        assert daemon.stop() == 0, daemon.output()
    received = message_ids(world["receiver"], RECEIVER)
    assert set(received) == ids and max(received.values()) == 1
    assert pg_count(world["sender"], RETRY) == 0
    assert pg_count(world["sender"], ERROR) == 0


def test_a_queue_the_login_may_write_but_not_read_is_written_with_statements(
    world: dict[str, Any], tmp_path: Path
) -> None:
    grant(
        world,
        "GRANT INSERT ON {queue} TO {role}",  # no SELECT: least privilege
        'GRANT USAGE ON SEQUENCE public."Samples.Receiver_seq_seq" TO {role}',
    )
    with DaemonProcess(world["config"], tmp_path / "daemon.log") as daemon:
        ids = pg_send(world["sender"], FORWARD, 40, body=b"x" * 100)
        wait_until(lambda: pg_count(world["receiver"], RECEIVER) == 40, 30, "first delivery")
        ids |= pg_send(world["sender"], FORWARD, 40, body=b"y" * 100)
        wait_until(lambda: pg_count(world["receiver"], RECEIVER) == 80, 30, "second delivery")
        assert daemon.stop() == 0, daemon.output()
    received = message_ids(world["receiver"], RECEIVER)
    assert set(received) == ids and max(received.values()) == 1
    assert pg_count(world["sender"], RETRY) == 0
    output = daemon.output()
    assert output.count("does not take COPY (its columns cannot be read") == 1, output


def test_worker_processes_say_once_that_a_queue_does_not_take_copy(
    world: dict[str, Any], tmp_path: Path
) -> None:
    """Every worker process finds out by itself that the table refuses COPY; it is one fact
    about the table, logged once by the daemon."""
    grant(
        world,
        "GRANT INSERT ON {queue} TO {role}",
        'GRANT USAGE ON SEQUENCE public."Samples.Receiver_seq_seq" TO {role}',
    )
    raw = yaml.safe_load(world["config"].read_text())
    raw["daemon"] = {"processes": 2}
    raw["forwarders"][0].update(concurrency=4, peek_interval="50ms")
    write_config(world["config"], raw)

    def slots() -> set[int]:
        rows = pg_rows(
            world["sender"], "SELECT slot, value FROM sfbridge_counters WHERE counter = 'delivered'"
        )
        return {int(slot) for slot, value in rows if int(value) > 0}

    ids: set[str] = set()
    with DaemonProcess(world["config"], tmp_path / "daemon.log") as daemon:
        daemon.wait_for_output("in process 2 of 2")
        # Workers 0-1 are the daemon's process, 2-3 the worker process: send until both wrote
        # (bursts of several full batches, which bring the worker process in).
        for _ in range(10):
            ids |= pg_send(world["sender"], FORWARD, 3000, body=b"x" * 100)
            sent = len(ids)
            wait_until(
                lambda: pg_count(world["receiver"], RECEIVER) == sent,  # noqa: B023
                30,
                "the deliveries",
            )
            if slots() & {0, 1} and slots() & {2, 3}:
                break
        assert slots() & {0, 1} and slots() & {2, 3}, slots()
        assert daemon.stop() == 0, daemon.output()
    received = message_ids(world["receiver"], RECEIVER)
    assert set(received) == ids and max(received.values()) == 1
    output = daemon.output()
    assert output.count("does not take COPY (its columns cannot be read") == 1, output


def test_a_queue_in_the_forwarding_database_the_login_may_not_write_fails_alone(
    tmp_path: Path, postgres: Any
) -> None:
    """Local delivery runs inside the batch's source transaction: the rights are read there,
    and the messages for other queues in the same batch still go."""
    name = postgres.create_database()
    string = postgres.connection_string(name)
    local = '"public"."Samples.Local"'
    path = installed(tmp_path, {"sender": string}, "sender")
    pg_create_queue(string, RECEIVER)
    pg_create_queue(string, local)
    with login(postgres, name, [name]) as role:
        with pg_connect(string) as connection:
            connection.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
            connection.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
            connection.execute(f"REVOKE INSERT ON {local} FROM {role}")
            connection.commit()
        connect_as(path, "sender", role)
        with DaemonProcess(path, tmp_path / "daemon.log") as daemon:
            good = pg_send(string, FORWARD, 10, body=b"x" * 10)
            held = pg_send(string, FORWARD, 5, destination=local, body=b"y" * 10)
            wait_until(lambda: pg_count(string, RECEIVER) == 10, 30, "the other queue's messages")
            wait_until(lambda: pg_count(string, RETRY) == 5, 30, "the local queue's in retries")
            (error,) = {row[0] for row in pg_rows(string, f"SELECT last_error FROM {RETRY}")}
            assert f'GRANT INSERT ON "public"."Samples.Local" TO "{role}";' in error, error
            with pg_connect(string) as connection:
                connection.execute(f"GRANT INSERT ON {local} TO {role}")
                connection.commit()
            wait_until(lambda: pg_count(string, local) == 5, 30, "the local queue's delivery")
            assert daemon.stop() == 0, daemon.output()
        assert set(message_ids(string, RECEIVER)) == good
        received = message_ids(string, local)
        assert set(received) == held and max(received.values()) == 1
        assert pg_count(string, RETRY) == 0 and pg_count(string, ERROR) == 0


def test_check_names_the_grants_a_routed_queue_lacks_and_a_routed_queue_that_is_missing(
    world: dict[str, Any],
) -> None:
    """`check` looks at the queues routes name outright (not those behind a glob): one the
    login may not write gets the GRANTs to run, one that is not there is said to be missing,
    and both are fine once the DBA granted and the endpoint created its queue."""
    path = world["config"]
    raw = yaml.safe_load(path.read_text())
    raw["routes"] = [
        {"match": "Samples.Receiver", "database": "receiver"},
        {"match": "Samples.Other", "database": "receiver"},
        {"match": "*", "database": "receiver"},
    ]
    write_config(path, raw)

    def lines(subject: str) -> list[str]:
        result = sfbridge("-c", str(path), "check")
        return [line for line in result.stdout.splitlines() if f"{subject} to database" in line]

    [denied] = lines("route 'Samples.Receiver'")
    assert denied.startswith("PROBLEM"), denied
    assert (
        f'have a DBA run GRANT INSERT ON "public"."Samples.Receiver" TO "{world["role"]}"; '
        f'GRANT USAGE ON SEQUENCE public."Samples.Receiver_seq_seq" TO "{world["role"]}";'
    ) in denied
    assert "its shape is unchecked" in denied
    [missing] = lines("route 'Samples.Other'")
    assert missing.startswith("PROBLEM") and '"public"."Samples.Other" does not exist' in missing
    assert lines("route '*'") == []

    grant(world, "GRANT SELECT, INSERT ON {queue} TO {role}")
    grant(world, 'GRANT USAGE ON SEQUENCE public."Samples.Receiver_seq_seq" TO {role}')
    pg_create_queue(world["receiver"], '"public"."Samples.Other"')
    grant(world, 'GRANT SELECT, INSERT ON "public"."Samples.Other" TO {role}')
    grant(world, 'GRANT USAGE ON SEQUENCE public."Samples.Other_seq_seq" TO {role}')
    other = '"public"."Samples.Other"'
    for subject, table in (("Samples.Receiver", RECEIVER), ("Samples.Other", other)):
        assert lines(f"route '{subject}'") == [
            f"ok       route '{subject}' to database 'receiver': {table} has the NServiceBus "
            "queue shape"
        ]

    # A routed queue the login can read but that is not a queue table is said to be so, from
    # the columns read once for both questions (`check_queue_shape`).
    grant(world, 'ALTER TABLE "public"."Samples.Other" DROP COLUMN body')
    [misshapen] = lines("route 'Samples.Other'")
    assert misshapen.startswith("PROBLEM"), misshapen
    assert f"{other} is not an NServiceBus queue table: missing column(s) body" in misshapen
