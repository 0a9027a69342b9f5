"""Operating the bridge: reload, secrets in logs, racing installers, competing daemons, ledger."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support import (
    DaemonProcess,
    nsb_message_headers,
    pg_connect,
    pg_count,
    pg_create_queue,
    pg_nsb_receive_all,
    pg_nsb_send,
    pg_rows,
    sfbridge,
    wait_until,
    write_config,
)

from bridge.config import load_config
from bridge.storage.ledger import cleanup_ledgers

pytestmark = pytest.mark.integration

SQLSERVER_SHAPED_QUEUE = """CREATE TABLE "{0}" (Id TEXT NOT NULL, CorrelationId TEXT,
    ReplyToAddress TEXT, Recoverable INTEGER NOT NULL, Expires TEXT, Headers TEXT NOT NULL,
    Body BLOB, RowVersion INTEGER PRIMARY KEY AUTOINCREMENT)"""
SQLSERVER_SHAPED_SEND = (
    'INSERT INTO "{0}" (Id, Recoverable, Expires, Headers, Body) VALUES (?, 1, NULL, ?, ?)'
)


def sqlite_send(path: Path, queue: str, destination: str) -> str:
    headers = nsb_message_headers(destination)
    with sqlite3.connect(path) as connection:
        connection.execute(
            SQLSERVER_SHAPED_SEND.format(queue), (str(uuid.uuid4()), json.dumps(headers), b"x")
        )
    return str(headers["NServiceBus.MessageId"])


def sqlite_count(path: Path, table: str) -> int:
    with sqlite3.connect(path) as connection:
        return int(connection.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])


def test_sighup_reloads_a_valid_config_and_keeps_running_on_an_invalid_one(tmp_path: Path) -> None:
    paths = {name: tmp_path / f"{name}.db" for name in ("edge", "a", "b")}
    config: dict[str, Any] = {
        "databases": {name: {"dialect": "sqlite", "path": str(p)} for name, p in paths.items()},
        "forwarders": [
            {"name": "edge", "database": "edge", "queue": "Forward", "peek_interval": "100ms"}
        ],
        "routes": [{"match": "A.*", "database": "a"}, {"match": "B.*", "database": "a"}],
        "retries": {"delay": "200ms"},
    }
    config_path = write_config(tmp_path / "sfbridge.yaml", config)
    assert sfbridge("-c", str(config_path), "install").returncode == 0
    for name in ("a", "b"):
        with sqlite3.connect(paths[name]) as connection:
            connection.execute(SQLSERVER_SHAPED_QUEUE.format("B.Queue"))

    with DaemonProcess(config_path, tmp_path / "daemon.log") as daemon:
        sqlite_send(paths["edge"], "Forward", "B.Queue")
        wait_until(lambda: sqlite_count(paths["a"], "B.Queue") == 1, 20, "first delivery to a")

        config_path.write_text("databases: {}\nforwarders: []\nroutes: [{match: x}]\n")
        daemon.process.send_signal(signal.SIGHUP)
        # The reason follows the "reload failed" line; the log may hold only the first so far.
        wait_until(lambda: "routes[0].database" in daemon.output(), 10, "the reload refused")
        assert "reload failed" in daemon.output()
        sqlite_send(paths["edge"], "Forward", "B.Queue")
        wait_until(lambda: sqlite_count(paths["a"], "B.Queue") == 2, 20, "old config still working")

        config["routes"][1]["database"] = "b"
        write_config(config_path, config)
        assert sfbridge("-c", str(config_path), "install").returncode == 0  # ledger in b
        daemon.process.send_signal(signal.SIGHUP)
        wait_until(lambda: "configuration reloaded" in daemon.output(), 10, "the reload")
        sqlite_send(paths["edge"], "Forward", "B.Queue")
        wait_until(
            lambda: sqlite_count(paths["b"], "B.Queue") == 1, 20, "delivery by the new route"
        )
        assert daemon.stop() == 0
    assert sqlite_count(paths["a"], "B.Queue") == 2


def test_passwords_never_reach_logs_status_or_the_error_queue(tmp_path: Path) -> None:
    secret = "S3cret-Passw0rd"
    edge = tmp_path / "edge.db"
    config_path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "edge": {"dialect": "sqlite", "path": str(edge)},
                "central": {
                    "dialect": "postgresql",
                    "connection": "${CENTRAL_ODBC}",
                    "connect_timeout": "1s",
                },
            },
            "forwarders": [
                {"name": "edge", "database": "edge", "queue": "Forward", "peek_interval": "100ms"}
            ],
            "routes": [{"match": "*", "database": "central"}],
            # Counted: the outage must send the message to the error queue, whose headers
            # are checked for the secret.
            "retries": {"delay": "200ms", "max_attempts": 3, "during_outage": "count"},
        },
    )
    env = {
        "CENTRAL_ODBC": "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=1;Database=x;"
        f"Uid=bridge;Pwd={secret};"
    }
    installed = sfbridge("-c", str(config_path), "install", env=env)
    assert installed.returncode == 3  # the central database cannot be reached to create its ledger
    assert secret not in installed.stdout + installed.stderr
    assert "database 'central'" in installed.stderr

    with DaemonProcess(config_path, tmp_path / "daemon.log", env) as daemon:
        sqlite_send(edge, "Forward", "Anything")
        wait_until(lambda: sqlite_count(edge, "error") == 1, 20, "the error queue")
        status = sfbridge("-c", str(config_path), "status", "-v", env=env)
        check = sfbridge("-c", str(config_path), "check", "-v", env=env)
        assert daemon.stop() == 0
    with sqlite3.connect(edge) as connection:
        error_headers = connection.execute('SELECT Headers FROM "error"').fetchone()[0]
    assert "cannot connect" in error_headers
    everything = daemon.output() + status.stdout + status.stderr + check.stdout + check.stderr
    assert "not delivered" in daemon.output()
    assert secret not in everything + error_headers


def test_installers_racing_on_one_database_all_succeed(
    new_pg_database: Any, tmp_path: Path
) -> None:
    for round_number in range(3):
        database = new_pg_database()
        config_path = write_config(
            tmp_path / f"race{round_number}.yaml",
            {
                "databases": {"db": {"dialect": "postgresql", "connection": database}},
                "forwarders": [
                    {"name": f"f{i}", "database": "db", "queue": f"q{i}", "error_queue": "error"}
                    for i in range(3)
                ],
                "routes": [{"match": "*", "database": "db"}],
            },
        )
        processes = [
            subprocess.Popen(
                [sys.executable, "-m", "bridge", "-c", str(config_path), "install"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        outcomes = [(p.wait(timeout=60), p.communicate()[1]) for p in processes]
        assert all(code == 0 for code, _ in outcomes), outcomes


@pytest.mark.slow
def test_competing_daemons_on_one_queue_deliver_each_message_once(
    new_pg_database: Any, tmp_path: Path
) -> None:
    sender, receiver = new_pg_database(), new_pg_database()
    config_path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": sender},
                "receiver": {"dialect": "postgresql", "connection": receiver},
            },
            "forwarders": [
                {
                    "name": "s",
                    "database": "sender",
                    "queue": "forward",
                    "batch_size": 20,
                    "concurrency": 3,
                    "peek_interval": "100ms",
                }
            ],
            "routes": [{"match": "*", "database": "receiver"}],
        },
    )
    assert sfbridge("-c", str(config_path), "install").returncode == 0
    pg_create_queue(receiver, '"public"."Receiver"')
    daemons = [DaemonProcess(config_path, tmp_path / f"d{i}.log") for i in range(3)]
    try:
        # Every daemon runs before there is work (the queue drains in about the time a
        # daemon takes to start); the messages then appear for all of them at once.
        # Started means listening too: a daemon whose LISTEN came after the sends would wait
        # for its 5 s safety poll, and the others drain the queue well before (CI saw it).
        for daemon in daemons:
            wait_until(
                lambda d=daemon: "worker(s) on" in d.output() and "table(s) push" in d.output(),
                30,
                "a daemon to start and listen",
            )
        ids = set()
        with pg_connect(sender) as connection:
            for _ in range(3000):
                headers = nsb_message_headers('"public"."Receiver"')
                ids.add(headers["NServiceBus.MessageId"])
                pg_nsb_send(connection, '"public"."forward"', headers, b"payload")
            connection.commit()
        wait_until(lambda: pg_count(sender, '"public"."forward"') == 0, 90, "the queue to drain")
        assert [daemon.stop() for daemon in daemons] == [0, 0, 0]
    finally:
        for daemon in daemons:
            daemon.__exit__()
    received = Counter(
        m["headers"]["NServiceBus.MessageId"]
        for m in pg_nsb_receive_all(receiver, '"public"."Receiver"')
    )
    assert set(received) == ids and max(received.values()) == 1
    # Every daemon did some of the work: they really competed.
    assert all("delivered" in daemon.output() for daemon in daemons)


def test_ledger_cleanup_removes_only_entries_older_than_the_retention(
    new_pg_database: Any, tmp_path: Path
) -> None:
    sender, receiver = new_pg_database(), new_pg_database()
    config_path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": sender},
                "receiver": {"dialect": "postgresql", "connection": receiver},
            },
            "forwarders": [{"name": "s", "database": "sender", "queue": "forward"}],
            "routes": [{"match": "*", "database": "receiver"}],
            "ledger": {"retention": "7d"},
        },
    )
    assert sfbridge("-c", str(config_path), "install").returncode == 0
    now = datetime.now(UTC).replace(tzinfo=None)
    with pg_connect(receiver) as connection:
        for message_id, age in (("old", timedelta(days=8)), ("recent", timedelta(days=6))):
            connection.execute(
                'INSERT INTO "public"."sfbridge_ledger" VALUES (?, ?, ?)',
                message_id,
                '"public"."q"',
                now - age,
            )
        connection.commit()
    config, _ = load_config(config_path)
    assert cleanup_ledgers(config) == 1
    assert pg_rows(receiver, 'SELECT message_id FROM "public"."sfbridge_ledger"') == [("recent",)]


def test_send_puts_nservicebus_shaped_messages_into_the_forwarding_queue(
    new_pg_database: Any, tmp_path: Path
) -> None:
    sender = new_pg_database()
    config_path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {"sender": {"dialect": "postgresql", "connection": sender}},
            "forwarders": [{"name": "s", "database": "sender", "queue": "forward"}],
            "routes": [{"match": "*", "database": "sender"}],
        },
    )
    assert sfbridge("-c", str(config_path), "install").returncode == 0
    result = sfbridge(
        "-c",
        str(config_path),
        "send",
        '"public"."Target"',
        "--count",
        "5",
        "--ttbr",
        "1h",
        "--header",
        "Custom=yes",
        "--body",
        "hello",
    )
    assert result.returncode == 0, result.stderr
    assert "sent 5 message(s)" in result.stdout
    rows = pg_rows(sender, 'SELECT headers, body, expires FROM "public"."forward"')
    assert len(rows) == 5
    for headers_text, body, expires in rows:
        headers = json.loads(headers_text)
        assert headers["$.store-and-forward.destination"] == '"public"."Target"'
        assert headers["Custom"] == "yes" and headers["NServiceBus.MessageIntent"] == "Send"
        assert bytes(body) == b"hello"
        assert timedelta(minutes=59) < expires - datetime.now(UTC).replace(tzinfo=None)
    bad = sfbridge("-c", str(config_path), "send", "x", "--header", "novalue")
    assert bad.returncode == 2 and "NAME=VALUE" in bad.stderr


def test_check_reports_a_queue_without_its_receive_index(
    new_pg_database: Any, tmp_path: Path
) -> None:
    sender = new_pg_database()
    with pg_connect(sender) as connection:
        connection.execute(
            "CREATE TABLE forward (Id uuid NOT NULL PRIMARY KEY, Expires timestamp,"
            " Headers text NOT NULL, Body bytea, Seq serial NOT NULL)"
        )
        connection.commit()
    config_path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {"sender": {"dialect": "postgresql", "connection": sender}},
            "forwarders": [{"name": "s", "database": "sender", "queue": "forward"}],
            "routes": [{"match": "*", "database": "sender"}],
        },
    )
    assert sfbridge("-c", str(config_path), "install").returncode == 0
    result = sfbridge("-c", str(config_path), "check")
    assert result.returncode == 1
    assert "has no index on seq" in result.stdout


def test_an_invalid_config_lists_every_problem_and_exits_2_without_a_traceback(
    tmp_path: Path,
) -> None:
    config_path = tmp_path / "bad.yaml"
    config_path.write_text(
        "databases:\n  sender: {dialect: postgres, connection: x}\n"
        "forwarders:\n  - {name: s, database: sendr, queue: q, batchsize: 5}\n"
        "routes:\n  - {match: '*', database: recever}\n"
    )
    result = sfbridge("-c", str(config_path), "check")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    for expected in (
        "databases.sender.dialect",
        "forwarders[0].database",
        "'sender'",
        "forwarders[0].batchsize",
        "batch_size",
        "routes[0].database",
    ):
        assert expected in result.stderr, result.stderr


def test_install_print_sql_prints_ddl_per_database_without_connecting(tmp_path: Path) -> None:
    config_path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {
                    "dialect": "postgresql",
                    "connection": "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=1;",
                },
                "edge": {"dialect": "sqlite", "path": str(tmp_path / "never-created.db")},
            },
            "forwarders": [{"name": "s", "database": "sender", "queue": '"nsb"."Forward"'}],
            "routes": [{"match": "*", "database": "edge"}],
        },
    )
    result = sfbridge("-c", str(config_path), "install", "--print-sql")
    assert result.returncode == 0, result.stderr
    assert "-- ===== database: sender =====" in result.stdout
    assert 'CREATE SCHEMA IF NOT EXISTS "nsb";' in result.stdout
    assert 'CREATE TABLE IF NOT EXISTS "nsb"."Forward"' in result.stdout
    assert "-- ===== database: edge =====" in result.stdout
    assert 'CREATE TABLE IF NOT EXISTS "sfbridge_ledger"' in result.stdout
    assert not (tmp_path / "never-created.db").exists()
