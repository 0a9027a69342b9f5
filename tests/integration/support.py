"""Test support: NServiceBus's own wire statements, config files, and the daemon as a process.

The statements here are written from the transport facts (nsb-wire §1.2, §2.1, §2.2), on
purpose independently of bridge/dialects: a test that reads and writes queues with the
bridge's own SQL could not catch a wire incompatibility.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pyodbc
import yaml

NSB_PG_CREATE_QUEUE = """CREATE TABLE IF NOT EXISTS {0} (
    Id uuid NOT NULL PRIMARY KEY, Expires TIMESTAMP, Headers TEXT NOT NULL, Body BYTEA,
    Seq serial NOT NULL UNIQUE)"""
NSB_PG_SEND = """INSERT INTO {0} (Id, Expires, Headers, Body)
VALUES (?, (now() AT TIME ZONE 'UTC') + (? || ' ms')::INTERVAL, ?, ?)"""
NSB_PG_RECEIVE = """DELETE FROM {0} rs
WHERE rs.id = (SELECT id FROM {0} ORDER BY Seq LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING rs.id,
          CASE WHEN Expires IS NULL THEN 0
               WHEN Expires > now() AT TIME ZONE 'UTC' THEN 0 ELSE 1 END Expired,
          rs.Headers, rs.Body, rs.Expires"""


def pg_connect(connection_string: str) -> pyodbc.Connection:
    pyodbc.native_uuid = True
    return pyodbc.connect(
        connection_string + "Protocol=7.4-0;ByteaAsLongVarBinary=1;", autocommit=False
    )


def pg_create_queue(connection_string: str, qualified: str) -> None:
    with pg_connect(connection_string) as connection:
        connection.execute(NSB_PG_CREATE_QUEUE.format(qualified))
        connection.commit()


def nsb_message_headers(destination: str | None, **extra: str | None) -> dict[str, str | None]:
    message_id = str(uuid.uuid4())
    headers: dict[str, str | None] = {
        "NServiceBus.MessageId": message_id,
        "NServiceBus.MessageIntent": "Send",
        "NServiceBus.ConversationId": str(uuid.uuid4()),
        "NServiceBus.CorrelationId": message_id,
        "NServiceBus.ReplyToAddress": '"public"."Samples.Sender"',
        "NServiceBus.EnclosedMessageTypes": "Shared.OrderSubmitted, Shared, Version=1.0.0.0",
        "NServiceBus.ContentType": "application/json",
        "NServiceBus.TimeSent": "2026-11-21 10:06:20:123456 Z",
        "NServiceBus.Version": "9.2.0",
    }
    if destination is not None:
        headers["$.store-and-forward.destination"] = destination
    headers.update(extra)
    return headers


def pg_nsb_send(
    connection: pyodbc.Connection,
    qualified: str,
    headers: Mapping[str, str | None] | str,
    body: bytes | None,
    ttbr_ms: int | None = None,
) -> None:
    """Send exactly as the PostgreSQL transport does (nsb-wire §2.1); caller commits."""
    text = headers if isinstance(headers, str) else json.dumps(dict(headers))
    connection.execute(
        NSB_PG_SEND.format(qualified),
        uuid.uuid4(),
        None if ttbr_ms is None else str(ttbr_ms),
        text,
        body,
    )


def pg_nsb_receive_all(connection_string: str, qualified: str) -> list[dict[str, Any]]:
    """Receive every message exactly as the PostgreSQL transport does (one row per DELETE)."""
    received: list[dict[str, Any]] = []
    with pg_connect(connection_string) as connection:
        while True:
            cursor = connection.execute(NSB_PG_RECEIVE.format(qualified))
            row = cursor.fetchone() if cursor.description is not None else None
            connection.commit()
            if row is None:
                return received
            received.append(
                {
                    "id": row[0],
                    "expired": row[1],
                    "headers": json.loads(row[2]),
                    "body": bytes(row[3]) if row[3] is not None else None,
                    "expires": row[4],
                }
            )


def pg_count(connection_string: str, qualified: str) -> int:
    with pg_connect(connection_string) as connection:
        value = connection.execute(f"SELECT count(*) FROM {qualified}").fetchone()[0]
        connection.commit()
        return int(value)


def pg_rows(connection_string: str, sql: str) -> list[tuple[Any, ...]]:
    with pg_connect(connection_string) as connection:
        cursor = connection.execute(sql)
        rows = [tuple(row) for row in cursor.fetchall()] if cursor.description else []
        connection.commit()
        return rows


def write_config(path: Path, config: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    return path


def sfbridge(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user would, in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


class DaemonProcess:
    """`sfbridge run` in a subprocess."""

    def __init__(self, config: Path, log: Path, env: Mapping[str, str] | None = None) -> None:
        self.log_path = log
        self._log = log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bridge", "-c", str(config), "run"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait; returns the exit code."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=timeout)
        self._log.close()
        return code

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)
        self._log.close()

    def output(self) -> str:
        return self.log_path.read_text()

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        if not self._log.closed:
            self._log.close()


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
