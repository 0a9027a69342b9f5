"""Specification of the SQL dialects (bridge.dialects): statements, quoting, value encoding."""

from __future__ import annotations

import re
import sqlite3
import string
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from bridge.addressing import TableAddress
from bridge.dialects import STATEMENT_NAMES, Dialect, dialect_for
from bridge.dialects.base import (
    COPY_STATEMENT_NAMES,
    COUNTERS_TABLE,
    INDEX_SUFFIXES,
    LEDGER_TABLE,
    OPTIONAL_STATEMENT_GROUPS,
    OPTIONAL_STATEMENT_NAMES,
    RETRY_TABLE,
    TWO_PHASE_STATEMENT_NAMES,
)
from bridge.dialects.postgresql import GRAMMAR as PG_GRAMMAR
from bridge.dialects.registry import dialects
from bridge.dialects.sqlite import GRAMMAR as SQLITE_GRAMMAR

GRAMMARS = {name: dialect.grammar for name, dialect in dialects().items()}

DIALECT_NAMES = ["postgresql", "sqlite"]
TABLE_PLACEHOLDERS = {
    "queue",
    "retry",
    "ledger",
    "counters",
    "subscriptions",
    "event_types",
    "destination_states",
    "forwarder_states",
    "daemons",
    "pauses",
    "audit",
    "transactions",
    "table",
    "function",  # push triggers' function (PUSH_STATEMENT_NAMES)
}

HOSTILE_NAMES = [
    'x"; DROP TABLE y --',
    '"; DROP TABLE y; --',
    "Receiver]; DROP TABLE y; --",
    "[bracketed]",
    "'; DROP TABLE y; --",
    'a"b""c',
    '"',
    "semi;colon",
    "new\nline",
    "{queue}",
    "{0}",
    "%s ? :name",
    "Zürich 🎉",
    "a.b",
]


@pytest.fixture(params=DIALECT_NAMES)
def dialect(request: pytest.FixtureRequest) -> Dialect:
    return dialect_for(request.param)


def _placeholders(template: str) -> set[str]:
    return {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}


def _tables_for(template: str, table: str, schema: str | None) -> dict[str, TableAddress]:
    """The table arguments `Dialect.sql` needs for `template`: each table it names, also
    when only as `{x_literal}` (a statement may name a table only as a string literal)."""
    bases = {name.removesuffix("_literal") for name in _placeholders(template)}
    return {name: TableAddress(table, schema) for name in bases if name in TABLE_PLACEHOLDERS}


def _all_statements(dialect: Dialect, table: str, schema: str | None) -> dict[str, str]:
    """Every statement's SQL as Dialect.sql produces it (create_schema via its own method)."""
    produced = {}
    for name, template in dialect.statements.items():
        if name == "create_schema":
            produced[name] = dialect.create_schema_sql(schema or "s") or ""
        elif "{gid}" in template:
            produced[name] = dialect.with_gid(name, "sfbridge:0a1b:2c3d")
        else:
            rows = 2 if name.endswith("_many") else None
            produced[name] = dialect.sql(name, rows=rows, **_tables_for(template, table, schema))
    return produced


# A double-quoted identifier, with "" standing for one quote inside it.
_QUOTED_IDENTIFIER = re.compile(r'"(?:[^"]|"")*"')


def _skeleton(sql: str) -> str:
    """The SQL with every quoted identifier replaced by a marker: what is left is syntax."""
    return _QUOTED_IDENTIFIER.sub('"<id>"', sql)


# --------------------------------------------------------------------------------------------
# dialect_for
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DIALECT_NAMES)
def test_dialect_for_returns_the_dialect_of_that_name(name: str) -> None:
    dialect = dialect_for(name)
    assert isinstance(dialect, Dialect)
    assert dialect.name == name
    assert dialect_for(name) is dialect


@pytest.mark.parametrize("name", ["mssql", "mysql", "", "PostgreSQL", "SQLServer"])
def test_dialect_for_an_unavailable_dialect_raises_key_error_naming_the_choices(
    name: str,
) -> None:
    with pytest.raises(KeyError) as info:
        dialect_for(name)
    assert repr(name) in str(info.value)
    assert "postgresql, sqlite, sqlserver" in str(info.value)


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_every_address_grammar_has_a_dialect_with_exactly_the_statement_names(name: str) -> None:
    assert set(dialect_for(name).statements) - OPTIONAL_STATEMENT_NAMES == STATEMENT_NAMES


