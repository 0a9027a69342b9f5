"""psycopg 3 connections, for PostgreSQL.

Why a second driver for one database: psycopg speaks PostgreSQL's own protocol, sends bodies
as binary parameters, reads queue rows in binary (`query_named`, `query_columns`), streams rows
with binary `COPY` (`copy_rows`), prepares statements on the server by itself once they repeat,
and needs no system packages (the `psycopg[binary]` wheel carries libpq). psqlODBC through
pyodbc needs unixODBC, its options (`Protocol=7.4-0`, `ByteaAsLongVarBinary=1`, ...) and spends
much of the bridge's time binding parameters and copying large values.

The dialects' statements use `?` placeholders (ODBC's); they are rewritten once per distinct
text to psycopg's `%s`, outside quoted literals and identifiers, with every literal `%`
doubled. The configured connection string may stay an ODBC one: `libpq_parameters` takes what
libpq understands from it.

psycopg is imported lazily, like pyodbc, so that the SQLite-only demo needs neither.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import unquote

from bridge.drivers.base import ConnectionFailed, ConnectionLost, DatabaseError, Row
from bridge.drivers.odbc import parse_connection_string
from bridge.drivers.sqlstates import classify
from bridge.secrets import mask_secrets

__all__ = ["PsycopgConnection", "libpq_parameters", "pyformat_placeholders"]

# ODBC connection string keys (any case) -> libpq parameters. psqlODBC's own options
# (Driver, Protocol, ByteaAsLongVarBinary, CommLog, ...) mean nothing to libpq and are left out.
_LIBPQ_KEYS = {
    "server": "host",
    "servername": "host",
    "host": "host",
    "port": "port",
    "uid": "user",
    "username": "user",
    "user": "user",
    "pwd": "password",
    "password": "password",
    "database": "dbname",
    "dbname": "dbname",
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "application_name": "application_name",
    "applicationname": "application_name",
}
MAX_CACHED_STATEMENTS = 256
# `::type[]` right after a placeholder.
_ARRAY_CAST = re.compile(r"::\s*[A-Za-z_][A-Za-z0-9_ ]*\[\]")


def libpq_parameters(connection_string: str) -> dict[str, str]:
    """libpq connection parameters from an ODBC-style connection string (`Server=...;Port=...;
    Uid=...;Pwd=...;Database=...;`). A libpq URL (`postgresql://...`) is given back as
    `{"conninfo": URL}`. Braces around a value are removed (`Pwd={a;b}`)."""
    text = connection_string.strip()
    if text.startswith(("postgresql://", "postgres://")):
        return {"conninfo": text}
    parameters: dict[str, str] = {}
    for key, value in parse_connection_string(text):
        name = _LIBPQ_KEYS.get(key.strip().lower())
        if name is None:
            continue
        value = value.strip()
        if value.startswith("{") and value.endswith("}"):
            value = value[1:-1].replace("}}", "}")
        parameters[name] = value
    return parameters


def pyformat_placeholders(sql: str) -> str:
    """`sql` with each `?` outside quotes as `%s` and each `%` as `%%` (psycopg's format).

    A `?` cast to an array type (`?::uuid[]`, as in the dialects' `*_arrays` statements)
    becomes `%b`: the array goes in binary, where the text format would escape every element
    (every byte of every body). Other parameters stay `%s`, so that a string reaches the
    server untyped and is cast to the column's type (uuid, timestamp) as psqlODBC's are.
    Quoted identifiers ("...") and literals ('...') are copied as they are, but for `%`,
    which psycopg reads everywhere in a statement that has parameters.
    """
    out: list[str] = []
    quote: str | None = None
    for position, char in enumerate(sql):
        if char == "%":
            out.append("%%")
        elif quote is not None:
            out.append(char)
            if char == quote:
                quote = None  # a doubled quote closes and reopens: the same result
        elif char in ("'", '"'):
            quote = char
            out.append(char)
        elif char == "?":
            out.append("%b" if _ARRAY_CAST.match(sql, position + 1) else "%s")
        else:
            out.append(char)
    return "".join(out)


class PsycopgConnection:
    """A psycopg connection with autocommit off: a transaction starts with the first statement."""

    binds_arrays = True
    copies_rows = True

    def __init__(
        self,
        database: str,
        connection_string: str,
        *,
        timeout: float,
        session_setup: Sequence[str] = (),
    ) -> None:
        """Connect (see `libpq_parameters`) and run `session_setup` once. Raises
        ConnectionFailed with a message free of secrets."""
        import psycopg  # lazy: see the module docstring

        self.database = database
        self._psycopg_error = psycopg.Error
        self._statements: OrderedDict[str, str] = OrderedDict()
        from psycopg.conninfo import make_conninfo

        parameters = libpq_parameters(connection_string)
        try:
            conninfo = make_conninfo(
                parameters.pop("conninfo", ""),
                connect_timeout=str(max(1, round(timeout))),
                **parameters,
            )
            self._connection = psycopg.connect(
                conninfo,
                autocommit=False,
                # Statements are prepared on the server from their second execution on.
                prepare_threshold=1,
            )
        except psycopg.Error as error:
            text = _without(_message(error), _passwords(connection_string, parameters))
            raise ConnectionFailed(database, f"cannot connect: {text}") from None
        try:
            with self._connection.cursor() as cursor:
                for statement in session_setup:
                    cursor.execute(statement)
            self._connection.commit()
        except psycopg.Error as error:
            self._connection.close()
            failure = self._translate(error)
            raise ConnectionFailed(
                database, f"cannot set up the session: {failure.detail}"
            ) from None
        self._cursor = self._connection.cursor()

    def begin(self) -> None:
        """A transaction starts by itself with the first statement (autocommit is off)."""

    def begin_read(self) -> None:
        """As `begin`."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        try:
            self._run(sql, params)
            return int(self._cursor.rowcount)
        except self._psycopg_error as error:
            raise self._translate(error) from None

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        batch = [tuple(row) for row in rows]
        if not batch:
            return
        try:
            self._cursor.executemany(self._statement(sql), batch)
        except self._psycopg_error as error:
            raise self._translate(error) from None

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self._fetch(sql, params)[1]

    def query_named(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        names, rows = self.query_columns(sql, params)
        return [dict(zip(names, row, strict=True)) for row in rows]

    def query_columns(self, sql: str, params: Sequence[Any] = ()) -> tuple[list[str], list[Row]]:
        """Results come in binary: these are queue rows (uuid, timestamp, text, bytea, integers),
        and a body in text would be hex-encoded by the server and decoded here."""
        return self._fetch(sql, params, binary=True)

    def copy_rows(self, sql: str, types: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        try:
            with self._cursor.copy(sql) as copy:
                copy.set_types(list(types))
                for row in rows:
                    copy.write_row(row)
        except self._psycopg_error as error:
            raise self._translate(error) from None

    def execute_outside_transaction(self, sql: str) -> int:
        try:
            self._connection.rollback()
            self._connection.autocommit = True
            try:
                self._cursor.execute(sql)
                return int(self._cursor.rowcount)
            finally:
                self._connection.autocommit = False
        except self._psycopg_error as error:
            raise self._translate(error) from None

    def column_types(self, sql: str) -> list[str]:
        try:
            self._cursor.execute(sql)
            types = self._connection.adapters.types
            return [
                info.name if (info := types.get(column.type_code)) else str(column.type_code)
                for column in self._cursor.description or ()
            ]
        except self._psycopg_error as error:
            raise self._translate(error) from None

    def commit(self) -> None:
        try:
            self._connection.commit()
        except self._psycopg_error as error:
            raise self._translate(error) from None

    def rollback(self) -> None:
        try:
            self._connection.rollback()
        except self._psycopg_error:
            pass  # a broken connection: the caller discards it

    def close(self) -> None:
        try:
            self._connection.close()
        except self._psycopg_error:
            pass

    # -- internals -------------------------------------------------------------------------

    def _fetch(
        self, sql: str, params: Sequence[Any], *, binary: bool = False
    ) -> tuple[list[str], list[Row]]:
        try:
            self._run(sql, params, binary=binary)
            description = self._cursor.description
            if description is None:
                return [], []
            names = [column.name.lower() for column in description]
            return names, self._cursor.fetchall()  # tuples already
        except self._psycopg_error as error:
            raise self._translate(error) from None

    def _run(self, sql: str, params: Sequence[Any], *, binary: bool = False) -> None:
        if params:
            self._cursor.execute(self._statement(sql), tuple(params), binary=binary)
        else:
            # Without parameters the text goes as it is (several statements are allowed, as
            # in install scripts, and nothing needs escaping).
            self._cursor.execute(sql, binary=binary)

    def _statement(self, sql: str) -> str:
        statement = self._statements.get(sql)
        if statement is None:
            statement = pyformat_placeholders(sql)
            self._statements[sql] = statement
            if len(self._statements) > MAX_CACHED_STATEMENTS:
                self._statements.popitem(last=False)
        else:
            self._statements.move_to_end(sql)
        return statement

    def _translate(self, error: Exception) -> DatabaseError:
        state = getattr(error, "sqlstate", None) or ""
        message = _message(error)
        text = f"{message} (SQLSTATE {state})" if state else message
        if not state and self._connection.broken:
            # The server went away or the link broke: no SQLSTATE comes back.
            return ConnectionLost(self.database, text)
        return classify(self.database, state, None, message, text)


def _passwords(connection_string: str, parameters: dict[str, str]) -> list[str]:
    """Every form the configured password may take in libpq's messages: as written (a URL's
    userinfo, percent-encoded or not) and decoded. libpq quotes a token it cannot parse, which
    `mask_secrets` cannot recognise as a password."""
    found = [parameters.get("password", "")]
    text = connection_string.strip()
    if text.startswith(("postgresql://", "postgres://")):
        userinfo = text.split("://", 1)[1].split("/", 1)[0].rpartition("@")[0]
        if ":" in userinfo:
            raw = userinfo.split(":", 1)[1]
            found += [raw, unquote(raw)]
    return sorted({p for p in found if p}, key=len, reverse=True)


def _without(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def _message(error: Exception) -> str:
    diag = getattr(error, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    text = primary or str(error).strip().split("\n")[0]
    return mask_secrets(text)
