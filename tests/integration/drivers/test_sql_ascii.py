"""A PostgreSQL database created with ENCODING 'SQL_ASCII' (it stores bytes, converts nothing):
psycopg would hand its text over as bytes; the bridge reads and writes it as UTF-8 text, so
`status` works (it crashed with a TypeError) and messages cross intact."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import DaemonProcess, pg_create_queue, pg_rows, wait_until
from support.pairs import make_pg_pair, message_ids

pytestmark = pytest.mark.integration


@pytest.fixture
def sql_ascii_database(postgres: Any) -> Iterator[Callable[[], str]]:
    def create() -> str:
        name = f"sfbtest_ascii_{uuid.uuid4().hex[:8]}"
        with postgres.admin() as admin:
            admin.execute(
                f"CREATE DATABASE \"{name}\" ENCODING 'SQL_ASCII' LC_COLLATE 'C' "
                "LC_CTYPE 'C' TEMPLATE template0"
            )
        postgres.created.append(name)
        return str(postgres.connection_string(name))

    yield create


def test_status_and_forwarding_work_on_sql_ascii_databases(
    tmp_path: Path,
    sql_ascii_database: Callable[[], str],
    start_daemon: Callable[..., DaemonProcess],
) -> None:
    sender, receiver = sql_ascii_database(), sql_ascii_database()
    assert pg_rows(sender, "SHOW server_encoding") == [("SQL_ASCII",)]
    pair = make_pg_pair(tmp_path, sender, receiver, create_queue=False)
    ids = pair.send(2, **{"Zürich": "Grüße 🎉"})
    daemon = start_daemon(pair.config)
    # The receiver's queue is missing: the messages wait with an error, a destination state.
    wait_until(
        lambda: pair.status()["forwarders"][0]["waiting_for_retry"] == 2, 30, "retry storage"
    )
    wait_until(
        lambda: any(d["database"] == "receiver" for d in pair.status()["destinations"]),
        30,
        "the receiver's state",
    )
    text = pair.cli("status")
    assert text.returncode == 0, text.stdout + text.stderr
    assert "does not exist in database 'receiver'" in text.stdout
    as_json = pair.cli("status", "--json")
    assert as_json.returncode == 0, as_json.stderr
    [retry] = json.loads(as_json.stdout)["forwarders"][0]["retries"]
    assert isinstance(retry["last_error"], str) and isinstance(retry["destination"], str)

    pg_create_queue(receiver, pair.queue)
    wait_until(lambda: pair.delivered() == 2, 30, "delivery")
    assert daemon.stop() == 0, daemon.output()
    [row] = pg_rows(receiver, f"SELECT headers FROM {pair.queue} LIMIT 1")
    assert json.loads(row[0])["Zürich"] == "Grüße 🎉"
    assert set(message_ids(receiver, pair.queue)) == ids