def test_each_dialect_speaks_its_own_address_grammar() -> None:
    assert dialect_for("postgresql").grammar is PG_GRAMMAR
    assert dialect_for("sqlite").grammar is SQLITE_GRAMMAR


# --------------------------------------------------------------------------------------------
# Statement sets
# --------------------------------------------------------------------------------------------


def test_every_dialect_defines_exactly_the_statement_names(dialect: Dialect) -> None:
    names = set(dialect.statements)
    assert names - OPTIONAL_STATEMENT_NAMES == STATEMENT_NAMES
    # Optional forms are all there or none: e.g. a driver that binds arrays uses each of them.
    for group in OPTIONAL_STATEMENT_GROUPS:
        assert names & group in (set(), group)
    assert (dialect.cannot_prepare is None) == (names >= TWO_PHASE_STATEMENT_NAMES)
    if names >= TWO_PHASE_STATEMENT_NAMES:
        assert dialect.records_transactions
    # Every COPY statement says its column types, as many as its column list names, and its
    # query for the table's types reads the same columns.
    copies = {name for name in names & COPY_STATEMENT_NAMES if not name.endswith("_columns")}
    assert set(dialect.copy_types) == copies
    for name, types in dialect.copy_types.items():
        columns = dialect.statements[name].split("(", 1)[1].split(")", 1)[0].split(",")
        assert len(types) == len(columns), name
        read = dialect.statements[f"{name}_columns"].split("SELECT", 1)[1].split("FROM")[0]
        assert [c.strip() for c in read.split(",")] == [c.strip() for c in columns], name


def test_statement_names_are_the_documented_set() -> None:
    assert isinstance(STATEMENT_NAMES, frozenset)
    assert {"receive_batch", "send", "dead_letter", "ledger_record", "savepoint"} <= (
        STATEMENT_NAMES
    )


def test_every_statement_is_text(dialect: Dialect) -> None:
    for name, template in dialect.statements.items():
        assert isinstance(template, str), name
        if name != "create_schema":
            assert template.strip(), name


def test_statement_placeholders_are_only_tables_and_their_index_names(dialect: Dialect) -> None:
    for name, template in dialect.statements.items():
        for field in _placeholders(template):
            if name == "create_schema":
                assert field == "schema"
                continue
            if field == "gid":
                assert name in TWO_PHASE_STATEMENT_NAMES, name
                continue
            if field == "rows":
                assert name.endswith("_many") and name.removesuffix("_many") + "_row" in (
                    dialect.statements
                )
                continue
            if field.endswith(("_literal", "_channel", "_catalog")):
                field = field.rsplit("_", 1)[0]  # the table's name as a literal, its channel
            base, _, suffix = field.partition("_index_")
            assert base in TABLE_PLACEHOLDERS, (name, field)
            assert not suffix or suffix in INDEX_SUFFIXES, (name, field)


@pytest.mark.parametrize("name", sorted(STATEMENT_NAMES - {"create_schema"}))
def test_every_statement_template_formats_with_the_placeholders_it_uses(
    dialect: Dialect, name: str
) -> None:
    template = dialect.statements[name]
    tables = _tables_for(template, "Receiver", "inbox" if dialect.name == "postgresql" else None)
    rows = 3 if name.endswith("_many") else None
    sql = dialect.sql(name, rows=rows, **tables)
    if rows:
        row = dialect.statements[name.removesuffix("_many") + "_row"]
        assert sql.count(row) == 3
    assert "{" not in sql
    assert "}" not in sql
    for key, address in tables.items():
        assert dialect.grammar.qualified_name(address) in sql, key


def test_statements_without_placeholders_come_out_unchanged(dialect: Dialect) -> None:
    for name, template in dialect.statements.items():
        if not _placeholders(template) and name != "create_schema":
            assert dialect.sql(name) == template


def test_index_placeholders_become_quoted_index_names_derived_from_the_table(
    dialect: Dialect,
) -> None:
    sql = dialect.sql("create_retry_table", retry=TableAddress("sfbridge_retry"))
    assert 'INDEX IF NOT EXISTS "sfbridge_retry_due" ON' in sql
    sql = dialect.sql("create_ledger_table", ledger=TableAddress("sfbridge_ledger"))
    assert 'INDEX IF NOT EXISTS "sfbridge_ledger_forwarded" ON' in sql


