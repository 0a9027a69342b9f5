"""Test support: NServiceBus's own wire statements, config files, and the daemon as a process.

The statements here are written from the transports' table shapes and statements, on
purpose independently of bridge/dialects: a test that reads and writes queues with the
bridge's own SQL could not catch a wire incompatibility.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pyodbc
import yaml

from bridge.exceptions import ConnectionLost

# The checkout: tests read its README, config examples and systemd unit.
REPO = Path(__file__).resolve().parents[2]

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
    """Send exactly as the PostgreSQL transport does; caller commits."""
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

    def __init__(
        self,
        config: Path,
        log: Path,
        env: Mapping[str, str] | None = None,
        prefix: Sequence[str] = (),
    ) -> None:
        """`prefix`: a command that runs the daemon's command line (its arguments) with exec."""
        self.log_path = log
        self._log = log.open("w")
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "bridge", "-c", str(config), "run"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    # Logged once the signal handlers are installed and the workers start.
    STARTED = "worker(s) on"

    def started(self) -> bool:
        """Whether the daemon has started its workers (or already exited)."""
        return self.process.poll() is not None or self.STARTED in self.output()

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait; returns the exit code. Waits first (up to `timeout`) for the
        daemon to have started: a SIGTERM before its handlers are installed kills it unclean
        (exit -15), which is not what a test stopping it means to check."""
        deadline = time.monotonic() + timeout
        while not self.started() and time.monotonic() < deadline:
            time.sleep(0.1)
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

    def wait_for_output(self, text: str, timeout: float = 30, count: int = 1) -> None:
        """Wait until `text` is in the log `count` times (the daemon still running)."""

        def logged() -> bool:
            assert self.process.poll() is None, self.output()
            return self.output().count(text) >= count

        wait_until(logged, timeout, f"{text!r} in the log")

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        if not self._log.closed:
            self._log.close()


# The sample's sender and receiver queues, as `install_pg_pair` and `send_to_receiver` use them.
SENDER_FORWARD = '"public"."Samples.Sender.Forward"'
SAMPLES_RECEIVER = '"public"."Samples.Receiver"'
# The bridge's error queue and retry storage in a PostgreSQL forwarding database (defaults).
ERROR_QUEUE = '"public"."error"'
RETRY_TABLE = '"public"."sfbridge_retry"'


def install_pg_pair(
    tmp_path: Path,
    sender: str,
    receiver: str,
    *,
    route: Mapping[str, Any] | None = None,
    **forwarder: Any,
) -> dict[str, Any]:
    """`make_pg_pair` (support.pairs) as a dict: config path and both connection strings."""
    pair = make_pg_pair(tmp_path, sender, receiver, route=route, forwarder=forwarder)
    return {"config": pair.config, "sender": pair.sender, "receiver": pair.receiver}


def send_to_receiver(sender: str, count: int, body: bytes) -> set[str]:
    """`count` messages for the receiver into the sender's forwarding queue, in one
    transaction; their message ids."""
    return pg_send(sender, SENDER_FORWARD, count, body=body)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


# --------------------------------------------------------------------------------------------
# Spark: a forwarder and a receiver, bulk sends, the spark commands
# --------------------------------------------------------------------------------------------

FORWARD = '"public"."forward"'
RECEIVER = '"public"."Receiver"'
# The JVMs of the Spark tests (drivers, a standalone cluster's master, worker and executors)
# compile with C1 only: their jobs are short and the data moves through Python workers, and
# C2's compiler threads were about 40 % of a drain's JVM CPU (20.4 s against 12.4 s for a
# drain of 3,000 messages, measured with process accounting), on a suite that is CPU-bound.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
SPARK_ENV = {"SPARK_LOCAL_IP": "127.0.0.1", "JAVA_TOOL_OPTIONS": TEST_JVM_OPTIONS}


def spark_world(tmp_path: Path, new_pg_database: Any) -> dict[str, Any]:
    """Two fresh databases, a forwarder `f` in `sender`, routes to `Receiver` and `Missing*`
    (a table that does not exist: those messages go to the error queue) in `receiver`."""
    sender, receiver = new_pg_database(), new_pg_database()
    path = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": sender},
                "receiver": {"dialect": "postgresql", "connection": receiver},
            },
            "forwarders": [
                {"name": "f", "database": "sender", "queue": FORWARD, "peek_interval": "200ms"}
            ],
            "routes": [
                {"match": "Receiver", "database": "receiver"},
                {"match": "Missing*", "database": "receiver"},
            ],
            "retries": {"missing_queue": "error"},
        },
    )
    assert sfbridge("-c", str(path), "install").returncode == 0
    pg_create_queue(receiver, RECEIVER)
    return {"config": path, "sender": sender, "receiver": receiver}


def send_bulk(
    sender: str, count: int, destination: str = RECEIVER, queue: str | None = None
) -> set[str]:
    """NServiceBus-shaped messages into `queue` (default: the Spark world's forwarding queue),
    500 per multi-row INSERT (as fast as a busy endpoint), in one transaction."""
    ids: set[str] = set()
    with pg_connect(sender) as connection:
        for start in range(0, count, 500):
            rows = []
            for _ in range(min(500, count - start)):
                headers = nsb_message_headers(destination)
                ids.add(str(headers["NServiceBus.MessageId"]))
                rows.append(json.dumps(headers))
            values = ", ".join(["(gen_random_uuid(), NULL, ?, 'body'::bytea)"] * len(rows))
            connection.execute(
                f"INSERT INTO {queue or FORWARD} (id, expires, headers, body) VALUES {values}",
                *rows,
            )
        connection.commit()
    return ids


def run_spark(config: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`sfbridge -c CONFIG spark ARGS...`, as a user runs it."""
    return sfbridge("-c", str(config), "spark", *args, env=SPARK_ENV, timeout=timeout)


def received_ids(world: dict[str, Any]) -> Counter[str]:
    """The message ids in the receiver's queue, each with how often it is there."""
    return Counter(
        m["headers"]["NServiceBus.MessageId"]
        for m in pg_nsb_receive_all(world["receiver"], RECEIVER)
    )


# --------------------------------------------------------------------------------------------
# SQL Server, as the transport writes and reads it
# --------------------------------------------------------------------------------------------

NSB_SQLSERVER_CREATE_QUEUE = """IF OBJECT_ID(?, 'U') IS NULL
BEGIN
    CREATE TABLE {0} (
        Id uniqueidentifier NOT NULL,
        CorrelationId varchar(255),
        ReplyToAddress varchar(255),
        Recoverable bit NOT NULL,
        Expires datetime,
        Headers nvarchar(max) NOT NULL,
        Body varbinary(max),
        RowVersion bigint IDENTITY(1,1) NOT NULL
    )
    CREATE NONCLUSTERED INDEX Index_RowVersion ON {0} ([RowVersion] ASC)
    CREATE NONCLUSTERED INDEX Index_Expires ON {0} (Expires) INCLUDE (Id, RowVersion)
        WHERE Expires IS NOT NULL
END"""
# The transport binds typed parameters (@Headers nvarchar(max), @Body varbinary(max)); pyodbc
# binds by Python type, so the CASTs stand in for those declarations.
NSB_SQLSERVER_SEND = """INSERT INTO {0} (Id, Recoverable, Expires, Headers, Body)
VALUES (?, 1,
        CASE WHEN ? IS NOT NULL THEN DATEADD(ms, ?, GETUTCDATE()) END,
        CAST(? AS nvarchar(max)), CAST(? AS varbinary(max)))"""
NSB_SQLSERVER_RECEIVE = """WITH message AS (
    SELECT TOP(1) * FROM {0} WITH (UPDLOCK, READPAST, ROWLOCK)
    ORDER BY RowVersion)
DELETE FROM message
OUTPUT deleted.Id,
       CASE WHEN deleted.Expires IS NULL THEN 0
            ELSE CASE WHEN deleted.Expires > GETUTCDATE() THEN 0 ELSE 1 END END,
       deleted.Headers,
       deleted.Body,
       deleted.Expires"""


def sqlserver_connection_string(prefix: str, database: str | None = None) -> str:
    """`prefix` (an ODBC connection string) with `Database` set, FreeTDS options added."""
    pairs = [
        part
        for part in prefix.split(";")
        if part.strip()
        and part.split("=", 1)[0].strip().lower() not in ("database", "initial catalog")
    ]
    if "tds" in prefix.lower() and "clientcharset" not in prefix.lower():
        pairs.append("ClientCharset=UTF-8")
    if "freetds" in prefix.lower() and "tds_version" not in prefix.lower():
        pairs.append("TDS_Version=7.4")
    if database is not None:
        pairs.append(f"Database={database}")
    return ";".join(pairs) + ";"


def sqlserver_connect(connection_string: str, autocommit: bool = False) -> pyodbc.Connection:
    pyodbc.native_uuid = True
    return pyodbc.connect(connection_string, autocommit=autocommit, timeout=10)


SQLSERVER_VARIABLE = "SFBRIDGE_TEST_SQLSERVER"
NO_SQLSERVER = (
    f"{SQLSERVER_VARIABLE} is not set: no SQL Server to test against (set it to an ODBC "
    "connection string for a login that may create databases)"
)


class SqlServerTestServer:
    """Creates and drops databases on the server SFBRIDGE_TEST_SQLSERVER names."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.created: list[str] = []

    def connection_string(self, database: str) -> str:
        return sqlserver_connection_string(self.prefix, database)

    def create_database(self) -> str:
        name = f"sfbtest_{uuid.uuid4().hex[:10]}"
        with sqlserver_connect(sqlserver_connection_string(self.prefix), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE [{name}]")
        self.created.append(name)
        return name

    def drop_all(self) -> None:
        with sqlserver_connect(sqlserver_connection_string(self.prefix), autocommit=True) as admin:
            for name in self.created:
                admin.execute(
                    f"ALTER DATABASE [{name}] SET SINGLE_USER WITH ROLLBACK IMMEDIATE; "
                    f"DROP DATABASE [{name}]"
                )


# --------------------------------------------------------------------------------------------
# NServiceBus endpoints on each dialect, for tests that run the same scenario on all of them
# --------------------------------------------------------------------------------------------

# SQLite holds the SQL Server transport's shape; "sending" computes Expires on the database's
# clock, like DATEADD(ms, @ttbr, GETUTCDATE()).
NSB_SQLITE_CREATE_QUEUE = """CREATE TABLE IF NOT EXISTS "{0}" (
    Id TEXT NOT NULL, CorrelationId TEXT, ReplyToAddress TEXT, Recoverable INTEGER NOT NULL,
    Expires TEXT, Headers TEXT NOT NULL, Body BLOB,
    RowVersion INTEGER PRIMARY KEY AUTOINCREMENT)"""
NSB_SQLITE_SEND = """INSERT INTO "{0}" (Id, Recoverable, Expires, Headers, Body)
VALUES (?4, 1, CASE WHEN ?1 IS NULL THEN NULL ELSE strftime('%Y-%m-%d %H:%M:%f', 'now',
        printf('%+.3f seconds', ?1 / 1000.0)) END, ?2, ?3)"""
NSB_SQLITE_RECEIVE = """DELETE FROM "{0}" WHERE RowVersion = (SELECT min(RowVersion) FROM "{0}")
RETURNING Id, coalesce(Expires <= strftime('%Y-%m-%d %H:%M:%f', 'now'), 0), Headers, Body,
          Expires"""


def _as_datetime(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


class NsbEndpoint:
    """What an NServiceBus endpoint does to queue tables in one database, in its own SQL.

    `address(table)` is the queue's address as endpoints write it in headers; `send`
    returns the new row's Id; `receive_all` drains a queue one row per statement.
    """

    dialect: str

    def database_entry(self) -> dict[str, Any]:
        raise NotImplementedError

    def address(self, table: str) -> str:
        raise NotImplementedError

    def create_queue(self, table: str) -> None:
        raise NotImplementedError

    def send(
        self,
        table: str,
        messages: list[tuple[Mapping[str, str | None] | str, bytes | None, int | None]],
    ) -> list[uuid.UUID]:
        """Send (headers, body, time to be received in ms) messages in one transaction."""
        raise NotImplementedError

    def receive_all(self, table: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    def expires_by_message_id(self, table: str) -> dict[str, datetime | None]:
        """`Expires` of each queued message, by NServiceBus.MessageId, without receiving."""
        raise NotImplementedError

    def expired_count(self, table: str) -> int:
        """How many queued messages are past their `Expires` by the database's clock (as the
        transport judges it), without receiving."""
        raise NotImplementedError

    @staticmethod
    def _headers_text(headers: Mapping[str, str | None] | str) -> str:
        return headers if isinstance(headers, str) else json.dumps(dict(headers))

    @staticmethod
    def _received(row: Sequence[Any]) -> dict[str, Any]:
        return {
            "id": row[0] if isinstance(row[0], uuid.UUID) else uuid.UUID(str(row[0])),
            "expired": bool(row[1]),
            "headers_text": row[2],
            "headers": _loads_or_none(row[2]),
            "body": bytes(row[3]) if row[3] is not None else None,
            "expires": _as_datetime(row[4]),
        }


def _loads_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


class PostgresEndpoint(NsbEndpoint):
    dialect = "postgresql"

    def __init__(self, connection_string: str, driver: str | None = None) -> None:
        self.connection_string = connection_string
        self.driver = driver  # None: the bridge's default driver

    def database_entry(self) -> dict[str, Any]:
        entry = {"dialect": "postgresql", "connection": self.connection_string}
        return entry if self.driver is None else {**entry, "driver": self.driver}

    def qualified(self, table: str) -> str:
        return '"public"."' + table.replace('"', '""') + '"'

    def address(self, table: str) -> str:
        return self.qualified(table)

    def create_queue(self, table: str) -> None:
        pg_create_queue(self.connection_string, self.qualified(table))

    def send(
        self,
        table: str,
        messages: list[tuple[Mapping[str, str | None] | str, bytes | None, int | None]],
    ) -> list[uuid.UUID]:
        ids = []
        with pg_connect(self.connection_string) as connection:
            for headers, body, ttbr in messages:
                row_id = uuid.uuid4()
                connection.execute(
                    NSB_PG_SEND.format(self.qualified(table)),
                    row_id,
                    None if ttbr is None else str(ttbr),
                    self._headers_text(headers),
                    body,
                )
                ids.append(row_id)
            connection.commit()
        return ids

    def receive_all(self, table: str) -> list[dict[str, Any]]:
        received = []
        with pg_connect(self.connection_string) as connection:
            while True:
                cursor = connection.execute(NSB_PG_RECEIVE.format(self.qualified(table)))
                row = cursor.fetchone() if cursor.description is not None else None
                connection.commit()
                if row is None:
                    return received
                received.append(self._received(row))

    def expires_by_message_id(self, table: str) -> dict[str, datetime | None]:
        rows = pg_rows(
            self.connection_string, f"SELECT headers, expires FROM {self.qualified(table)}"
        )
        return {json.loads(h)["NServiceBus.MessageId"]: _as_datetime(e) for h, e in rows}

    def expired_count(self, table: str) -> int:
        table = self.qualified(table)
        sql = f"SELECT count(*) FROM {table} WHERE expires <= now() AT TIME ZONE 'UTC'"
        return int(pg_rows(self.connection_string, sql)[0][0])


class SqliteEndpoint(NsbEndpoint):
    dialect = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path

    def database_entry(self) -> dict[str, Any]:
        return {"dialect": "sqlite", "path": str(self.path)}

    def address(self, table: str) -> str:
        return table

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, isolation_level=None)

    def create_queue(self, table: str) -> None:
        connection = self._connect()
        try:
            connection.execute(NSB_SQLITE_CREATE_QUEUE.format(table.replace('"', '""')))
        finally:
            connection.close()

    def send(
        self,
        table: str,
        messages: list[tuple[Mapping[str, str | None] | str, bytes | None, int | None]],
    ) -> list[uuid.UUID]:
        ids = []
        connection = self._connect()
        try:
            connection.execute("BEGIN IMMEDIATE")
            for headers, body, ttbr in messages:
                row_id = uuid.uuid4()
                connection.execute(
                    NSB_SQLITE_SEND.format(table.replace('"', '""')),
                    (ttbr, self._headers_text(headers), body, str(row_id)),
                )
                ids.append(row_id)
            connection.execute("COMMIT")
        finally:
            connection.close()
        return ids

    def receive_all(self, table: str) -> list[dict[str, Any]]:
        received = []
        connection = self._connect()
        try:
            while True:
                connection.execute("BEGIN IMMEDIATE")
                row = connection.execute(
                    NSB_SQLITE_RECEIVE.format(table.replace('"', '""'))
                ).fetchone()
                connection.execute("COMMIT")
                if row is None:
                    return received
                received.append(self._received(row))
        finally:
            connection.close()

    def expires_by_message_id(self, table: str) -> dict[str, datetime | None]:
        connection = self._connect()
        try:
            rows = connection.execute(
                f'SELECT Headers, Expires FROM "{table.replace(chr(34), chr(34) * 2)}"'
            ).fetchall()
        finally:
            connection.close()
        return {json.loads(h)["NServiceBus.MessageId"]: _as_datetime(e) for h, e in rows}

    def expired_count(self, table: str) -> int:
        connection = self._connect()
        try:
            return int(
                connection.execute(
                    f'SELECT count(*) FROM "{table.replace(chr(34), chr(34) * 2)}" '
                    "WHERE Expires <= strftime('%Y-%m-%d %H:%M:%f', 'now')"
                ).fetchone()[0]
            )
        finally:
            connection.close()


class SqlServerEndpoint(NsbEndpoint):
    dialect = "sqlserver"

    def __init__(self, connection_string: str, catalog: str) -> None:
        self.connection_string = connection_string
        self.catalog = catalog

    def database_entry(self) -> dict[str, Any]:
        return {"dialect": "sqlserver", "connection": self.connection_string}

    def qualified(self, table: str, catalog: str | None = None) -> str:
        parts = (catalog or self.catalog, "dbo", table)
        return ".".join("[" + part.replace("]", "]]") + "]" for part in parts)

    def address(self, table: str) -> str:
        # The canonical form NServiceBus 7+ writes .
        return f"{table}@[dbo]@[{self.catalog.replace(']', ']]')}]"

    def create_queue(self, table: str, catalog: str | None = None) -> None:
        qualified = self.qualified(table, catalog)
        with sqlserver_connect(self.connection_string) as connection:
            connection.execute(NSB_SQLSERVER_CREATE_QUEUE.format(qualified), qualified)
            connection.commit()

    def send(
        self,
        table: str,
        messages: list[tuple[Mapping[str, str | None] | str, bytes | None, int | None]],
    ) -> list[uuid.UUID]:
        ids = []
        with sqlserver_connect(self.connection_string) as connection:
            for headers, body, ttbr in messages:
                row_id = uuid.uuid4()
                connection.execute(
                    NSB_SQLSERVER_SEND.format(self.qualified(table)),
                    row_id,
                    ttbr,
                    ttbr,
                    self._headers_text(headers),
                    body,
                )
                ids.append(row_id)
            connection.commit()
        return ids

    def receive_all(self, table: str, catalog: str | None = None) -> list[dict[str, Any]]:
        received = []
        with sqlserver_connect(self.connection_string) as connection:
            while True:
                cursor = connection.execute(
                    NSB_SQLSERVER_RECEIVE.format(self.qualified(table, catalog))
                )
                row = cursor.fetchone() if cursor.description is not None else None
                while cursor.nextset():
                    pass
                connection.commit()
                if row is None:
                    return received
                received.append(self._received(row))

    def expires_by_message_id(self, table: str) -> dict[str, datetime | None]:
        with sqlserver_connect(self.connection_string) as connection:
            rows = connection.execute(
                f"SELECT Headers, Expires FROM {self.qualified(table)}"
            ).fetchall()
            connection.commit()
        return {json.loads(h)["NServiceBus.MessageId"]: _as_datetime(e) for h, e in rows}

    def expired_count(self, table: str) -> int:
        with sqlserver_connect(self.connection_string) as connection:
            row = connection.execute(
                f"SELECT count(*) FROM {self.qualified(table)} WHERE Expires <= GETUTCDATE()"
            ).fetchone()
            connection.commit()
        return int(row[0])


class CommitFailsOnce:
    """Wraps the real source connection: the next commit of a write transaction (`begin`, as a
    batch's claim opens) dies as if the bridge crashed. Read transactions (`begin_read`) commit
    normally, so a read between batches cannot take the crash meant for the batch."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.database = inner.database
        self.armed = True
        self._writing = False

    def begin(self) -> None:
        self._writing = True
        self._inner.begin()

    def begin_read(self) -> None:
        self._writing = False
        self._inner.begin_read()

    def commit(self) -> None:
        if self.armed and self._writing:
            self.armed = False
            self._inner.rollback()  # what the server does when the client vanishes
            raise ConnectionLost(self.database, "simulated crash before the source commit")
        self._inner.commit()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class TcpRelay:
    """A TCP relay on a loopback port in front of a server, which can turn into a black hole.

    While `silent`, it keeps every socket open, reads and drops whatever arrives, and forwards
    nothing: to a client that is a partition, a frozen host or a firewall that drops packets
    (no reset, no error, a call that never returns). New connections are accepted and get the
    same. `restore` ends it as a failover would: connections made before are closed (what
    they sent meanwhile is lost) and new ones are relayed again.
    """

    def __init__(self, host: str, port: int) -> None:
        import socket
        import threading

        self._target = (host, port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = int(self._listener.getsockname()[1])
        self.silent = threading.Event()
        # Data swallowed while silent on connections relayed before: each time, a client that
        # was talking to the server waits for an answer that never comes.
        self.unanswered = 0
        self.accepted = 0  # connections clients opened through it (each one a login attempt)
        self._sockets: list[Any] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @classmethod
    def before(cls, connection_string: str) -> TcpRelay:
        """A relay to the server `connection_string` (ODBC style) names."""
        import re

        host = re.search(r"(?i)Server=([^;]*);", connection_string)
        port = re.search(r"(?i)Port=(\d+);", connection_string)
        return cls(host.group(1) if host else "127.0.0.1", int(port.group(1)) if port else 5432)

    def silence(self) -> None:
        self.silent.set()

    def restore(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        self.silent.clear()
        for sock in sockets:
            _close_quietly(sock)

    def close(self) -> None:
        self._closed = True
        _close_quietly(self._listener)
        self.restore()

    def connection_string(self, connection_string: str) -> str:
        """`connection_string` (ODBC style, as the tests use) pointed at the relay."""
        import re

        text = re.sub(r"(?i)Server=[^;]*;", "Server=127.0.0.1;", connection_string)
        text = re.sub(r"(?i)Port=\d+;", "", text)
        return text + f"Port={self.port};"

    def _accept(self) -> None:
        import socket
        import threading

        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            upstream = None
            if not self.silent.is_set():
                try:
                    upstream = socket.create_connection(self._target, timeout=5)
                    upstream.settimeout(None)
                except OSError:
                    _close_quietly(client)
                    continue
            with self._lock:
                self._sockets.extend(s for s in (client, upstream) if s is not None)
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            if upstream is not None:
                threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _pump(self, source: Any, destination: Any) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                break
            if not data:
                break
            if self.silent.is_set() or destination is None:
                if destination is not None:
                    self.unanswered += 1
                continue  # swallowed: nothing comes back, nothing is closed
            try:
                destination.sendall(data)
            except OSError:
                break
        if not self.silent.is_set():
            _close_quietly(source)
            if destination is not None:
                _close_quietly(destination)


def _close_quietly(sock: Any) -> None:
    import socket

    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


# The pair's helpers (support/pairs.py uses what is above), importable from `support` too.
from support import pairs as _pairs  # noqa: E402

PgPair = _pairs.PgPair
hold_for = _pairs.hold_for
make_pg_pair = _pairs.make_pg_pair
message_ids = _pairs.message_ids
pg_pair_config = _pairs.pg_pair_config
pg_send = _pairs.pg_send
pg_table_reads = _pairs.pg_table_reads
wait_for_reads = _pairs.wait_for_reads
pg_rollbacks = _pairs.pg_rollbacks
wait_for_rollbacks = _pairs.wait_for_rollbacks
