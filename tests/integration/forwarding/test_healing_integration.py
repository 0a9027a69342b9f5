"""Databases that come back heal themselves: the bridge recreates the tables it owns.

These replay the store-and-forward sample's verification steps the way they happen: the
receiver's database is deleted while the bridge runs, messages are sent, and the receiver is
restarted by its own installer, which recreates the database and only its own queue table.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import ERROR_QUEUE as ERROR
from support import RETRY_TABLE as RETRY
from support import SAMPLES_RECEIVER as RECEIVER
from support import SENDER_FORWARD as FORWARD
from support import (
    DaemonProcess,
    message_ids,
    nsb_message_headers,
    pg_connect,
    pg_count,
    pg_create_queue,
    pg_nsb_send,
    pg_rows,
    pg_send,
    sfbridge,
    wait_for_rollbacks,
    wait_until,
    write_config,
)

from bridge.config import load_config
from bridge.connections import Connections
from bridge.forwarding.spine import BatchForwarder

pytestmark = pytest.mark.integration


def drop_database(postgres: Any, name: str) -> None:
    with postgres.admin() as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def create_database(postgres: Any, name: str) -> None:
    with postgres.admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')


def send(sender: str, count: int, destination: str | None = RECEIVER, **extra: str) -> set[str]:
    return pg_send(sender, FORWARD, count, destination=destination, body=b"x" * 100, **extra)


def publish(sender: str, count: int) -> set[str]:
    ids = set()
    with pg_connect(sender) as connection:
        for _ in range(count):
            headers = nsb_message_headers(
                None,
                **{
                    "$.store-and-forward.eventtype": "Shared.OrderAccepted, Shared",
                    "NServiceBus.MessageIntent": "Publish",
                },
            )
            ids.add(str(headers["NServiceBus.MessageId"]))
            pg_nsb_send(connection, FORWARD, headers, b"event")
        connection.commit()
    return ids


def status(config: Path) -> dict[str, Any]:
    result = sfbridge("-c", str(config), "status", "--json")
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def destination(config: Path, name: str) -> dict[str, Any]:
    for entry in status(config)["destinations"]:
        if entry["database"] == name:
            return entry  # type: ignore[no-any-return]
    return {}


def setup(tmp_path: Path, postgres: Any, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    names = {"sender": postgres.create_database(), "receiver": postgres.create_database()}
    strings = {role: postgres.connection_string(name) for role, name in names.items()}
    config = {
        "databases": {
            "sender": {"dialect": "postgresql", "connection": strings["sender"]},
            "receiver": {
                "dialect": "postgresql",
                "connection": strings["receiver"],
                "connect_timeout": "2s",
            },
        },
        "forwarders": [
            {"name": "sender", "database": "sender", "queue": FORWARD, "peek_interval": "200ms"}
        ],
        "routes": [{"match": "*", "database": "receiver"}],
        "retries": {"delay": "1s"},
        **(extra or {}),
    }
    path = write_config(tmp_path / "sfbridge.yaml", config)
    result = sfbridge("-c", str(path), "install")
    assert result.returncode == 0, result.stdout + result.stderr
    pg_create_queue(strings["receiver"], RECEIVER)
    return {"config": path, "names": names, **strings}


def test_the_receiver_database_recreated_by_its_own_installer_gets_every_message_once(
    tmp_path: Path, postgres: Any
) -> None:
    world = setup(tmp_path, postgres)
    sender, receiver = world["sender"], world["receiver"]
    with DaemonProcess(world["config"], tmp_path / "daemon.log") as daemon:
        before = send(sender, 20)
        wait_until(lambda: pg_count(receiver, RECEIVER) == 20, 30, "delivery while up")

        drop_database(postgres, world["names"]["receiver"])
        during = send(sender, 30)

        def waiting_for_the_receiver() -> bool:
            # Retry storage is read as it is; the state is published every 2 s.
            entry = destination(world["config"], "receiver")
            return entry.get("waiting") == 30 and entry.get("state") == "unreachable"

        wait_until(waiting_for_the_receiver, 30, "the messages to wait for the receiver")
        down = destination(world["config"], "receiver")
        assert down["state"] == "unreachable" and "does not exist" in down["last_error"]
        text = sfbridge("-c", str(world["config"]), "status").stdout
        assert "receiver     DOWN since" in text and "30 waiting" in text

        # The receiving endpoint starts again: its installer creates the database and its own
        # queue table, nothing else.
        create_database(postgres, world["names"]["receiver"])
        pg_create_queue(receiver, RECEIVER)
        wait_until(lambda: pg_count(receiver, RECEIVER) == 30, 60, "delivery after recreation")
        wait_until(
            lambda: destination(world["config"], "receiver").get("state") == "up",
            30,
            "status to show the receiver up",
        )
        assert daemon.stop() == 0, daemon.output()

    received = message_ids(receiver, RECEIVER)
    assert set(received) == during and max(received.values()) == 1
    assert not before & set(received)  # those went with the old database
    for table in (FORWARD, ERROR, RETRY):
        assert pg_count(sender, table) == 0, table
    log = daemon.output()
    assert 'created the dedup ledger "public"."sfbridge_ledger"' in log
    assert "missing-queue" not in log and "ledger cleanup skipped" not in log


def test_a_recreated_multicast_subscriber_gets_every_event_once_and_the_others_at_once(
    tmp_path: Path, postgres: Any
) -> None:
    shipping_name = postgres.create_database()
    shipping = postgres.connection_string(shipping_name)
    world = setup(
        tmp_path,
        postgres,
        {
            "subscriptions": {
                "Shared.OrderAccepted": ['"public"."Billing"', '"public"."Shipping"']
            },
        },
    )
    config = json.loads(json.dumps(load_config_raw(world["config"])))
    config["databases"]["shipping"] = {
        "dialect": "postgresql",
        "connection": shipping,
        "connect_timeout": "2s",
    }
    config["routes"] = [
        {"match": "Shipping", "database": "shipping"},
        {"match": "*", "database": "receiver"},
    ]
    write_config(world["config"], config)
    assert sfbridge("-c", str(world["config"]), "install").returncode == 0
    pg_create_queue(world["receiver"], '"public"."Billing"')
    pg_create_queue(shipping, '"public"."Shipping"')

    with DaemonProcess(world["config"], tmp_path / "daemon.log") as daemon:
        drop_database(postgres, shipping_name)
        events = publish(world["sender"], 30)
        wait_until(
            lambda: pg_count(world["receiver"], '"public"."Billing"') == 30,
            30,
            "billing to get every event while shipping is gone",
        )
        create_database(postgres, shipping_name)
        pg_create_queue(shipping, '"public"."Shipping"')
        wait_until(
            lambda: pg_count(shipping, '"public"."Shipping"') == 30, 60, "shipping to catch up"
        )
        assert daemon.stop() == 0, daemon.output()

    for connection_string, table in (
        (world["receiver"], '"public"."Billing"'),
        (shipping, '"public"."Shipping"'),
    ):
        received = message_ids(connection_string, table)
        assert set(received) == events and max(received.values()) == 1, table
    assert pg_count(world["sender"], ERROR) == 0
    assert pg_count(world["sender"], RETRY) == 0


def load_config_raw(path: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(path.read_text())  # type: ignore[no-any-return]


def pg_count_if_there(connection_string: str, table: str) -> int | None:
    """Rows in `table`, or None while it does not exist."""
    with pg_connect(connection_string) as connection:
        exists = connection.execute("SELECT to_regclass(?)", table).fetchone()[0]
    return None if exists is None else pg_count(connection_string, table)


def test_the_bridges_own_tables_in_the_forwarding_database_come_back_when_dropped(
    tmp_path: Path, postgres: Any
) -> None:
    world = setup(tmp_path, postgres)
    sender = world["sender"]
    with DaemonProcess(world["config"], tmp_path / "daemon.log") as daemon:
        send(sender, 5)
        wait_until(lambda: pg_count(world["receiver"], RECEIVER) == 5, 30, "first delivery")
        with pg_connect(sender) as connection:
            for table in (ERROR, RETRY, '"public"."sfbridge_counters"'):
                connection.execute(f"DROP TABLE {table}")
            connection.commit()
        good = send(sender, 10)
        unroutable = send(sender, 1, destination=None)
        wait_until(lambda: pg_count(world["receiver"], RECEIVER) == 15, 30, "delivery again")
        # The bad message may be claimed in a batch of its own (the other worker's), which
        # recreates the error queue: until it commits, the table is not there yet.
        wait_until(
            lambda: pg_count_if_there(sender, ERROR) == 1, 30, "the bad message in the error queue"
        )
        assert daemon.stop() == 0, daemon.output()
    assert set(message_ids(world["receiver"], RECEIVER)) >= good
    [(headers,)] = pg_rows(sender, f"SELECT headers FROM {ERROR}")
    assert json.loads(headers)["NServiceBus.MessageId"] in unroutable
    created = [
        line
        for line in daemon.output().splitlines()
        if "created what was missing in database 'sender'" in line
    ]
    assert any('error queue "public"."error"' in line for line in created), daemon.output()


def test_a_login_that_may_not_create_tables_keeps_messages_waiting_and_says_so(
    tmp_path: Path, postgres: Any
) -> None:
    world = setup(tmp_path, postgres, {"retries": {"delay": "1s", "during_outage": "wait"}})
    receiver_name = world["names"]["receiver"]
    role = f"sfb_limited_{uuid.uuid4().hex[:8]}"
    with postgres.admin() as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f'GRANT CONNECT ON DATABASE "{receiver_name}" TO {role}')
    with pg_connect(world["receiver"]) as connection:
        connection.execute("DROP TABLE public.sfbridge_ledger")
        connection.execute(f"GRANT SELECT, INSERT ON {RECEIVER} TO {role}")
        connection.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}")
        connection.commit()
    raw = load_config_raw(world["config"])
    limited = world["receiver"].replace("Uid=postgres", f"Uid={role}")
    assert limited != world["receiver"]
    raw["databases"]["receiver"]["connection"] = limited
    write_config(world["config"], raw)
    try:
        check = sfbridge("-c", str(world["config"]), "check")
        assert "dedup ledger" in check.stdout and "may not create tables" in check.stdout
        with DaemonProcess(world["config"], tmp_path / "daemon.log") as daemon:
            ids = send(world["sender"], 12)

            def not_ready_with_all_waiting() -> bool:
                entry = destination(world["config"], "receiver")
                return entry.get("state") == "not-ready" and entry.get("waiting") == 12

            wait_until(not_ready_with_all_waiting, 30, "status to say the receiver is not ready")
            entry = destination(world["config"], "receiver")
            assert "may not create" in entry["last_error"]
            assert "sfbridge_ledger" in entry["last_error"]
            assert pg_count(world["sender"], ERROR) == 0
            # Attempts are not spent while the database is not ready (during_outage: wait).
            assert pg_rows(world["sender"], f"SELECT max(attempts) FROM {RETRY}") == [(0,)]

            # The DBA creates the ledger and grants the bridge its use; delivery resumes.
            with pg_connect(world["receiver"]) as connection:
                connection.execute(
                    "CREATE TABLE public.sfbridge_ledger (message_id varchar(200) NOT NULL, "
                    "destination varchar(1000) NOT NULL, forwarded_at timestamp NOT NULL, "
                    "PRIMARY KEY (message_id, destination))"
                )
                connection.execute(f"GRANT SELECT, INSERT ON public.sfbridge_ledger TO {role}")
                connection.commit()
            wait_until(lambda: pg_count(world["receiver"], RECEIVER) >= 12, 30, "delivery")
            assert daemon.stop() == 0, daemon.output()
        received = message_ids(world["receiver"], RECEIVER)
        assert ids <= set(received) and max(received.values()) == 1
        log = daemon.output()
        assert log.count("is not ready for the bridge") == 1, log
        assert "does not exist in database" not in log  # never called a missing queue
    finally:
        with postgres.admin() as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ?", role
            )
        drop_database(postgres, receiver_name)  # with the role's grants in it
        with postgres.admin() as admin:
            admin.execute(f"DROP ROLE {role}")


def test_with_runtime_ddl_off_a_missing_ledger_waits_and_names_the_ledger(
    tmp_path: Path, postgres: Any
) -> None:
    world = setup(tmp_path, postgres, {"install": {"at_runtime": False}})
    with pg_connect(world["receiver"]) as connection:
        connection.execute("DROP TABLE public.sfbridge_ledger")
        connection.commit()
    send(world["sender"], 4)
    config, _ = load_config(world["config"])
    connections = Connections(config.databases)
    try:
        report = BatchForwarder(config, config.forwarders[0], connections).forward_batch()
    finally:
        connections.close()
    assert report.counts == Counter({"retries-scheduled": 4})
    errors = {row[0] for row in pg_rows(world["sender"], f"SELECT last_error FROM {RETRY}")}
    [error] = errors
    assert '"public"."sfbridge_ledger" does not exist' in error
    assert "install.at_runtime is false" in error and "sfbridge install" in error
    assert "Samples.Receiver" not in error
    assert pg_rows(world["receiver"], "SELECT to_regclass('public.sfbridge_ledger')") == [(None,)]


def test_a_ledger_the_login_may_read_but_not_write_makes_the_database_wait_not_each_message(
    tmp_path: Path, postgres: Any
) -> None:
    world = setup(tmp_path, postgres, {"retries": {"delay": "1s", "during_outage": "wait"}})
    receiver_name = world["names"]["receiver"]
    role = f"sfb_reader_{uuid.uuid4().hex[:8]}"
    with postgres.admin() as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f'GRANT CONNECT ON DATABASE "{receiver_name}" TO {role}')
    with pg_connect(world["receiver"]) as connection:
        connection.execute(f"GRANT SELECT, INSERT ON {RECEIVER} TO {role}")
        connection.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}")
        connection.execute(f"GRANT SELECT ON public.sfbridge_ledger TO {role}")  # no INSERT
        connection.commit()
    raw = load_config_raw(world["config"])
    raw["databases"]["receiver"]["connection"] = world["receiver"].replace(
        "Uid=postgres", f"Uid={role}"
    )
    write_config(world["config"], raw)
    try:
        with DaemonProcess(world["config"], tmp_path / "daemon.log") as daemon:
            ids = send(world["sender"], 8)

            def not_ready_with_all_waiting() -> bool:
                entry = destination(world["config"], "receiver")
                return entry.get("state") == "not-ready" and entry.get("waiting") == 8

            wait_until(not_ready_with_all_waiting, 30, "the receiver to be not ready")
            entry = destination(world["config"], "receiver")
            assert "sfbridge_ledger" in entry["last_error"]
            assert "permission denied" in entry["last_error"]
            # Several probes, each of which tries the insert and rolls back, staying not ready.
            wait_for_rollbacks(world["receiver"], 3)
            assert pg_rows(world["sender"], f"SELECT max(attempts) FROM {RETRY}") == [(0,)]
            assert destination(world["config"], "receiver")["state"] == "not-ready"
            with pg_connect(world["receiver"]) as connection:
                connection.execute(f"GRANT INSERT ON public.sfbridge_ledger TO {role}")
                connection.commit()
            wait_until(lambda: pg_count(world["receiver"], RECEIVER) >= 8, 30, "delivery")
            assert daemon.stop() == 0, daemon.output()
        received = message_ids(world["receiver"], RECEIVER)
        assert ids <= set(received) and max(received.values()) == 1
        assert pg_count(world["sender"], ERROR) == 0
        assert daemon.output().count("is not ready for the bridge") == 1
    finally:
        with postgres.admin() as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ?", role
            )
        drop_database(postgres, receiver_name)
        with postgres.admin() as admin:
            admin.execute(f"DROP ROLE {role}")
