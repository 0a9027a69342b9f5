"""SQLite through the standard library (WAL mode), the embedded default.

Not through ODBC: sqlite3odbc drops the rows of `DELETE ... RETURNING` and segfaults on
`fast_executemany` (sqliteodbc 0.9998, Debian 12).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bridge.drivers.base import Row, Unreadable
from bridge.exceptions import (
    AlreadyExists,
    ConnectionFailed,
    DatabaseError,
    DuplicateKey,
    LockTimeout,
    PermissionDenied,
    TableNotFound,
)
from bridge.secrets import create_private

BUSY_TIMEOUT_SECONDS = 5.0  # when the caller gives no deadline


def _translate(database: str, error: sqlite3.Error) -> DatabaseError:
    text = str(error)
    lowered = text.lower()
    if "no such table" in lowered:
        return TableNotFound(database, text)
    if "already exists" in lowered:
        return AlreadyExists(database, text)
    if "readonly database" in lowered or (
        isinstance(error, sqlite3.OperationalError)
        and ("permission denied" in lowered or "authorization denied" in lowered)
    ):
        return PermissionDenied(database, text)
    if "unique constraint" in lowered or isinstance(error, sqlite3.IntegrityError):
        return (
            DuplicateKey(database, text) if "unique" in lowered else DatabaseError(database, text)
        )
    if "locked" in lowered or "busy" in lowered:
        # After the busy timeout (the connection's deadline): another writer holds the file.
        return LockTimeout(database, text)
    if "unable to open" in lowered or "disk i/o" in lowered or "not a database" in lowered:
        return ConnectionFailed(database, text)
    return DatabaseError(database, text)


def _text_or_unreadable(raw: bytes) -> str | Unreadable:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return Unreadable(raw, f"not valid UTF-8 ({error.reason} at byte {error.start})")


class SqliteConnection:
    """A stdlib sqlite3 connection in manual-transaction mode."""

    binds_arrays = False
    copies_rows = False
    listens = False

    def __init__(
        self, database: str, path: str, *, create: bool = False, deadline: float | None = None
    ) -> None:
        """Open the file (`create`: also when missing). `deadline`: how long a statement waits
        for another writer's lock on the file (SQLite's busy timeout) before LockTimeout."""
        self.database = database
        # mode=rw: a missing file is an unavailable database, not a new empty one. This is
        # how "the receiver database was taken away" shows up for SQLite.
        mode = "rwc" if create else "rw"
        uri = f"{Path(path).absolute().as_uri()}?mode={mode}"
        try:
            if create:
                # SQLite would create it with the umask's mode (0644: anyone reads the messages);
                # its -wal and -shm files take the database file's mode.
                create_private(path)
            self._connection = sqlite3.connect(
                uri,
                uri=True,
                isolation_level=None,
                timeout=BUSY_TIMEOUT_SECONDS if deadline is None else deadline,
                check_same_thread=False,
            )
            self._connection.execute("PRAGMA journal_mode=WAL")
            # FULL: a committed forward survives power loss, not only a process crash.
            self._connection.execute("PRAGMA synchronous=FULL")
        except (sqlite3.Error, OSError) as error:
            raise ConnectionFailed(database, f"cannot open SQLite file {path}: {error}") from None

    def begin(self) -> None:
        # IMMEDIATE takes the write lock up front, so a batch claim never fails half-way
        # with SQLITE_BUSY on lock upgrade.
        self._run("BEGIN IMMEDIATE")

    def begin_read(self) -> None:
        # Deferred: readers never wait for the writer in WAL mode.
        self._run("BEGIN")

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        cursor = self._run(sql, params)
        return cursor.rowcount

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        try:
            self._connection.executemany(sql, rows)
        except sqlite3.Error as error:
            raise _translate(self.database, error) from None

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        cursor = self._run(sql, params)
        return [tuple(row) for row in cursor.fetchall()]

    def query_named(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        names, rows = self.query_columns(sql, params)
        return [dict(zip(names, row, strict=True)) for row in rows]

    def query_columns(self, sql: str, params: Sequence[Any] = ()) -> tuple[list[str], list[Row]]:
        """SQLite stores whatever bytes a writer gave as TEXT; text that is not UTF-8 comes back
        as `Unreadable` (the standard library would fail the whole result on it)."""
        self._connection.text_factory = _text_or_unreadable
        try:
            cursor = self._run(sql, params)
            try:
                names = [column[0].lower() for column in cursor.description or ()]
                rows = cursor.fetchall()
            except sqlite3.Error as error:
                raise _translate(self.database, error) from None
            finally:
                cursor.close()  # else COMMIT fails: "SQL statements in progress"
        finally:
            self._connection.text_factory = str
        return names, rows

    def execute_outside_transaction(self, sql: str) -> int:
        self.rollback()
        count = self.execute(sql)
        self.commit()
        return count

    def copy_rows(self, sql: str, types: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        raise DatabaseError(self.database, "COPY is not available through SQLite")

    def listen(self, channels: Sequence[str]) -> None:
        raise DatabaseError(self.database, "this driver does not listen for notifications")

    def notifications(self, timeout: float) -> set[str]:
        raise DatabaseError(self.database, "this driver does not listen for notifications")

    def column_types(self, sql: str) -> list[str]:
        raise DatabaseError(self.database, "column types are not read through SQLite")

    def commit(self) -> None:
        if self._connection.in_transaction:
            self._run("COMMIT")

    def rollback(self) -> None:
        if self._connection.in_transaction:
            try:
                self._connection.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    def close(self) -> None:
        try:
            self._connection.close()
        except sqlite3.Error:
            pass

    def _run(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        try:
            return self._connection.execute(sql, tuple(params))
        except sqlite3.Error as error:
            raise _translate(self.database, error) from None
