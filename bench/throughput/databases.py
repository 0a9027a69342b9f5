"""Benchmark databases: PostgreSQL (through pyodbc, fresh databases) and SQLite (temp files).

Each kind holds its queue tables in its transport's shape (the PostgreSQL transport's; the SQL
Server transport's for SQLite) and knows how to fill, count and read them. The benchmark's own
statements never go through the bridge's SQL, so the bridge cannot hide a mistake of its own.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import uuid
from collections.abc import Iterable, Sequence
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import pyodbc

from bridge.commands.send import test_message_headers
from bridge.headers import serialize_headers

DEFAULT_PG_PREFIX = "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=5432;Uid=postgres;"
# What the bridge forces on its own psqlODBC connections, so the baselines use the same driver.
PG_OPTIONS = "Protocol=7.4-0;ByteaAsLongVarBinary=1;BoolsAsChar=0;"
QUEUE, ERROR_QUEUE, RECEIVER, CEILING = "bench_forward", "error", "bench_receiver", "bench_ceiling"
RETRY_TABLE, LEDGER_TABLE = "sfbridge_retry", "sfbridge_ledger"
MESSAGE_ID = "NServiceBus.MessageId"
PG_QUEUE_DDL = (
    "CREATE TABLE IF NOT EXISTS {} (Id uuid NOT NULL PRIMARY KEY, Expires timestamp, "
    "Headers text NOT NULL, Body bytea, Seq serial NOT NULL UNIQUE)"
)
SQLITE_QUEUE_DDL = (
    "CREATE TABLE IF NOT EXISTS {} (Id TEXT NOT NULL, CorrelationId TEXT, ReplyToAddress TEXT, "
    "Recoverable INTEGER NOT NULL, Expires TEXT, Headers TEXT NOT NULL, Body BLOB, "
    "RowVersion INTEGER PRIMARY KEY AUTOINCREMENT)"
)
SQLITE_COLUMNS = "Id, CorrelationId, ReplyToAddress, Recoverable, Expires, Headers, Body"
FILL_ROWS = 500  # rows per multi-row INSERT when filling


def pg_connection_string(prefix: str, database: str) -> str:
    return f"{prefix.rstrip().rstrip(';')};Database={database};"


def pg_connect(connection_string: str, *, autocommit: bool) -> pyodbc.Connection:
    pyodbc.native_uuid = True
    return pyodbc.connect(connection_string + PG_OPTIONS, autocommit=autocommit)


def new_messages(count: int, queues: Sequence[str] = (RECEIVER,)) -> list[tuple[str, str]]:
    """`count` (message id, serialized headers) pairs as `sfbridge send` writes them, sent to
    each of `queues` in turn, each in a trace of its own (a `traceparent`, as NServiceBus 10
    sends by default; what the tracing row's spans are children of)."""
    messages = []
    for number in range(count):
        queue = queues[number % len(queues)]
        traceparent = {"traceparent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"}
        headers = test_message_headers(queue, "Bench.Message", traceparent, now=datetime.now(UTC))
        messages.append((str(headers[MESSAGE_ID]), serialize_headers(headers)))
    return messages


def message_id_of(headers_text: str) -> str:
    return str(json.loads(headers_text).get(MESSAGE_ID))


class Relay(Protocol):
    """One side of the naive relay: its own connection, one transaction at a time."""

    def claim_one(self, table: str) -> tuple[str, bytes] | None: ...
    def insert_one(self, table: str, headers: str, body: bytes) -> None: ...
    def commit(self) -> None: ...
    def close(self) -> None: ...


class BenchDatabase(Protocol):
    kind: str  # "PG" or "SQLite"

    def config_entry(self) -> dict[str, Any]: ...
    def environment(self) -> dict[str, str]: ...
    def create_queue(self, table: str) -> None: ...
    def clear(self, tables: Iterable[str]) -> None: ...
    def fill(self, table: str, messages: Sequence[tuple[str, str]], body: bytes) -> None: ...
    def send_one(self, table: str, headers: str, body: bytes) -> None: ...
    def count(self, table: str) -> int: ...
    def has_rows(self, table: str) -> bool: ...
    def message_ids(self, table: str) -> list[str]: ...
    def move_all(self, source: str, target: str) -> int: ...
    def relay(self) -> Relay: ...
    def close(self) -> None: ...


class PgDatabase:
    """A fresh PostgreSQL database; the daemon gets its connection string from `env_name`."""

    kind = "PG"

    def __init__(self, prefix: str, name: str, env_name: str) -> None:
        self.name, self.env_name = name, env_name
        self.connection_string = pg_connection_string(prefix, name)
        self.connection = pg_connect(self.connection_string, autocommit=True)
        self.connection.execute("CREATE TABLE IF NOT EXISTS bench_body (body bytea)")

    def config_entry(self) -> dict[str, Any]:
        return {"dialect": "postgresql", "connection": "${" + self.env_name + "}"}

    def environment(self) -> dict[str, str]:
        return {self.env_name: self.connection_string}

    def create_queue(self, table: str) -> None:
        self.connection.execute(PG_QUEUE_DDL.format(_pg(table)))

    def clear(self, tables: Iterable[str]) -> None:
        self.connection.execute("TRUNCATE " + ", ".join(_pg(table) for table in tables))

    def fill(self, table: str, messages: Sequence[tuple[str, str]], body: bytes) -> None:
        """Multi-row INSERTs that take the body from a one-row table, so it crosses the wire
        once; then ANALYZE, as autovacuum would have done on a real queue."""
        self.connection.execute("TRUNCATE bench_body")
        self.connection.execute("INSERT INTO bench_body VALUES (?)", body)
        for start in range(0, len(messages), FILL_ROWS):
            chunk = messages[start : start + FILL_ROWS]
            values = ", ".join(["(?::uuid, ?)"] * len(chunk))
            params = [value for _, headers in chunk for value in (str(uuid.uuid4()), headers)]
            self.connection.execute(
                f"INSERT INTO {_pg(table)} (id, headers, body) SELECT v.id, v.headers, b.body "
                f"FROM (VALUES {values}) AS v (id, headers) CROSS JOIN bench_body b",
                *params,
            )
        self.connection.execute(f"ANALYZE {_pg(table)}")

    def send_one(self, table: str, headers: str, body: bytes) -> None:
        """One message in its own (autocommit) transaction, as an endpoint sends."""
        self.connection.execute(
            f"INSERT INTO {_pg(table)} (id, headers, body) VALUES (?, ?, ?)",
            uuid.uuid4(),
            headers,
            body,
        )

    def count(self, table: str) -> int:
        return int(self.connection.execute(f"SELECT count(*) FROM {_pg(table)}").fetchval())

    def has_rows(self, table: str) -> bool:
        """One probe of the queue's head in its sequence index (rows deleted but not yet
        committed still count)."""
        cursor = self.connection.execute(f"SELECT seq FROM {_pg(table)} ORDER BY seq LIMIT 1")
        return cursor.fetchone() is not None

    def message_ids(self, table: str) -> list[str]:
        rows = self.connection.execute(f"SELECT headers FROM {_pg(table)}").fetchall()
        return [message_id_of(row[0]) for row in rows]

    def move_all(self, source: str, target: str) -> int:
        with closing(pg_connect(self.connection_string, autocommit=False)) as connection:
            moved = connection.execute(
                f"WITH m AS (DELETE FROM {_pg(source)} RETURNING id, expires, headers, body) "
                f"INSERT INTO {_pg(target)} (id, expires, headers, body) "
                "SELECT id, expires, headers, body FROM m"
            ).rowcount
            connection.commit()
        return int(moved)

    def relay(self) -> Relay:
        return PgRelay(pg_connect(self.connection_string, autocommit=False))

    def close(self) -> None:
        self.connection.close()


class PgRelay:
    def __init__(self, connection: pyodbc.Connection) -> None:
        self.connection = connection

    def claim_one(self, table: str) -> tuple[str, bytes] | None:
        cursor = self.connection.execute(
            f"DELETE FROM {_pg(table)} WHERE seq = (SELECT seq FROM {_pg(table)} ORDER BY seq "
            "LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING headers, body"
        )
        # psqlODBC returns no result set at all when RETURNING matched no row.
        row = cursor.fetchone() if cursor.description else None
        return (row[0], row[1]) if row else None

    def insert_one(self, table: str, headers: str, body: bytes) -> None:
        self.connection.execute(
            f"INSERT INTO {_pg(table)} (id, headers, body) VALUES (?, ?, ?)",
            uuid.uuid4(),
            headers,
            body,
        )

    def commit(self) -> None:
        self.connection.commit()

    def close(self) -> None:
        self.connection.close()


class SqliteDatabase:
    """A SQLite file in the run's temp folder (WAL mode, as the bridge sets it)."""

    kind = "SQLite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.connection = _sqlite_connect(path)
        self.connection.execute("PRAGMA journal_mode=WAL")

    def config_entry(self) -> dict[str, Any]:
        return {"dialect": "sqlite", "path": str(self.path)}

    def environment(self) -> dict[str, str]:
        return {}

    def create_queue(self, table: str) -> None:
        self.connection.execute(SQLITE_QUEUE_DDL.format(_sq(table)))

    def clear(self, tables: Iterable[str]) -> None:
        self.connection.execute("BEGIN IMMEDIATE")
        for table in tables:
            self.connection.execute(f"DELETE FROM {_sq(table)}")
        self.connection.execute("COMMIT")
        self.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def fill(self, table: str, messages: Sequence[tuple[str, str]], body: bytes) -> None:
        self.connection.execute("BEGIN IMMEDIATE")
        self.connection.executemany(
            f"INSERT INTO {_sq(table)} (Id, Recoverable, Headers, Body) VALUES (?, 1, ?, ?)",
            ((str(uuid.uuid4()), headers, body) for _, headers in messages),
        )
        self.connection.execute("COMMIT")

    def send_one(self, table: str, headers: str, body: bytes) -> None:
        self.connection.execute(
            f"INSERT INTO {_sq(table)} (Id, Recoverable, Headers, Body) VALUES (?, 1, ?, ?)",
            (str(uuid.uuid4()), headers, body),
        )

    def count(self, table: str) -> int:
        return int(self.connection.execute(f"SELECT count(*) FROM {_sq(table)}").fetchone()[0])

    def has_rows(self, table: str) -> bool:
        cursor = self.connection.execute(f"SELECT 1 FROM {_sq(table)} ORDER BY RowVersion LIMIT 1")
        return cursor.fetchone() is not None

    def message_ids(self, table: str) -> list[str]:
        rows = self.connection.execute(f"SELECT Headers FROM {_sq(table)}").fetchall()
        return [message_id_of(row[0]) for row in rows]

    def move_all(self, source: str, target: str) -> int:
        """INSERT .. SELECT and DELETE in one transaction: SQLite's one-statement move."""
        with closing(_sqlite_connect(self.path)) as connection:
            connection.execute("BEGIN IMMEDIATE")
            moved = connection.execute(
                f"INSERT INTO {_sq(target)} ({SQLITE_COLUMNS}) "
                f"SELECT {SQLITE_COLUMNS} FROM {_sq(source)} ORDER BY RowVersion"
            ).rowcount
            connection.execute(f"DELETE FROM {_sq(source)}")
            connection.execute("COMMIT")
        return int(moved)

    def relay(self) -> Relay:
        return SqliteRelay(_sqlite_connect(self.path))

    def close(self) -> None:
        self.connection.close()


class SqliteRelay:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection
        self.open = False

    def _begin(self) -> None:
        if not self.open:
            self.connection.execute("BEGIN IMMEDIATE")
            self.open = True

    def claim_one(self, table: str) -> tuple[str, bytes] | None:
        self._begin()
        row = self.connection.execute(
            f"DELETE FROM {_sq(table)} WHERE RowVersion = (SELECT min(RowVersion) FROM "
            f"{_sq(table)}) RETURNING Headers, Body"
        ).fetchone()
        return (row[0], row[1]) if row else None

    def insert_one(self, table: str, headers: str, body: bytes) -> None:
        self._begin()
        self.connection.execute(
            f"INSERT INTO {_sq(table)} (Id, Recoverable, Headers, Body) VALUES (?, 1, ?, ?)",
            (str(uuid.uuid4()), headers, body),
        )

    def commit(self) -> None:
        if self.open:
            self.connection.execute("COMMIT")
            self.open = False

    def close(self) -> None:
        self.connection.close()


def create_pg_databases(prefix: str, names: Sequence[str], created: list[str]) -> None:
    """Create each database; `created` gets every name as soon as it exists (for dropping)."""
    with closing(pg_connect(pg_connection_string(prefix, "postgres"), autocommit=True)) as admin:
        for name in names:
            admin.execute(f'CREATE DATABASE "{name}"')
            created.append(name)


def drop_pg_databases(prefix: str, names: Sequence[str]) -> list[str]:
    """Drop each database, ending the sessions left on it (FORCE: PostgreSQL 13+).

    Returns the problems, one line per database that could not be dropped.
    """
    problems = []
    with closing(pg_connect(pg_connection_string(prefix, "postgres"), autocommit=True)) as admin:
        for name in names:
            try:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except pyodbc.Error as error:
                problems.append(f"could not drop database {name}: {error}")
    return problems


def pg_server_version(prefix: str) -> str:
    with closing(pg_connect(pg_connection_string(prefix, "postgres"), autocommit=True)) as admin:
        return str(admin.execute("SHOW server_version").fetchval()).split()[0]


def _pg(table: str) -> str:
    return f'"public"."{table}"'


def _sq(table: str) -> str:
    return f'"{table}"'


def _sqlite_connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None, timeout=60)
