"""psycopg 3 connections, for PostgreSQL.

Why a second driver for one database: psycopg speaks PostgreSQL's own protocol, sends bodies
as binary parameters, reads queue rows in binary (`query_named`, `query_columns`), streams rows
with binary `COPY` (`copy_rows`), prepares statements on the server by itself once they repeat,
and needs no system packages (the `psycopg[binary]` wheel carries libpq). psqlODBC through
pyodbc needs unixODBC, its options (`Protocol=7.4-0`, `ByteaAsLongVarBinary=1`, ...) and spends
much of the bridge's time binding parameters and copying large values.

The dialects' statements use `?` placeholders (ODBC's); they are rewritten once per distinct
text to psycopg's `%s`, outside quoted literals and identifiers, with every literal `%`
doubled. The configured connection string may stay an ODBC one: `bridge.drivers.libpq` takes
what libpq understands from it (every libpq parameter, failover's included).

psycopg is imported lazily, like pyodbc, so that the SQLite-only demo needs neither.
"""

from __future__ import annotations

import re
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import unquote

from bridge.drivers.base import Row, Unreadable
from bridge.drivers.libpq import libpq_parameters
from bridge.drivers.sqlstates import classify, connect_failure
from bridge.exceptions import (
    ConnectionFailed,
    ConnectionLost,
    DatabaseError,
    DatabaseUnavailable,
    NoAnswer,
)
from bridge.secrets import mask_secrets

__all__ = ["PsycopgConnection", "libpq_parameters", "load_driver", "pyformat_placeholders"]

MAX_CACHED_STATEMENTS = 256
# How long the client waits beyond `deadline` for the server's own timeout error
# (`statement_timeout`, `lock_timeout`, set by the dialect) before it gives up on the server.
SERVER_ANSWER_GRACE = 2.0
# What `listen` accepts as a channel name (put into LISTEN as it is).
_CHANNEL = re.compile(r"[a-z_][a-z0-9_]{0,62}")
# libpq's transaction status of a connection outside any transaction
# (`psycopg.pq.TransactionStatus.IDLE`, which is not imported here: see the module docstring).
_IDLE = 0
# `::type[]` right after a placeholder.
_ARRAY_CAST = re.compile(r"::\s*[A-Za-z_][A-Za-z0-9_ ]*\[\]")