def test_a_statement_missing_its_table_argument_fails_loudly(dialect: Dialect) -> None:
    with pytest.raises(KeyError):
        dialect.sql("send")


def test_an_unknown_statement_name_fails_loudly(dialect: Dialect) -> None:
    with pytest.raises(KeyError):
        dialect.sql("drop_everything")


def test_parameters_are_question_marks(dialect: Dialect) -> None:
    send = dialect.sql("send", queue=TableAddress("q"))
    assert send.count("?") == 4
    assert "%s" not in send


def test_postgresql_names_are_schema_qualified() -> None:
    sql = dialect_for("postgresql").sql("send", queue=TableAddress("Receiver", "inbox"))
    assert 'INSERT INTO "inbox"."Receiver" ' in sql
    sql = dialect_for("postgresql").sql("send", queue=TableAddress("Receiver"))
    assert 'INSERT INTO "public"."Receiver" ' in sql


def test_sqlite_names_are_the_bare_quoted_table() -> None:
    sql = dialect_for("sqlite").sql("send", queue=TableAddress("Samples.Receiver"))
    assert 'INSERT INTO "Samples.Receiver" ' in sql


# --------------------------------------------------------------------------------------------
# Identifier quoting: hostile names stay inside one quoted identifier
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_hostile_identifiers_cannot_change_the_sql_around_them(
    dialect: Dialect, hostile: str
) -> None:
    schema = "inbox" if dialect.name == "postgresql" else None
    benign = _all_statements(dialect, "Receiver", schema)
    attacked = _all_statements(dialect, hostile, schema)
    for name in STATEMENT_NAMES:
        assert _skeleton(attacked[name]) == _skeleton(benign[name]), name


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_a_hostile_postgresql_schema_stays_inside_one_quoted_identifier(hostile: str) -> None:
    postgresql = dialect_for("postgresql")
    benign = _all_statements(postgresql, "Receiver", "inbox")
    attacked = _all_statements(postgresql, "Receiver", hostile)
    for name in STATEMENT_NAMES - {"create_schema"}:
        assert _skeleton(attacked[name]) == _skeleton(benign[name]), name
    create = postgresql.create_schema_sql(hostile)
    assert create == "CREATE SCHEMA IF NOT EXISTS " + PG_GRAMMAR.quote_identifier(hostile)
    assert _skeleton(create) == 'CREATE SCHEMA IF NOT EXISTS "<id>"'


def test_the_injection_example_is_quoted_by_doubling_the_quote(dialect: Dialect) -> None:
    sql = dialect.sql("queue_count", queue=TableAddress('x"; DROP TABLE y --'))
    assert '"x""; DROP TABLE y --"' in sql
    assert _skeleton(sql) in {
        'SELECT count(*) FROM "<id>"',  # sqlite
        'SELECT count(*) FROM "<id>"."<id>"',  # postgresql: schema-qualified
    }


def test_index_names_of_hostile_tables_are_quoted_too(dialect: Dialect) -> None:
    sql = dialect.sql("create_retry_table", retry=TableAddress('x"; DROP TABLE y --'))
    assert 'INDEX IF NOT EXISTS "x""; DROP TABLE y --_due" ON' in sql


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_sqlite_executes_ddl_for_a_hostile_name_as_one_table(hostile: str) -> None:
    sqlite = dialect_for("sqlite")
    address = TableAddress(hostile)
    connection = sqlite3.connect(":memory:")
    try:
        connection.execute('CREATE TABLE "y" (a)')
        connection.executescript(sqlite.sql("create_queue", queue=address))
        connection.execute(
            sqlite.sql("send", queue=address), (str(uuid.uuid4()), None, "{}", b"body")
        )
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
        assert "y" in tables
        assert hostile in tables
        (count,) = connection.execute(sqlite.sql("queue_count", queue=address)).fetchone()
        assert count == 1
    finally:
        connection.close()


# --------------------------------------------------------------------------------------------
# create_schema_sql and bridge tables
# --------------------------------------------------------------------------------------------


