"""What a dialect is: one database family, described as data.

A `Dialect` holds the family's named SQL statements, its queue address grammar, its
capabilities (what the rest of the bridge asks instead of comparing dialect names), how to
open a connection, and a few value-encoding hooks. Each dialect module in this package defines
one as `DIALECT`; `bridge.dialects.registry` finds them.

The statements that read the same in every dialect (or all but one) are written once, in
`bridge.dialects.base.statements`; each dialect starts from them and overrides by name what
its database says differently.

Statements are templates with `{queue}`, `{retry}`, `{ledger}` and `{counters}` standing for
quoted, qualified table names and `?` for parameters. Identifiers are the only thing ever
pasted into SQL, and only after quoting by the dialect's address grammar. For each table `x`
a template may also use `{x_literal}` (the quoted, qualified name as an SQL string literal,
`'` doubled: for functions that take a name, such as SQL Server's `OBJECT_ID`) and
`{x_catalog}` (the quoted catalog followed by `.`, or nothing: for catalog views such as
`{x_catalog}sys.columns`).
"""

from __future__ import annotations

import hashlib
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from bridge.addressing import AddressGrammar, TableAddress
from bridge.dialects.base.names import (  # noqa: F401 (imported from here by the dialects)
    ARRAY_STATEMENT_NAMES,
    CONNECTION_LIMIT_STATEMENT_NAMES,
    COPY_STATEMENT_NAMES,
    IN_FLIGHT_STATEMENT_NAMES,
    LOGIN_RIGHTS_STATEMENT_NAMES,
    OPTIONAL_STATEMENT_GROUPS,
    OPTIONAL_STATEMENT_NAMES,
    PUSH_STATEMENT_NAMES,
    RAW_CLAIM_STATEMENT_NAMES,
    SERVER_ROLE_STATEMENT_NAMES,
    STATEMENT_NAMES,
    TRANSACTION_RECORD_STATEMENT_NAMES,
    TWO_PHASE_STATEMENT_NAMES,
)
from bridge.drivers.base import Connection, Row
from bridge.drivers.libpq import ConnectionProblem
from bridge.exceptions import DatabaseError


class ConfiguredDatabase(Protocol):
    """What a dialect needs to open a connection: the configured database, as
    `bridge.config.model.DatabaseConfig` has it (declared here so that dialects sit below the
    config package, which asks the registry for them)."""

    @property
    def name(self) -> str: ...

    @property
    def connection(self) -> str | None: ...

    @property
    def path(self) -> str | None: ...

    @property
    def connect_timeout(self) -> float: ...

    @property
    def query_timeout(self) -> float: ...

    @property
    def driver(self) -> str | None: ...

    @property
    def pooler(self) -> str | None: ...


# A multi-row VALUES statement writes at most this many rows, whatever the parameter limit.
MAX_ROWS_PER_STATEMENT = 1000
# Rendered statements a dialect keeps (see `Dialect._rendered`): enough for every statement of
# a busy daemon's hot queues at the row counts full batches use.
MAX_RENDERED_STATEMENTS = 256
MAX_RENDERED_CHARACTERS = 1_000_000