def keepalive_parameters(deadline: float) -> dict[str, str]:
    """libpq parameters that make the kernel notice a dead link on its own, also while a
    connection sits idle: TCP keepalives (libpq's default waits two hours before the first
    probe) and `tcp_user_timeout` (sent data left unacknowledged this long closes the
    connection; by default the kernel retransmits for about 15 minutes). They cover a real
    partition or a frozen host; a peer whose kernel still acknowledges but never answers (a
    hung server, a proxy that swallows traffic) is what the client-side deadline is for."""
    idle = min(60, max(1, round(deadline / 3)))
    return {
        "keepalives": "1",
        "keepalives_idle": str(idle),
        "keepalives_interval": str(max(1, round(idle / 3))),
        "keepalives_count": "3",
        "tcp_user_timeout": str(max(1000, round(deadline * 1000))),
    }


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
    listens = True

    def __init__(
        self,
        database: str,
        connection_string: str,
        *,
        timeout: float,
        deadline: float | None = None,
        session_setup: Sequence[str] = (),
        application_name: str | None = None,
        transaction_pooled: bool = False,
    ) -> None:
        """Connect (see `libpq_parameters`) and run `session_setup` once. Raises
        ConnectionFailed with a message free of secrets (AuthenticationFailed when the server
        refused the login).

        `application_name` is what the server shows for the connection (`pg_stat_activity`)
        unless the connection string names one.

        `deadline` (seconds): no call waits longer than this (plus `SERVER_ANSWER_GRACE` for
        the server's own timeout error) for the server; then the connection is closed and
        the call raises NoAnswer (a QueryTimeout). None waits as long as it takes.

        `transaction_pooled`: the connection reaches a pooler that lends a server connection
        per transaction (PgBouncer's `pool_mode = transaction`), so nothing of the session
        outlives a transaction. No statement is prepared on the server (a named statement
        stays on the server connection it was prepared on: the next transaction, on another,
        would not find it, or find another client's of the same name), and `session_setup`
        (`SET LOCAL` statements then) runs at the start of every transaction instead of once.
        """
        import psycopg  # lazy: see the module docstring
        from psycopg.conninfo import make_conninfo

        self.database = database
        self._psycopg_error = psycopg.Error
        self._statements: OrderedDict[str, str] = OrderedDict()
        self._deadline = deadline
        # Run before the first statement of every transaction (see `transaction_pooled`).
        self._transaction_setup = "; ".join(session_setup) if transaction_pooled else ""
        parameters = libpq_parameters(connection_string)
        if "client_encoding" not in connection_string.lower():
            # Text as UTF-8 whatever the database's encoding: the server converts from a real
            # encoding, and passes SQL_ASCII's bytes through, which psycopg would otherwise
            # hand over undecoded (bytes where every caller expects str).
            parameters = {"client_encoding": "UTF8", **parameters}
        if deadline is not None:
            parameters = {**keepalive_parameters(deadline), **parameters}
        if application_name and "application_name" not in parameters.get("conninfo", ""):
            parameters.setdefault("application_name", application_name)
        try:
            conninfo = make_conninfo(
                parameters.pop("conninfo", ""),
                connect_timeout=str(max(1, round(timeout))),
                **parameters,
            )
            self._connection = _connection_class(psycopg).connect(
                conninfo,
                autocommit=False,
                # Statements are prepared on the server from their second execution on, but
                # for a session that ends with every transaction.
                prepare_threshold=None if transaction_pooled else 1,
            )
            if deadline is not None:
                self._connection.deadline = deadline + SERVER_ANSWER_GRACE
        except psycopg.Error as error:
            secrets = _passwords(connection_string, parameters)
            text = _without(_message(error), secrets)
            state = getattr(error, "sqlstate", None) or ""
            raise connect_failure(
                database, state, text, f"cannot connect: {text}", _login(parameters)
            ) from None
        try:
            with self._connection.cursor() as cursor:
                for statement in () if transaction_pooled else session_setup:
                    cursor.execute(statement)
            self._connection.commit()
        except psycopg.Error as error:
            self._connection.close()
            failure = self._translate(error)
            raise ConnectionFailed(
                database, f"cannot set up the session: {failure.detail}"
            ) from None
        self._connection.adapters.register_loader("uuid", _uuid_loader(psycopg))
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
            self._start_transaction()
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
        and a body in text would be hex-encoded by the server and decoded here. A value that
        cannot be loaded (a timestamp beyond Python's years) comes back as `Unreadable`."""
        return self._fetch(sql, params, binary=True, tolerant=True)

    def copy_rows(self, sql: str, types: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        try:
            self._start_transaction()
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
            self._start_transaction()
            self._cursor.execute(sql)
            types = self._connection.adapters.types
            return [
                info.name if (info := types.get(column.type_code)) else str(column.type_code)
                for column in self._cursor.description or ()
            ]
        except self._psycopg_error as error:
            raise self._translate(error) from None

    def listen(self, channels: Sequence[str]) -> None:
        try:
            for channel in channels:
                if not _CHANNEL.fullmatch(channel):
                    raise ValueError(f"not a channel name the bridge makes: {channel!r}")
                self._cursor.execute(f"LISTEN {channel}")
            self._connection.commit()
        except self._psycopg_error as error:
            raise self._translate(error) from None

    def notifications(self, timeout: float) -> set[str]:
        """psycopg (3.3 and later) keeps what arrives during other statements for the next
        `notifies()`."""
        found: set[str] = set()
        try:
            for notify in self._connection.notifies(timeout=max(0.0, timeout), stop_after=1):
                found.add(notify.channel)
            if found:  # and whatever else is already here, without waiting
                found.update(n.channel for n in self._connection.notifies(timeout=0))
        except self._psycopg_error as error:
            raise self._translate(error) from None
        return found

    def commit(self) -> None:
        """Raises the DatabaseError family; `outcome_unknown` set where the COMMIT went out
        and the connection ended with no answer from the server. A server that ends a
        session (`pg_terminate_backend`, a fast shutdown) answers with an error, SQLSTATE
        57P01, before it would commit (the commit itself holds off the interrupt), so that
        failure, or a connection already known broken, is a commit that did not happen."""
        sent = not (self._connection.closed or self._connection.broken)
        try:
            self._connection.commit()
        except self._psycopg_error as error:
            failure = self._translate(error)
            answered = bool(getattr(error, "sqlstate", None))
            if sent and not answered and isinstance(failure, DatabaseUnavailable):
                failure.outcome_unknown = True
            raise failure from None

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
        self, sql: str, params: Sequence[Any], *, binary: bool = False, tolerant: bool = False
    ) -> tuple[list[str], list[Row]]:
        try:
            self._run(sql, params, binary=binary)
            description = self._cursor.description
            if description is None:
                return [], []
            names = [column.name.lower() for column in description]
        except self._psycopg_error as error:
            raise self._translate(error) from None
        try:
            return names, self._cursor.fetchall()  # tuples already
        except Exception as error:
            # The whole result is here already: only turning a value into Python failed.
            if not tolerant:
                raise self._translate(error) from None
            return names, self._rows_value_by_value()

    def _rows_value_by_value(self) -> list[Row]:
        """The last result's rows, each value loaded on its own with the loader psycopg would
        use, a value that fails as `Unreadable` with its bytes as the server sent them."""
        result = self._cursor.pgresult
        assert result is not None
        adapters = self._cursor.adapters
        loaders: list[Any] = []
        for column in range(result.nfields):
            oid, format_ = result.ftype(column), result.fformat(column)
            loader = adapters.get_loader(oid, format_)
            loaders.append(None if loader is None else loader(oid, self._cursor))
        rows: list[Row] = []
        for row in range(result.ntuples):
            values: list[Any] = []
            for column, loader in enumerate(loaders):
                raw = result.get_value(row, column)
                if raw is None:
                    values.append(None)
                    continue
                try:
                    if loader is None:
                        raise ValueError(f"no loader for type oid {result.ftype(column)}")
                    values.append(loader.load(raw))
                except Exception as error:
                    values.append(Unreadable(bytes(raw), str(error) or type(error).__name__))
            rows.append(tuple(values))
        return rows

    def _start_transaction(self) -> None:
        """Before a statement: where no transaction is open, it opens one, and the session
        setup of a transaction-pooled connection comes first (one round trip: no parameters,
        so the statements go together in the simple protocol)."""
        connection = self._connection
        if (
            self._transaction_setup
            and not connection.autocommit
            and connection.info.transaction_status == _IDLE
        ):
            self._cursor.execute(self._transaction_setup)

    def _run(self, sql: str, params: Sequence[Any], *, binary: bool = False) -> None:
        self._start_transaction()
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
        if _is_wait_timeout(error):
            return NoAnswer(
                self.database,
                f"no answer within {self._deadline:g} s (query_timeout); the connection is closed",
            )
        state = getattr(error, "sqlstate", None) or ""
        message = _message(error)
        text = f"{message} (SQLSTATE {state})" if state else message
        if not state and self._connection.broken:
            # The server went away or the link broke: no SQLSTATE comes back.
            return ConnectionLost(self.database, text)
        return classify(self.database, state, None, message, text)


def load_driver() -> None:
    """Import psycopg now (about 0.1 s on a small machine) rather than inside the first
    connection of each thread, where the threads wait on one another for the import. Raises
    ImportError."""
    import psycopg  # lazy: see the module docstring

    _connection_class(psycopg)


_CONNECTION_CLASSES: dict[int, Any] = {}
_UUID_LOADERS: dict[int, Any] = {}


def _uuid_loader(psycopg: Any) -> Any:
    """psycopg's binary uuid loader without `uuid.UUID(bytes=...)`'s argument checks, which
    cost more than the rest of loading a claimed row (a claim loads thousands): the value is
    made as that constructor makes it, from the 16 bytes the server sent."""
    cls = _UUID_LOADERS.get(id(psycopg))
    if cls is not None:
        return cls
    from psycopg.types.uuid import UUIDBinaryLoader

    new, set_slot, unknown = object.__new__, object.__setattr__, uuid.SafeUUID.unknown

    class FastUuidLoader(UUIDBinaryLoader):
        def load(self, data: Any) -> uuid.UUID:
            if len(data) != 16:
                return super().load(data)  # fails as psycopg's does
            value = new(uuid.UUID)
            set_slot(value, "int", int.from_bytes(data))
            set_slot(value, "is_safe", unknown)
            return value

    _UUID_LOADERS[id(psycopg)] = FastUuidLoader
    return FastUuidLoader


def _connection_class(psycopg: Any) -> Any:
    """psycopg's Connection, with every wait for the server bounded by the connection's
    `deadline`: psycopg's own wait loop (`Connection.wait`) takes a timeout, which it does
    not use by default. When it expires the connection is closed at once, since the server's
    state is unknown and anything sent on it (a rollback) would wait again."""
    cls = _CONNECTION_CLASSES.get(id(psycopg))
    if cls is not None:
        return cls

    class DeadlineConnection(psycopg.Connection):
        deadline: float | None = None

        def wait(self, gen: Any, interval: Any = None, timeout: float | None = None) -> Any:
            bounded = timeout if timeout is not None else self.deadline
            try:
                if interval is None:
                    return super().wait(gen, timeout=bounded)
                return super().wait(gen, interval, timeout=bounded)
            except Exception as error:
                if timeout is None and _is_wait_timeout(error):
                    self.pgconn.finish()
                raise

    _CONNECTION_CLASSES[id(psycopg)] = DeadlineConnection
    return DeadlineConnection


def _is_wait_timeout(error: BaseException) -> bool:
    """psycopg's wait loop gave up (its `_WaitTimeout`, an OperationalError of its own)."""
    return type(error).__name__ == "_WaitTimeout"


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


def _login(parameters: dict[str, str]) -> str | None:
    """The user name of these connection parameters (given apart or in the conninfo)."""
    from psycopg.conninfo import conninfo_to_dict

    if parameters.get("user"):
        return parameters["user"]
    try:
        user = conninfo_to_dict(parameters.get("conninfo", "")).get("user")
    except Exception:  # a conninfo psycopg cannot parse: the connect said why
        return None
    return str(user) if user else None


def _without(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def _message(error: Exception) -> str:
    diag = getattr(error, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    text = primary or str(error).strip().split("\n")[0]
    return mask_secrets(text)