def test_postgresql_creates_schemas() -> None:
    assert dialect_for("postgresql").create_schema_sql("inbox") == (
        'CREATE SCHEMA IF NOT EXISTS "inbox"'
    )


@pytest.mark.parametrize("schema", [None, ""])
def test_no_schema_means_no_create_schema(schema: str | None) -> None:
    assert dialect_for("postgresql").create_schema_sql(schema) is None


def test_sqlite_has_no_schemas_to_create() -> None:
    assert dialect_for("sqlite").create_schema_sql("inbox") is None


def test_bridge_tables_live_in_the_database_default_schema() -> None:
    postgresql = dialect_for("postgresql")
    assert postgresql.bridge_table(RETRY_TABLE, None) == TableAddress("sfbridge_retry", "public")
    assert postgresql.bridge_table(LEDGER_TABLE, "inbox") == TableAddress(
        "sfbridge_ledger", "inbox"
    )
    sqlite = dialect_for("sqlite")
    assert sqlite.bridge_table(COUNTERS_TABLE, "inbox") == TableAddress("sfbridge_counters")


# --------------------------------------------------------------------------------------------
# Queue table shape
# --------------------------------------------------------------------------------------------


def _created_columns(create: str) -> set[str]:
    body = create[create.index("(") + 1 : create.index(";") if ";" in create else None]
    return {
        line.split()[0].lower()
        for line in body.splitlines()
        if line.strip() and line.split()[0][0].isalpha() and not line.strip().startswith(")")
    }


def test_the_expected_queue_columns_are_the_ones_create_queue_makes(dialect: Dialect) -> None:
    create = dialect.sql("create_queue", queue=TableAddress("q"))
    assert _created_columns(create) == dialect.queue_columns


def test_queue_columns_are_lower_case(dialect: Dialect) -> None:
    assert all(column == column.lower() for column in dialect.queue_columns)


def test_indexed_queue_columns_are_queue_columns(dialect: Dialect) -> None:
    assert set(dialect.queue_indexed_columns) <= dialect.queue_columns


def test_sqlite_queue_table_has_the_expected_columns_when_created() -> None:
    sqlite = dialect_for("sqlite")
    connection = sqlite3.connect(":memory:")
    try:
        connection.executescript(sqlite.sql("create_queue", queue=TableAddress("q")))
        columns = {row[1].lower() for row in connection.execute("PRAGMA table_info('q')")}
    finally:
        connection.close()
    assert columns == sqlite.queue_columns


# --------------------------------------------------------------------------------------------
# Value encoding: ids
# --------------------------------------------------------------------------------------------

AN_ID = uuid.UUID("9c8b3f6e-2f6a-4a4e-9f3e-6c1d2b7a5e01")


def test_sqlite_stores_ids_as_canonical_text() -> None:
    sqlite = dialect_for("sqlite")
    assert sqlite.encode_id(AN_ID) == "9c8b3f6e-2f6a-4a4e-9f3e-6c1d2b7a5e01"
    assert sqlite.decode_id("9c8b3f6e-2f6a-4a4e-9f3e-6c1d2b7a5e01") == AN_ID
    assert sqlite.decode_id("9C8B3F6E-2F6A-4A4E-9F3E-6C1D2B7A5E01") == AN_ID


def test_postgresql_binds_uuid_objects_and_decodes_text_or_uuid() -> None:
    postgresql = dialect_for("postgresql")
    assert postgresql.encode_id(AN_ID) is AN_ID
    assert postgresql.decode_id(AN_ID) is AN_ID
    assert postgresql.decode_id("9c8b3f6e-2f6a-4a4e-9f3e-6c1d2b7a5e01") == AN_ID


def test_ids_round_trip(dialect: Dialect) -> None:
    for _ in range(20):
        value = uuid.uuid4()
        assert dialect.decode_id(dialect.encode_id(value)) == value


# --------------------------------------------------------------------------------------------
# Value encoding: timestamps (naive UTC)
# --------------------------------------------------------------------------------------------

MOMENTS = [
    datetime(2024, 5, 1, 12, 0, 0, 500_000),
    datetime(2024, 5, 1, 12, 0, 0),
    datetime(2016, 8, 16, 10, 6, 20, 123_456),
    datetime(2000, 1, 1, 0, 0, 0, 1),
    datetime(9999, 12, 31, 23, 59, 59, 999_999),
    datetime(2024, 2, 29, 23, 59, 59, 999_999),
]