def row_counts(total: int, largest: int) -> list[int]:
    """How `total` rows are split into VALUES statements of at most `largest` (a power of
    two) rows each: full statements, then the rest in powers of two, so that a queue is
    written with at most about a dozen distinct statement texts whatever its batch sizes
    (each prepared once, none kept for every row count)."""
    counts = [largest] * (total // largest)
    rest = total % largest
    while rest:
        piece = 1 << (rest.bit_length() - 1)
        counts.append(piece)
        rest -= piece
    return counts


INDEX_SUFFIXES = ("expires", "due", "forwarded")

# The bridge's own tables live in each database's default schema under these names.
RETRY_TABLE = "sfbridge_retry"
LEDGER_TABLE = "sfbridge_ledger"
COUNTERS_TABLE = "sfbridge_counters"
EVENT_TYPES_TABLE = "sfbridge_event_types"
DESTINATION_STATES_TABLE = "sfbridge_destination_states"
FORWARDER_STATES_TABLE = "sfbridge_forwarder_states"
PAUSES_TABLE = "sfbridge_pauses"
DAEMONS_TABLE = "sfbridge_daemons"
AUDIT_TABLE = "sfbridge_audit"
# What the bridge's global transaction ids are made of (never quoted by a driver: see
# `Dialect.with_gid`).
GID_PATTERN = re.compile(r"[A-Za-z0-9:-]{1,200}")
TRANSACTIONS_TABLE = "sfbridge_transactions"
# Every one of them (the ledger in destination databases, the others in forwarding databases).
BRIDGE_TABLES = (
    RETRY_TABLE,
    LEDGER_TABLE,
    COUNTERS_TABLE,
    EVENT_TYPES_TABLE,
    DESTINATION_STATES_TABLE,
    FORWARDER_STATES_TABLE,
    PAUSES_TABLE,
    DAEMONS_TABLE,
    AUDIT_TABLE,
    TRANSACTIONS_TABLE,
)


class QueueShapes(Protocol):
    """Statement variants for queue tables whose shape differs from table to table. Pure.

    SQL Server queue tables may lack the legacy `Recoverable` column (the transport tolerates
    its removal since 7.0), and an INSERT must then leave it out. A dialect with such variants
    sets `Dialect.queue_shapes`; the data path's `QueueWriter` runs the lookup once per table,
    remembers the answer and asks again when a write shows it is stale.
    """

    def lookup(self, queue: TableAddress) -> tuple[str, tuple[Any, ...]]:
        """A query (SQL and parameters) whose rows tell the shape of the table `queue`."""
        ...

    def variants(self, rows: Sequence[Row]) -> Mapping[str, str] | None:
        """Statements replacing the dialect's own for a table whose lookup returned `rows`
        (maybe none); None when there is no such table (nothing to remember)."""
        ...

    def is_stale(self, error: DatabaseError) -> bool:
        """True when `error`, raised by a write, shows that a remembered shape is out of date."""
        ...


# Given the connection, a queue table's address, its columns (lower-cased name -> type name)
# and its index definitions as `table_indexes` returns them; returns problems, one sentence each.
QueueTableInspector = Callable[
    [Connection, TableAddress, Mapping[str, str], Sequence[str]], list[str]
]


class Connector(Protocol):
    """Opens a connection to a configured database of the dialect.

    `create` lets a file-based dialect create a missing database file (used by `install` and
    the demo); everywhere else a missing file is an unavailable database. Raises
    ConnectionFailed.
    """

    def __call__(self, database: ConfiguredDatabase, *, create: bool = False) -> Connection: ...


def decode_uuid(value: Any) -> uuid.UUID:
    """A uuid column's value as uuid.UUID (drivers give UUID objects or their text)."""
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def require_naive_utc(value: datetime | None) -> datetime | None:
    """Timestamps are bound as naive UTC wall-clock times, as the transports store them."""
    if value is not None and value.tzinfo is not None:
        raise ValueError("timestamps must be naive UTC")
    return value


def notify_channel(qualified: str) -> str:
    """The channel a table's push trigger notifies (`PUSH_STATEMENT_NAMES`), from its quoted,
    qualified name: short, and the same wherever the bridge derives it."""
    return "sfbridge_" + hashlib.sha256(qualified.encode()).hexdigest()[:24]


def sql_string_literal(text: str) -> str:
    """`text` as a standard SQL string literal: in single quotes, each quote doubled."""
    return "'" + text.replace("'", "''") + "'"


@dataclass(frozen=True)
class Dialect:
    """One database family.

    `name` is what a config's `dialect` key says and `title` how messages name the family.
    `grammar` reads and writes its queue addresses. `queue_columns` is the queue table shape
    the dialect expects (lower-cased names), used by `check`, as are `queue_indexed_columns`
    (each must lead some index). `encode_*` / `decode_*` turn Python values into what the
    driver binds and back.

    Capabilities, which the rest of the bridge asks instead of comparing names:
    `locator` is the config key that says where a database is (`connection`: an ODBC
    connection string; `path`: a file); `has_schemas` says whether tables live in schemas
    (the `schema` config keys); `single_writer` says the database serialises writers, so
    each forwarder gets one worker; `keep_destination_connections` is False where a
    connection is cheap to open and holding it would hide the database being taken away (an
    open SQLite handle keeps writing into a file that was moved). `connect` opens a
    connection: it picks the driver and gives it the dialect's connection options, session
    setup and error numbers.

    Optional hooks (None where a dialect needs none): `queue_shapes` says which statement
    variants a queue table takes (see `QueueShapes`); `inspect_queue_table` adds `check`
    findings of the dialect's own (SQL Server: what the transport itself warns about at
    startup). `drivers` names the drivers a database of this dialect can be opened with when
    there is a choice (the `driver` config key), the default first; empty where there is one.
    `connection_catalog` is set where addresses name catalogs (SQL Server): it reads the
    database (catalog) a connection string opens, None when the string names none.
    `load_driver` imports the driver a database is opened with (`connect` would, in its
    first call); it raises ImportError. `poolers` names the connection poolers' modes a
    database of this dialect may sit behind (the `pooler` config key, beside `none`).
    """

    name: str
    title: str
    grammar: AddressGrammar
    connect: Connector
    locator: Literal["connection", "path"]
    has_schemas: bool
    single_writer: bool
    statements: Mapping[str, str]
    queue_columns: frozenset[str]
    queue_indexed_columns: tuple[str, ...]
    keep_destination_connections: bool
    encode_id: Callable[[uuid.UUID], Any]
    decode_id: Callable[[Any], uuid.UUID]
    encode_timestamp: Callable[[datetime | None], Any]
    decode_timestamp: Callable[[Any], datetime | None]
    queue_shapes: QueueShapes | None = None
    inspect_queue_table: QueueTableInspector | None = None
    drivers: tuple[str, ...] = ()
    poolers: tuple[str, ...] = ()
    max_parameters: int = 2000
    # Why a transaction cannot be prepared here (`transaction: two-phase`); None where it can:
    # then the dialect has `prepare_transaction`, `commit_prepared`, `rollback_prepared` and
    # `prepared_transactions` statements.
    cannot_prepare: str | None = "the bridge cannot prepare transactions in this dialect"
    # The column types of each `*_copy` statement, in its column order (see
    # COPY_STATEMENT_NAMES).
    copy_types: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # How the text the `*_raw` claims return is encoded (see RAW_CLAIM_STATEMENT_NAMES).
    raw_text_encoding: str = "utf-8"
    connection_catalog: Callable[[str], str | None] | None = None
    load_driver: Callable[[ConfiguredDatabase], None] | None = None
    # The exact statements a DBA runs to give the bridge's login a right it lacks
    # (`bridge.storage.grants`): `create_tables` in an existing schema, `create_schemas` in the
    # database; `{login}`, `{schema}` and `{database}` are filled with quoted names. Empty where
    # rights are not granted in SQL (SQLite: file permissions). `install --print-grants`
    # (`bridge.commands.least_privilege`) uses the others, each optional: `create_login` (once
    # per server), `create_user` and `connect` (per database), `use_catalog`, `use_schema`,
    # `create_schema`, `rights` and `revoke` (`{rights}` on `{table}`), `use_sequence`,
    # `schema_insert` (a glob's whole schema); `login_note` is a comment for the DBA.
    grants: Mapping[str, str] = field(default_factory=dict)
    # The sequences an INSERT into a table uses, from its CREATE TABLE statement (PostgreSQL:
    # the `serial` columns'); None where inserts need no right but INSERT.
    serial_sequences: Callable[[TableAddress, str], tuple[TableAddress, ...]] | None = None
    # What is wrong with a connection string (given the `driver` key), key by key
    # (`bridge.drivers.libpq.ConnectionProblem`): checked when the config is loaded. None
    # where the dialect's driver takes its string as it is.
    connection_problems: Callable[[str, str | None], list[ConnectionProblem]] | None = None
    # What to do when a connection lands where writes are refused (`server_role`).
    read_only_advice: str = ""
    # Rendered statements by (overrides, name, rows, tables): the same text is the same
    # object, which pyodbc needs to reuse a prepared statement. Least recently used first;
    # bounded, since row counts and queues (named by messages) vary without end.
    _rendered: OrderedDict[tuple[Any, ...], str] = field(
        default_factory=OrderedDict, init=False, repr=False, compare=False
    )
    _rendered_lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    @property
    def has_catalogs(self) -> bool:
        """Whether addresses name catalogs (databases on the server): the `catalog` key."""
        return self.connection_catalog is not None

    @property
    def records_transactions(self) -> bool:
        """Whether the dialect keeps durable transaction records
        (`bridge.forwarding.transactions`)."""
        return "create_transactions_table" in self.statements

    def with_gid(self, name: str, gid: str) -> str:
        """The two-phase statement `name` for the global transaction id `gid` (a literal)."""
        if not GID_PATTERN.fullmatch(gid):
            raise ValueError(f"not a gid the bridge makes: {gid!r}")
        return self.statements[name].format(gid=sql_string_literal(gid))

    def opens_with_odbc(self, database: ConfiguredDatabase) -> bool:
        """Whether `database` is opened through ODBC: its `driver` (or the dialect's default)
        is `odbc`, or the dialect is reached by an ODBC connection string and has no choice."""
        if self.drivers:
            return (database.driver or self.drivers[0]) == "odbc"
        return self.locator == "connection"

    def sql(self, name: str, rows: int | None = None, **tables: TableAddress) -> str:
        """The statement `name` with its table placeholders filled by quoted, qualified names.

        `rows` is for the multi-row `*_many` statements: their `{rows}` placeholder becomes
        that many copies of the matching `*_row` template.
        """
        key = ((), name, rows, tuple(tables.items()))
        return self._cached(key, lambda: self._render(self.statements, name, rows, tables))

    def sql_with(
        self,
        overrides: Mapping[str, str],
        name: str,
        rows: int | None = None,
        **tables: TableAddress,
    ) -> str:
        """`sql(name, rows, **tables)` with some statements replaced (see `QueueShapes`)."""
        if not overrides:
            return self.sql(name, rows, **tables)
        key = (tuple(sorted(overrides.items())), name, rows, tuple(tables.items()))
        return self._cached(
            key, lambda: self._render({**self.statements, **overrides}, name, rows, tables)
        )

    def _cached(self, key: tuple[Any, ...], render: Callable[[], str]) -> str:
        with self._rendered_lock:
            rendered = self._rendered.get(key)
            if rendered is not None:
                self._rendered.move_to_end(key)
                return rendered
        rendered = render()
        with self._rendered_lock:
            self._rendered[key] = rendered
            kept = sum(len(text) for text in self._rendered.values())
            while len(self._rendered) > MAX_RENDERED_STATEMENTS or kept > MAX_RENDERED_CHARACTERS:
                _, dropped = self._rendered.popitem(last=False)
                kept -= len(dropped)
        return rendered

    def rows_statements(
        self,
        name: str,
        rows: Sequence[Sequence[Any]],
        *,
        arrays: bool,
        overrides: Mapping[str, str] | None = None,
        **tables: TableAddress,
    ) -> list[tuple[str, list[Any]]]:
        """The statements, each with its parameters, that write `rows` with the multi-row
        statement `name` (`send_many`, `ledger_record_many`, ...).

        With `arrays` (the connection binds arrays) and a `<name>_arrays` form: one statement
        of fixed text with one array per column, whatever the number of rows. Otherwise the
        VALUES form in the row counts `row_counts` gives (`max_parameters` bounds the
        largest).
        """
        if not rows:
            return []
        array_name = f"{name}_arrays"
        if arrays and array_name in self.statements:
            columns = [list(column) for column in zip(*rows, strict=True)]
            return [(self.sql_with(overrides or {}, array_name, None, **tables), columns)]
        statements = []
        start = 0
        for size in row_counts(len(rows), self._rows_per_statement(len(rows[0]))):
            chunk = rows[start : start + size]
            start += size
            sql = self.sql_with(overrides or {}, name, size, **tables)
            statements.append((sql, [value for row in chunk for value in row]))
        return statements

    def _rows_per_statement(self, width: int) -> int:
        """The most rows of `width` parameters one VALUES statement takes, a power of two."""
        most = max(1, min(MAX_ROWS_PER_STATEMENT, self.max_parameters // width))
        return 1 << (most.bit_length() - 1)

    def _render(
        self,
        statements: Mapping[str, str],
        name: str,
        rows: int | None,
        tables: Mapping[str, TableAddress],
    ) -> str:
        template = statements[name]
        if rows is not None:
            row = statements[name.removesuffix("_many") + "_row"]
            template = template.replace("{rows}", ", ".join([row] * rows))
        names: dict[str, str] = {}
        for key, address in tables.items():
            qualified = self.grammar.qualified_name(address)
            names[key] = qualified
            names[f"{key}_literal"] = sql_string_literal(qualified)
            names[f"{key}_channel"] = sql_string_literal(notify_channel(qualified))
            catalog = address.catalog
            names[f"{key}_catalog"] = (
                self.grammar.quote_identifier(catalog) + "." if catalog else ""
            )
            # Index names derive from the table name and are quoted like any identifier.
            for suffix in INDEX_SUFFIXES:
                names[f"{key}_index_{suffix}"] = self.grammar.quote_identifier(
                    f"{address.table}_{suffix}"
                )
        return template.format(**names)

    @property
    def pushes(self) -> bool:
        """Whether the database can tell the bridge of new rows (`PUSH_STATEMENT_NAMES`)."""
        return "create_notify_trigger" in self.statements

    def work_query(self, parts: Sequence[tuple[str, TableAddress]]) -> str:
        """One statement that tells which of a database's queues and retry stores have work:
        `parts` are ("queue", queue) and ("retry", retry storage), one row each, UNION ALL:
        (index, 1 when the queue holds a row, the earliest next attempt of the forwarder's
        retries). The parameters are each part's index, and after a retry part's index the
        forwarder's name."""
        return " UNION ALL ".join(
            self.sql(f"work_{kind}", None, **{kind: table}).strip() for kind, table in parts
        )

    def create_schema_sql(self, schema: str | None) -> str | None:
        """`CREATE SCHEMA` for `schema`, or None where the dialect has no schemas.

        The template gets `{schema}` (the quoted name) and `{schema_literal}` (the quoted name
        as a string literal).
        """
        template = self.statements["create_schema"]
        if not template or not schema:
            return None
        quoted = self.grammar.quote_identifier(schema)
        return template.format(schema=quoted, schema_literal=sql_string_literal(quoted))

    def bridge_table(self, table: str, schema: str | None) -> TableAddress:
        """Address of one of the bridge's own tables, in a database with default `schema`."""
        return self.grammar.resolve(TableAddress(table), schema, None)