@pytest.mark.parametrize("moment", MOMENTS)
def test_timestamps_round_trip(dialect: Dialect, moment: datetime) -> None:
    decoded = dialect.decode_timestamp(dialect.encode_timestamp(moment))
    assert decoded == moment
    assert decoded is not None
    assert decoded.tzinfo is None


def test_none_timestamps_round_trip(dialect: Dialect) -> None:
    assert dialect.encode_timestamp(None) is None
    assert dialect.decode_timestamp(None) is None


def test_sqlite_stores_timestamps_as_fixed_width_utc_text() -> None:
    sqlite = dialect_for("sqlite")
    assert sqlite.encode_timestamp(datetime(2024, 5, 1, 12, 0, 0, 500_000)) == (
        "2024-05-01 12:00:00.500000"
    )
    assert sqlite.encode_timestamp(datetime(2024, 5, 1, 12, 0)) == "2024-05-01 12:00:00.000000"


def test_sqlite_timestamp_text_sorts_in_time_order() -> None:
    sqlite = dialect_for("sqlite")
    start = datetime(2024, 12, 31, 23, 59, 58)
    moments = [start + timedelta(microseconds=n * 250_001) for n in range(12)]
    moments += [datetime(2024, 1, 1), datetime(2025, 1, 1), datetime(2024, 9, 9, 9, 9, 9, 9)]
    encoded = [sqlite.encode_timestamp(moment) for moment in moments]
    assert sorted(encoded) == [sqlite.encode_timestamp(moment) for moment in sorted(moments)]


def test_sqlite_decodes_its_own_now_text_with_millisecond_precision() -> None:
    # strftime('%Y-%m-%d %H:%M:%f', 'now') yields three fraction digits.
    assert dialect_for("sqlite").decode_timestamp("2024-05-01 12:00:00.123") == datetime(
        2024, 5, 1, 12, 0, 0, 123_000
    )


def test_sqlite_decodes_text_that_sqlite_itself_produces() -> None:
    connection = sqlite3.connect(":memory:")
    try:
        (text,) = connection.execute("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')").fetchone()
    finally:
        connection.close()
    decoded = dialect_for("sqlite").decode_timestamp(text)
    assert decoded is not None
    now = datetime.now(UTC).replace(tzinfo=None)
    assert abs(decoded - now) < timedelta(minutes=1)


def test_postgresql_binds_naive_datetimes_as_they_are() -> None:
    moment = datetime(2024, 5, 1, 12, 0, 0, 500_000)
    assert dialect_for("postgresql").encode_timestamp(moment) is moment


def test_postgresql_decodes_datetimes_and_iso_text() -> None:
    postgresql = dialect_for("postgresql")
    moment = datetime(2024, 5, 1, 12, 0, 0, 500_000)
    assert postgresql.decode_timestamp(moment) is moment
    assert postgresql.decode_timestamp("2024-05-01 12:00:00.500000") == moment
    assert postgresql.decode_timestamp("2024-05-01T12:00:00.5") == moment


def test_decoding_a_datetime_passes_it_through(dialect: Dialect) -> None:
    moment = datetime(2024, 5, 1, 12, 0)
    assert dialect.decode_timestamp(moment) is moment


@pytest.mark.parametrize(
    "aware",
    [
        datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
        datetime(2024, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2))),
    ],
)
def test_a_tz_aware_datetime_is_refused(dialect: Dialect, aware: datetime) -> None:
    with pytest.raises(ValueError, match="naive UTC"):
        dialect.encode_timestamp(aware)


@pytest.mark.parametrize(
    ("total", "largest", "expected"),
    [
        (1000, 256, [256, 256, 256, 128, 64, 32, 8]),
        (512, 512, [512]),
        (7, 512, [4, 2, 1]),
        (1, 1, [1]),
        (0, 256, []),
    ],
)
def test_rows_are_written_in_full_statements_then_powers_of_two(
    total: int, largest: int, expected: list[int]
) -> None:
    from bridge.dialects.base import row_counts

    assert row_counts(total, largest) == expected
    assert sum(row_counts(total, largest)) == total
