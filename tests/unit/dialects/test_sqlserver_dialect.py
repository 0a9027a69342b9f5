"""Specification of the SQL Server dialect (bridge.dialects.sqlserver), checked offline.

No SQL Server runs where these tests run, so every statement is checked three ways: its shape
(what the transport does), its quoting (a T-SQL lexer written here
replaces every bracketed identifier and string literal, and hostile names must leave the rest
unchanged), and a real T-SQL grammar (sqlfluff's `tsql` dialect). sqlfluff is lenient (it
accepts `DELETE TOP 1`), so the shape tests matter as much as the parse.
"""

from __future__ import annotations

import hashlib
import re
import string
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta, timezone
from functools import cache
from typing import Any

import pytest

from bridge.addressing import TableAddress
from bridge.config.model import DatabaseConfig, RouteConfig
from bridge.dialects import STATEMENT_NAMES, dialect_for
from bridge.dialects.base import (
    INDEX_SUFFIXES,
    LOGIN_RIGHTS_STATEMENT_NAMES,
    RAW_CLAIM_STATEMENT_NAMES,
    SERVER_ROLE_STATEMENT_NAMES,
)
from bridge.dialects.postgresql import STATEMENTS as PG_STATEMENTS
from bridge.dialects.sqlserver import DIALECT as SQLSERVER
from bridge.dialects.sqlserver import (
    GRAMMAR,
    PERMISSIONS_QUERY,
    RECOVERABLE_LOOKUP,
    SESSION_SETUP,
    WITHOUT_RECOVERABLE,
    RecoverableColumn,
    inspect_queue_table,
)
from bridge.exceptions import DatabaseError, TableNotFound
from bridge.forwarding.writes import QueueWriter
from bridge.routing import route_destination
from bridge.storage.tables import split_statements

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
    "archive",
    "table",
}
PLACEHOLDER_SUFFIXES = ("", "_literal", "_catalog")
SQL_SERVER_PARAMETER_LIMIT = 2100

QUEUE = TableAddress("Samples.Receiver", "dbo")
IN_CATALOG = TableAddress("Samples.Receiver", "nsb", "receiver")

# Names that try to leave their quoting, in every part of an address.
HOSTILE_NAMES = [
    "my]table",
    "x]; DROP TABLE y --",
    "[my]]schema]",
    "]",
    "]]",
    "[",
    "x'; DROP TABLE y; --",
    "'",
    "''",
    'a"b',
    "N'x'",
    "semi;colon",
    "new\nline",
    "/* comment",
    "{queue}",
    "{0}",
    "%s ? :name",
    "?",
    "Zürich 🎉",
    "a.b",
    "GO",
]


# --------------------------------------------------------------------------------------------
# A T-SQL lexer, just enough to tell names and strings from syntax
# --------------------------------------------------------------------------------------------


def lex(sql: str) -> tuple[str, list[str], list[str], int]:
    """Split T-SQL into (skeleton, identifiers, strings, parameter markers).

    The skeleton is the SQL with every `[bracketed identifier]` replaced by `[id]` and every
    `'string'` / `N'string'` by `'str'`; identifiers and strings are returned unquoted. Fails
    on a comment, a double-quoted identifier or anything unterminated outside quotes: the
    dialect writes none of them.
    """
    out: list[str] = []
    identifiers: list[str] = []
    strings: list[str] = []
    markers = 0
    position = 0
    while position < len(sql):
        char = sql[position]
        if char == "[":
            end = position + 1
            name: list[str] = []
            while True:
                assert end < len(sql), f"unterminated identifier in {sql!r}"
                if sql[end] == "]":
                    if sql.startswith("]]", end):
                        name.append("]")
                        end += 2
                        continue
                    break
                name.append(sql[end])
                end += 1
            identifiers.append("".join(name))
            out.append("[id]")
            position = end + 1
        elif char == "'":
            end = position + 1
            text: list[str] = []
            while True:
                assert end < len(sql), f"unterminated string in {sql!r}"
                if sql[end] == "'":
                    if sql.startswith("''", end):
                        text.append("'")
                        end += 2
                        continue
                    break
                text.append(sql[end])
                end += 1
            strings.append("".join(text))
            out.append("'str'")
            position = end + 1
        else:
            assert not sql.startswith(("--", "/*"), position), f"comment in {sql!r}"
            assert char != '"', f"double-quoted identifier in {sql!r}"
            assert char != "]", f"stray ']' in {sql!r}"
            markers += char == "?"
            out.append(char)
            position += 1
    return "".join(out), identifiers, strings, markers


def test_the_lexer_reads_escaped_names_and_strings() -> None:
    skeleton, identifiers, strings, markers = lex("SELECT [a]]b], N'it''s' FROM [x] WHERE y = ?")
    assert skeleton == "SELECT [id], N'str' FROM [id] WHERE y = ?"
    assert identifiers == ["a]b", "x"]
    assert strings == ["it's"]
    assert markers == 1


@pytest.mark.parametrize("sql", ["SELECT [a", "SELECT 'a", "SELECT 1 -- x", 'SELECT "a"', "a]"])
def test_the_lexer_refuses_what_the_dialect_never_writes(sql: str) -> None:
    with pytest.raises(AssertionError):
        lex(sql)


# --------------------------------------------------------------------------------------------
# Rendering every statement
# --------------------------------------------------------------------------------------------


def _placeholders(template: str) -> set[str]:
    return {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}


def _tables(template: str, address: TableAddress) -> dict[str, TableAddress]:
    tables = {}
    for field in _placeholders(template):
        base = field.partition("_index_")[0]
        for suffix in ("_literal", "_catalog"):
            base = base.removesuffix(suffix)
        if base in TABLE_PLACEHOLDERS:
            tables[base] = address
    return tables


def render_all(address: TableAddress, rows: int = 2) -> dict[str, str]:
    """Every statement as the bridge produces it, the statement variants and extra queries
    included; `create_schema` for the address's schema."""
    produced = {}
    for name, template in SQLSERVER.statements.items():
        if name == "create_schema":
            produced[name] = SQLSERVER.create_schema_sql(address.schema or "dbo") or ""
            continue
        many = rows if name.endswith("_many") else None
        produced[name] = SQLSERVER.sql(name, rows=many, **_tables(template, address))
    variants = {**SQLSERVER.statements, **WITHOUT_RECOVERABLE}
    for name in WITHOUT_RECOVERABLE:
        if not name.endswith("_row"):
            many = rows if name.endswith("_many") else None
            produced[f"{name} without Recoverable"] = SQLSERVER._render(
                variants, name, many, {"queue": address}
            )
    catalog = GRAMMAR.quote_identifier(address.catalog) + "." if address.catalog else ""
    produced["recoverable lookup"] = RECOVERABLE_LOOKUP.format(catalog=catalog)
    produced["permissions"] = PERMISSIONS_QUERY
    for index, statement in enumerate(SESSION_SETUP):
        produced[f"session setup {index}"] = statement
    # `*_row` templates are fragments of the `*_many` statements, not statements of their own.
    return {name: sql for name, sql in produced.items() if sql and not name.endswith("_row")}


def test_the_dialect_defines_exactly_the_statement_names() -> None:
    assert set(SQLSERVER.statements) == (
        STATEMENT_NAMES
        | RAW_CLAIM_STATEMENT_NAMES
        | LOGIN_RIGHTS_STATEMENT_NAMES
        | SERVER_ROLE_STATEMENT_NAMES
    )
    assert dialect_for("sqlserver") is SQLSERVER
    assert SQLSERVER.grammar is GRAMMAR


def test_placeholders_are_only_tables_their_literals_catalogs_and_index_names() -> None:
    for name, template in {**SQLSERVER.statements, **WITHOUT_RECOVERABLE}.items():
        for field in _placeholders(template):
            if name == "create_schema":
                assert field in {"schema", "schema_literal"}
            elif field == "rows":
                assert name.endswith("_many")
            else:
                base, _, suffix = field.partition("_index_")
                assert any(base == t + s for t in TABLE_PLACEHOLDERS for s in PLACEHOLDER_SUFFIXES)
                assert not suffix or suffix in INDEX_SUFFIXES, (name, field)


@pytest.mark.parametrize("address", [QUEUE, IN_CATALOG], ids=["two-part", "three-part"])
def test_every_statement_renders_completely(address: TableAddress) -> None:
    for name, sql in render_all(address).items():
        assert "{" not in sql and "}" not in sql, name
        lex(sql)  # balanced quoting, no comments


def test_every_table_is_named_with_its_catalog_when_the_address_has_one() -> None:
    rendered = render_all(IN_CATALOG)
    for name, template in SQLSERVER.statements.items():
        fields = _placeholders(template)
        sql = rendered.get(name)
        # A fragment; schemas (created where the bridge's own tables are): the connection's db.
        # The login's rights: in the connection's database, which they are about.
        if (
            sql is None
            or name in ("create_schema", "schema_exists")
            or name in (LOGIN_RIGHTS_STATEMENT_NAMES)
        ):
            continue
        if TABLE_PLACEHOLDERS & fields:
            assert "[receiver].[nsb].[Samples.Receiver]" in sql, name
        # Catalog views are read in the table's catalog, never in the connection's.
        assert sql.count("sys.") == sql.count("[receiver].sys."), name
    assert "FROM [receiver].sys.columns" in rendered["recoverable lookup"]
    assert "OBJECT_ID(N'[receiver].[nsb].[Samples.Receiver]'" in rendered["create_queue"]


def test_without_a_catalog_names_are_two_part_and_catalog_views_are_the_connections() -> None:
    statements = render_all(QUEUE)
    assert "INSERT INTO [dbo].[Samples.Receiver] (" in statements["send"]
    assert "FROM sys.columns AS c" in statements["table_columns"]
    assert "FROM sys.columns" in statements["recoverable lookup"]


# --------------------------------------------------------------------------------------------
# Quoting: an address can never break out of its quoting
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
@pytest.mark.parametrize("part", ["table", "schema", "catalog"])
def test_hostile_names_stay_names_in_every_statement(hostile: str, part: str) -> None:
    benign = TableAddress("Receiver", "inbox", "nsb")
    attacked = TableAddress(
        hostile if part == "table" else "Receiver",
        hostile if part == "schema" else "inbox",
        hostile if part == "catalog" else "nsb",
    )
    expected = render_all(benign)
    for name, sql in render_all(attacked).items():
        skeleton, identifiers, _, markers = lex(sql)
        benign_skeleton, _, _, benign_markers = lex(expected[name])
        assert skeleton == benign_skeleton, name
        assert markers == benign_markers, name
        if part == "table" and name.startswith(("send", "receive_batch")):
            assert hostile in identifiers, name


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_names_inside_string_literals_read_back_as_the_quoted_name(hostile: str) -> None:
    address = TableAddress(hostile, hostile, hostile)
    sql = SQLSERVER.sql("create_queue", queue=address)
    _, _, strings, _ = lex(sql)
    # OBJECT_ID and the application lock get the same three-part name the DDL uses.
    assert set(strings) >= {GRAMMAR.qualified_name(address)}
    create_schema = SQLSERVER.create_schema_sql(hostile)
    assert create_schema is not None
    _, _, strings, _ = lex(create_schema)
    assert GRAMMAR.quote_identifier(hostile) in strings


def test_the_injection_examples_from_the_issue() -> None:
    send = SQLSERVER.sql("send", queue=TableAddress("x]; DROP TABLE y --", "[my]]schema]"))
    assert send.split("(")[0].strip() == ("INSERT INTO [[my]]]]schema]]].[x]]; DROP TABLE y --]")
    send = SQLSERVER.sql("send", queue=TableAddress("my]table"))
    assert "INSERT INTO [dbo].[my]]table] (" in send


# --------------------------------------------------------------------------------------------
# A real T-SQL grammar: sqlfluff's tsql dialect
# --------------------------------------------------------------------------------------------


@cache
def _linter() -> Any:
    from sqlfluff.core import FluffConfig, Linter

    config = FluffConfig(
        configs={
            "core": {"dialect": "tsql", "templater": "placeholder"},
            "templater": {"placeholder": {"param_style": "question_mark"}},
        }
    )
    return Linter(config=config)


def parse_problems(sql: str) -> list[str]:
    """What sqlfluff's T-SQL grammar cannot parse in `sql` (empty: it parses)."""
    # Every well-formed bracketed name the same: sqlfluff's lexer does not know `]]` inside
    # one, and a statement then renders the same for every address of as many parts, so it
    # is parsed once, not once per address (a second or more each). A name quoted wrongly
    # leaves text outside brackets, which still fails the parse. The quoting itself is
    # checked by the lexer tests above.
    return list(_parse_problems(re.sub(r"\[(?:[^\]]|\]\])*\]", "[n]", sql)))


# What earlier runs found, by sqlfluff's version and the statement's text (pytest's cache,
# in .pytest_cache): the same text under the same grammar parses the same, so a developer's
# run parses only statements that changed; a fresh clone (CI) parses every one. About 25 s of
# the unit tier otherwise.
_PARSES_KEY = "sfbridge/tsql-parses"
_earlier_parses: dict[str, list[str]] = {}


@pytest.fixture(scope="module", autouse=True)
def _remembered_parses(pytestconfig: pytest.Config) -> Iterator[None]:
    cache = getattr(pytestconfig, "cache", None)  # None with -p no:cacheprovider
    if cache is not None:
        _earlier_parses.update(cache.get(_PARSES_KEY, {}))
    known = len(_earlier_parses)
    yield
    if cache is not None and len(_earlier_parses) != known:
        cache.set(_PARSES_KEY, {**cache.get(_PARSES_KEY, {}), **_earlier_parses})


@cache  # most statements render the same for one row and for three: parsed once
def _parse_problems(plain: str) -> tuple[str, ...]:
    import sqlfluff

    key = f"{sqlfluff.__version__}:{hashlib.sha256(plain.encode()).hexdigest()}"
    if key in _earlier_parses:
        return tuple(_earlier_parses[key])
    parsed = _linter().parse_string(plain)
    problems = [violation.desc() for violation in parsed.violations]
    if parsed.tree is None or "unparsable" in parsed.tree.stringify():
        problems.append("unparsable section")
    _earlier_parses[key] = problems
    return tuple(problems)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT TOP (1) * FROM [q] LIMIT 1",
        "DELETE FROM [q] WHERE",
        "SELEC * FROM [q]",
        "MERGE [q] USING",
    ],
)
def test_the_grammar_check_rejects_broken_tsql(sql: str) -> None:
    assert parse_problems(sql)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize(
    "address",
    [QUEUE, IN_CATALOG, TableAddress("x]; DROP TABLE y --", "[my]]schema]", "it's")],
    ids=["two-part", "three-part", "hostile"],
)
def test_every_statement_parses_as_tsql(address: TableAddress, rows: int) -> None:
    failures = {
        name: problems
        for name, sql in render_all(address, rows=rows).items()
        if (problems := parse_problems(sql))
    }
    assert not failures


def test_a_batch_of_thousands_is_split_into_statements_that_parse_under_the_parameter_limit() -> (
    None
):
    for name, width in (("send_many", 4), ("ledger_record_many", 2)):
        rows = [tuple(range(width))] * 5000
        statements = SQLSERVER.rows_statements(name, rows, arrays=True, queue=QUEUE, ledger=QUEUE)
        assert sum(len(parameters) for _, parameters in statements) == 5000 * width
        assert len(statements) > 1  # no array binding on SQL Server: VALUES rows
        for sql, parameters in statements[:1]:
            assert not parse_problems(sql)
            assert lex(sql)[3] == len(parameters) < SQL_SERVER_PARAMETER_LIMIT


# --------------------------------------------------------------------------------------------
# Shapes: DDL
# --------------------------------------------------------------------------------------------


def _normalised(sql: str) -> str:
    return re.sub(r"\s+", " ", sql).strip()


def test_queue_tables_have_the_transports_current_shape() -> None:
    sql = _normalised(SQLSERVER.sql("create_queue", queue=QUEUE))
    assert (
        "CREATE TABLE [dbo].[Samples.Receiver] ( Id uniqueidentifier NOT NULL, "
        "CorrelationId varchar(255), ReplyToAddress varchar(255), Recoverable bit NOT NULL, "
        "Expires datetime, Headers nvarchar(max) NOT NULL, Body varbinary(max), "
        "RowVersion bigint IDENTITY(1,1) NOT NULL )"
    ) in sql
    assert (
        "CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [dbo].[Samples.Receiver] (RowVersion)"
    ) in sql
    assert (
        "CREATE NONCLUSTERED INDEX [Index_Expires] ON [dbo].[Samples.Receiver] (Expires) "
        "INCLUDE (Id, RowVersion) WHERE Expires IS NOT NULL"
    ) in sql
    assert "CLUSTERED INDEX [Index_RowVersion]" not in sql.replace("NONCLUSTERED", "")
    assert "PRIMARY KEY" not in sql


@pytest.mark.parametrize(
    "name",
    [
        "create_queue",
        "create_retry_table",
        "create_ledger_table",
        "create_counters_table",
        "create_event_types_table",
    ],
)
def test_table_creation_is_idempotent_and_safe_against_a_racing_installer(name: str) -> None:
    template = SQLSERVER.statements[name]
    sql = SQLSERVER.sql(name, **_tables(template, IN_CATALOG))
    table = next(iter(_tables(template, IN_CATALOG)))
    literal = f"N'{GRAMMAR.qualified_name(IN_CATALOG)}'"
    flat = _normalised(sql)
    # Look, lock, look again, create; ignore "already exists" from a racing installer.
    assert flat.startswith(f"IF OBJECT_ID({literal}, N'U') IS NULL BEGIN EXEC sp_getapplock")
    assert f"@Resource = {literal}, @LockMode = 'Exclusive'" in flat
    assert flat.count(f"OBJECT_ID({literal}, N'U') IS NULL") == 2
    assert "IF ERROR_NUMBER() NOT IN (2714, 1913)" in flat
    assert flat.count("sp_releaseapplock") == 2
    assert "; THROW END END CATCH" in flat
    assert f"CREATE TABLE {GRAMMAR.qualified_name(IN_CATALOG)} (" in flat, table
    # The installer runs a script statement by statement, split at ";\n": one batch each.
    assert split_statements(sql) == (sql.strip(),)


def _columns_of(create: str) -> dict[str, str]:
    body = create[create.index("CREATE TABLE") :]
    body = body[body.index("(") + 1 :]
    columns = {}
    for line in body.splitlines():
        words = line.strip().rstrip(",").split()
        if len(words) >= 2 and words[0][0].isalpha() and words[0] not in ("PRIMARY", "CREATE"):
            columns[words[0].lower()] = words[1].lower()
        if line.strip().startswith(")"):
            break
    return columns


@pytest.mark.parametrize(
    ("name", "table"),
    [
        ("create_retry_table", "retry"),
        ("create_ledger_table", "ledger"),
        ("create_counters_table", "counters"),
        ("create_event_types_table", "event_types"),
    ],
)
def test_the_bridge_tables_have_the_same_columns_as_in_the_other_dialects(
    name: str, table: str
) -> None:
    ours = _columns_of(SQLSERVER.sql(name, **{table: QUEUE}))
    postgresql = _columns_of(PG_STATEMENTS[name].replace("{" + table + "}", "t"))
    assert set(ours) == set(postgresql)
    for column, kind in ours.items():
        assert not kind.startswith(("varchar", "text")), (column, kind)  # text is nvarchar


def test_ledger_and_event_type_keys_fit_a_nonclustered_index_key() -> None:
    # 1700 bytes for a nonclustered key; nvarchar takes two bytes a character.
    for name, table in (("create_ledger_table", "ledger"), ("create_event_types_table", "et")):
        sql = SQLSERVER.statements[name]
        assert "PRIMARY KEY NONCLUSTERED" in sql
        sizes = [int(size) for size in re.findall(r"nvarchar\((\d+)\) NOT NULL", sql)[:2]]
        assert 2 * sum(sizes) <= 1700, table


def test_create_schema_checks_then_creates_in_dynamic_sql_and_tolerates_a_race() -> None:
    sql = _normalised(SQLSERVER.create_schema_sql("nsb") or "")
    assert sql == (
        "IF NOT EXISTS (SELECT 1 FROM sys.schemas WHERE QUOTENAME(name) = N'[nsb]') BEGIN "
        "BEGIN TRY EXEC (N'CREATE SCHEMA ' + N'[nsb]') END TRY BEGIN CATCH "
        "IF ERROR_NUMBER() <> 2714 THROW END CATCH END"
    )
    assert SQLSERVER.create_schema_sql(None) is None


def test_no_statement_turns_nocount_on() -> None:
    for name, sql in render_all(QUEUE).items():
        assert "NOCOUNT ON" not in sql.upper(), name
    assert "SET NOCOUNT OFF" in SESSION_SETUP
    assert "SET XACT_ABORT OFF" in SESSION_SETUP


# --------------------------------------------------------------------------------------------
# Shapes: the data path, with the parameter order the callers bind
# --------------------------------------------------------------------------------------------

# Parameters each statement takes, in the order bridge/ binds them.
PARAMETERS: dict[str, int] = {
    "work_queue": 1,  # the part's index
    "work_retry": 2,  # the part's index, forwarder
    "receive_batch": 2,  # batch size, byte budget
    "send": 4,  # id, expires, headers, body
    "dead_letter": 3,  # id, headers, body
    "retry_store": 11,
    # forwarder, due by, '|waiting|databases|', give up by, limit
    "retry_claim_due": 6,
    "retry_waiting": 0,
    "retry_add_destination_database": 0,
    "destination_state_save": 7,
    "destination_states_read": 0,
    "forwarder_state_save": 7,
    "forwarder_states_read": 0,
    # daemon, host, pid, started, heartbeat at, heartbeat interval, state, stopped at,
    # configuration fingerprint, forwarders
    "daemon_save": 10,
    "daemons_read": 0,
    "daemons_read_without_identity": 0,
    "daemons_add_identity": 0,
    "daemon_delete": 2,  # daemon, heartbeat at
    "daemons_forget": 4,  # forgotten before, host, this daemon, missing before
    "schema_exists": 1,  # schema name
    "can_create_schemas": 0,
    "current_login": 0,
    "table_probe": 0,
    "receive_range": 4,  # first, last, limit, byte budget
    "subscribers_by_endpoint": 2,  # endpoint, queue address
    "create_pauses_table": 0,
    "pause_set": 4,  # forwarder, destination database, paused at, reason
    "pause_clear": 2,  # forwarder, destination database
    "pauses_read": 1,  # forwarder
    "queue_seq_bounds": 0,
    "queue_seq_boundaries": 1,  # rows per range
    "queue_page": 3,  # after, up to, limit
    "retry_seq_bounds": 1,  # forwarder
    "retry_seq_boundaries": 2,  # forwarder, rows per range
    "retry_page": 4,  # forwarder, after, up to, limit
    "ledger_destinations_since": 1,  # since
    "ledger_last_since": 1,  # since
    "ledger_boundaries_since": 2,  # since, rows per range
    # since, after (id, id, destination), up to (id, id, destination), limit
    "ledger_page_since": 8,
    "can_create_tables": 1,  # schema
    "retry_summary": 1,
    "ledger_record": 2,  # message id, destination
    "ledger_cleanup": 1,
    "counters_add": 4,
    "counters_read": 1,
    "event_type_seen": 4,
    "event_types_read": 1,
    "queue_count": 0,
    "queue_oldest_headers": 0,
    "list_tables": 0,
    "table_columns": 2,  # schema, table
    "table_indexes": 2,
    "savepoint": 0,
    "rollback_to_savepoint": 0,
    "login_powers": 0,
    "owned_objects": 0,
    "table_rights": 1,  # the table's qualified name
}


@pytest.mark.parametrize(("name", "count"), sorted(PARAMETERS.items()))
def test_each_statement_takes_the_parameters_its_callers_bind(name: str, count: int) -> None:
    assert lex(render_all(QUEUE)[name])[3] == count


@pytest.mark.parametrize(
    ("name", "per_row"), [("send", 4), ("ledger_record", 2), ("subscribers", 1)]
)
def test_multi_row_statements_take_their_row_parameters_per_row(name: str, per_row: int) -> None:
    for rows in (1, 2, 7):
        sql = SQLSERVER.sql(
            f"{name}_many", rows=rows, queue=QUEUE, ledger=QUEUE, subscriptions=QUEUE
        )
        assert lex(sql)[3] == per_row * rows


def test_receive_takes_a_batch_in_rowversion_order_skipping_locked_rows() -> None:
    sql = _normalised(SQLSERVER.sql("receive_batch", queue=QUEUE))
    assert sql.startswith("DECLARE @limit int = ?, @budget bigint = ?; WITH locked AS (")
    assert (
        "SELECT TOP (@limit) RowVersion, CAST(ISNULL(DATALENGTH(Body), 0) + "
        "ISNULL(DATALENGTH(Headers), 0) AS bigint) AS size FROM [dbo].[Samples.Receiver] "
        "WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion)"
    ) in sql
    # The bytes before a row decide; the first row always goes.
    assert (
        "SUM(size) OVER (ORDER BY RowVersion ROWS UNBOUNDED PRECEDING) - size AS before "
        "FROM locked) AS sized WHERE before < @budget)"
    ) in sql
    assert sql.endswith(
        "DELETE message OUTPUT deleted.Id, CASE WHEN deleted.Expires IS NULL THEN 0 "
        "WHEN deleted.Expires > GETUTCDATE() THEN 0 ELSE 1 END AS expired, deleted.Expires, "
        "deleted.Headers, deleted.Body, deleted.RowVersion AS seq, "
        "deleted.ReplyToAddress AS legacy_reply_to, CAST(ISNULL(DATALENGTH(deleted.Body), 0) + "
        "ISNULL(DATALENGTH(deleted.Headers), 0) AS bigint) AS claimed_size "
        "FROM [dbo].[Samples.Receiver] AS message WITH (UPDLOCK, READPAST, ROWLOCK) "
        "INNER JOIN taken ON taken.RowVersion = message.RowVersion"
    )


# The transport's receive (SqlServerConstants.ReceiveText in the transport's repository) reads
# its target `WITH (UPDLOCK, READPAST, ROWLOCK)`: rows other receivers hold are skipped, never
# waited for, which is how competing consumers work. Its peek (6.2+) reads `WITH (READPAST,
# READCOMMITTEDLOCK)`. Each statement of the bridge that reads a queue table, which endpoints
# and other daemons share, is held to those hints at every place it names the table.
_RECEIVE_HINTS = "UPDLOCK, READPAST, ROWLOCK"
QUEUE_TABLE_HINTS = {
    ("work_queue", "queue"): ["READPAST, READCOMMITTEDLOCK"],
    ("receive_batch", "queue"): [_RECEIVE_HINTS, _RECEIVE_HINTS],
    ("receive_range", "queue"): [_RECEIVE_HINTS, _RECEIVE_HINTS],
    ("retry_claim_due", "retry"): [_RECEIVE_HINTS, _RECEIVE_HINTS],
    # The same claims, their text as stored bytes (bridge.forwarding.claim, when the driver cannot
    # read it).
    ("receive_batch_raw", "queue"): [_RECEIVE_HINTS, _RECEIVE_HINTS],
    ("receive_range_raw", "queue"): [_RECEIVE_HINTS, _RECEIVE_HINTS],
    ("retry_claim_due_raw", "retry"): [_RECEIVE_HINTS, _RECEIVE_HINTS],
    ("error_queue_claim_many", "queue"): [_RECEIVE_HINTS],
    ("error_queue_delete_many", "queue"): [_RECEIVE_HINTS],
    # Reads for status, bounds and the error-queue tools skip what batches hold.
    ("queue_seq_bounds", "queue"): ["READPAST"],
    ("queue_count", "queue"): ["READPAST"],
    ("queue_oldest_headers", "queue"): ["READPAST"],
    ("queue_seq_boundaries", "queue"): ["READPAST"],
    ("queue_page", "queue"): ["READPAST"],
    ("error_queue_page", "queue"): ["READPAST"],
    ("error_queue_row", "queue"): ["READPAST"],
    ("error_queue_failed_queues", "queue"): ["READPAST"],
    ("error_queue_groups", "queue"): ["READPAST"],
    ("error_queue_groups_checked", "queue"): ["READPAST"],
    ("error_queue_read_many", "queue"): ["READPAST"],
    ("error_queue_count", "queue"): ["READPAST"],
    ("queue_find_id", "queue"): ["READPAST"],
    ("queue_find_headers", "queue"): ["READPAST"],
}
_REFERENCE = re.compile(
    r"\b(?:FROM|JOIN|DELETE)\s+\[dbo\]\.\[(queue|retry)\]"
    r"(?:\s+AS\s+\w+)?(?:\s+WITH\s+\(([^)]*)\))?"
)


def _table_references(name: str) -> dict[str, list[str]]:
    """Each place statement `name` reads or deletes from the queue or retry table: the
    hints there ('' for none), per table, in order."""
    template = SQLSERVER.statements[name]
    tables = {base: TableAddress(base, "dbo") for base in _tables(template, QUEUE)}
    many = 2 if name.endswith("_many") else None
    sql = _normalised(SQLSERVER.sql(name, rows=many, **tables))
    found: dict[str, list[str]] = {}
    for match in _REFERENCE.finditer(sql):
        found.setdefault(match.group(1), []).append(match.group(2) or "")
    return found


@pytest.mark.parametrize(("statement", "table"), sorted(QUEUE_TABLE_HINTS))
def test_queue_reads_take_the_transports_locking_hints_everywhere_they_name_the_table(
    statement: str, table: str
) -> None:
    assert _table_references(statement)[table] == QUEUE_TABLE_HINTS[(statement, table)]


def test_no_other_statement_reads_a_queue_table() -> None:
    # A new statement reading a shared queue must be added above, with its hints.
    readers = {
        name
        for name in SQLSERVER.statements
        # `x_row` is a fragment of `x_many`; create_schema names no table.
        if not (name.endswith("_row") and name[:-4] + "_many" in SQLSERVER.statements)
        and name != "create_schema"
        and "queue" in _table_references(name)
    }
    assert readers == {name for name, table in QUEUE_TABLE_HINTS if table == "queue"}


@pytest.mark.parametrize("name", ["receive_batch", "receive_range"])
def test_receiving_follows_the_transports_receive(name: str) -> None:
    sql = _normalised(SQLSERVER.sql(name, queue=QUEUE))
    # FIFO as the transport: the rows locked and the rows taken are in RowVersion order.
    assert "WITH (UPDLOCK, READPAST, ROWLOCK) " in sql
    assert sql.count("ORDER BY RowVersion") == 2
    # The transport's expiry flag, judged by the server's UTC clock.
    assert (
        "CASE WHEN deleted.Expires IS NULL THEN 0 WHEN deleted.Expires > GETUTCDATE() THEN 0 "
        "ELSE 1 END AS expired"
    ) in sql
    # The transport's output columns, in its order: Id, expired, Headers, Body.
    output = sql.partition(" OUTPUT ")[2]
    positions = [
        output.index(column)
        for column in ("deleted.Id,", "AS expired,", "deleted.Headers,", "deleted.Body,")
    ]
    assert positions == sorted(positions)


def test_the_error_queue_tools_page_in_rowversion_order() -> None:
    sql = _normalised(SQLSERVER.sql("error_queue_page", queue=QUEUE))
    assert sql.endswith("WHERE RowVersion > @after ORDER BY RowVersion")


def test_send_writes_recoverable_1_unicode_headers_and_leaves_the_legacy_columns_null() -> None:
    assert _normalised(SQLSERVER.sql("send", queue=QUEUE)) == (
        "INSERT INTO [dbo].[Samples.Receiver] (Id, Recoverable, Expires, Headers, Body) "
        "VALUES (?, 1, ?, CAST(? AS nvarchar(max)), CAST(? AS varbinary(max)))"
    )
    assert _normalised(SQLSERVER.sql("dead_letter", queue=QUEUE)) == (
        "INSERT INTO [dbo].[Samples.Receiver] (Id, Recoverable, Expires, Headers, Body) "
        "VALUES (?, 1, NULL, CAST(? AS nvarchar(max)), CAST(? AS varbinary(max)))"
    )
    assert SQLSERVER.sql("send_many", rows=2, queue=QUEUE) == (
        "INSERT INTO [dbo].[Samples.Receiver] (Id, Recoverable, Expires, Headers, Body) VALUES "
        "(?, 1, ?, CAST(? AS nvarchar(max)), CAST(? AS varbinary(max))), "
        "(?, 1, ?, CAST(? AS nvarchar(max)), CAST(? AS varbinary(max)))"
    )


def test_the_variants_without_recoverable_are_the_same_inserts_minus_that_column() -> None:
    for name in ("send", "send_many", "send_row", "dead_letter"):
        with_column = SQLSERVER.statements[name]
        assert WITHOUT_RECOVERABLE[name] == (
            with_column.replace("Recoverable, ", "").replace("?, 1, ", "?, ")
        ), name
        assert "Recoverable" not in WITHOUT_RECOVERABLE[name]


def test_the_ledger_inserts_only_new_keys_under_a_key_range_lock() -> None:
    single = _normalised(SQLSERVER.sql("ledger_record", ledger=QUEUE))
    assert single == (
        "INSERT INTO [dbo].[Samples.Receiver] (message_id, destination, forwarded_at) "
        "SELECT v.message_id, v.destination, SYSUTCDATETIME() "
        "FROM (VALUES (?, ?)) AS v (message_id, destination) WHERE NOT EXISTS ( "
        "SELECT 1 FROM [dbo].[Samples.Receiver] AS l WITH (UPDLOCK, HOLDLOCK) "
        "WHERE l.message_id = v.message_id AND l.destination = v.destination)"
    )
    many = _normalised(SQLSERVER.sql("ledger_record_many", rows=2, ledger=QUEUE))
    assert "OUTPUT inserted.message_id, inserted.destination SELECT" in many
    assert "FROM (VALUES (?, ?), (?, ?)) AS v (message_id, destination)" in many
    assert "WITH (UPDLOCK, HOLDLOCK)" in many
    # One statement each: its row count (1 or 0) is what the driver reports.
    assert ";" not in single


def test_retries_are_claimed_due_first_with_the_callers_parameter_order() -> None:
    sql = _normalised(SQLSERVER.sql("retry_claim_due", retry=QUEUE))
    assert sql.startswith(
        "DECLARE @forwarder nvarchar(200) = ?, @due_by datetime2 = ?, @waiting nvarchar(max) = ?,"
        " @give_up_by datetime2 = ?, @limit int = ?, @budget bigint = ?; WITH locked AS"
    )
    assert (
        "SELECT TOP (@limit) seq, next_attempt_at, cast(isnull(datalength(body), 0) + "
        "isnull(datalength(headers), 0) as bigint) AS size FROM [dbo].[Samples.Receiver] "
        "WITH (UPDLOCK, READPAST, ROWLOCK)"
    ) in sql
    assert "WHERE forwarder = @forwarder AND next_attempt_at <= @due_by" in sql
    # Messages for databases waiting out an outage stay, unless waited too long or expired.
    assert (
        "AND (destination_database IS NULL OR CHARINDEX(N'|' + destination_database + N'|', "
        "@waiting) = 0 OR first_failure_at <= @give_up_by OR expires <= SYSUTCDATETIME())"
    ) in sql
    assert "WHERE before < @budget) DELETE due OUTPUT deleted.id," in sql
    assert sql.endswith(
        "deleted.expires, deleted.headers, deleted.body, deleted.seq, deleted.attempts, "
        "deleted.first_failure_at, deleted.last_error, cast(isnull(datalength(deleted.body), 0) "
        "+ isnull(datalength(deleted.headers), 0) as bigint) AS claimed_size "
        "FROM [dbo].[Samples.Receiver] AS due WITH (UPDLOCK, READPAST, ROWLOCK) "
        "INNER JOIN taken ON taken.seq = due.seq"
    )


def test_savepoints_are_save_and_rollback_transaction_with_no_release() -> None:
    statements = SQLSERVER.statements
    assert statements["savepoint"] == "SAVE TRANSACTION sfbridge_local"
    assert statements["rollback_to_savepoint"] == "ROLLBACK TRANSACTION sfbridge_local"
    assert statements["release_savepoint"] == ""


def test_upserts_are_merges_holding_the_key_range() -> None:
    for name, table in (("counters_add", "counters"), ("event_type_seen", "event_types")):
        sql = _normalised(SQLSERVER.sql(name, **{table: QUEUE}))
        assert sql.startswith("MERGE [dbo].[Samples.Receiver] WITH (HOLDLOCK) AS")
        assert sql.endswith(";")  # T-SQL requires it after MERGE
    assert "UPDATE SET value = c.value + v.value" in SQLSERVER.statements["counters_add"]


# --------------------------------------------------------------------------------------------
# Value encoding
# --------------------------------------------------------------------------------------------

AN_ID = uuid.UUID("9c8b3f6e-2f6a-4a4e-9f3e-6c1d2b7a5e01")


def test_ids_bind_as_uuids_and_decode_from_uuids_or_text() -> None:
    assert SQLSERVER.encode_id(AN_ID) is AN_ID
    assert SQLSERVER.decode_id(AN_ID) is AN_ID
    assert SQLSERVER.decode_id("9C8B3F6E-2F6A-4A4E-9F3E-6C1D2B7A5E01") == AN_ID


def test_timestamps_are_naive_utc_and_text_from_old_freetds_decodes() -> None:
    moment = datetime(2024, 5, 1, 12, 0, 0, 500_000)
    assert SQLSERVER.encode_timestamp(moment) is moment
    assert SQLSERVER.decode_timestamp(moment) is moment
    assert SQLSERVER.decode_timestamp("2024-05-01 12:00:00.5000000") == moment
    assert SQLSERVER.encode_timestamp(None) is None
    for aware in (
        datetime(2024, 5, 1, tzinfo=UTC),
        datetime(2024, 5, 1, tzinfo=timezone(timedelta(hours=2))),
    ):
        with pytest.raises(ValueError, match="naive UTC"):
            SQLSERVER.encode_timestamp(aware)


# --------------------------------------------------------------------------------------------
# Recoverable: looked up once per table, looked up again when a send fails over it
# --------------------------------------------------------------------------------------------


class FakeConnection:
    """Answers the Recoverable lookup from `columns` (-1: no table) and records statements;
    `fail` lets the next executions raise."""

    def __init__(self, answer: int = 1, database: str = "receiver") -> None:
        self.database = database
        self.answer = answer
        self.lookups: list[tuple[str, tuple[Any, ...]]] = []
        self.executed: list[str] = []
        self.fail: list[DatabaseError] = []
        self.commits = 0

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self.lookups.append((sql, tuple(params)))
        return [(self.answer,)]

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        self.executed.append(sql)
        if self.fail:
            raise self.fail.pop(0)
        return 1

    def commit(self) -> None:
        self.commits += 1


def _error(native: int, text: str) -> DatabaseError:
    error = DatabaseError("receiver", text)
    error.native_error = native
    return error


@pytest.fixture
def recoverable() -> QueueWriter:
    """A queue writer that has seen no table yet (a daemon shares one across its workers)."""
    assert isinstance(SQLSERVER.queue_shapes, RecoverableColumn)
    return QueueWriter()


def test_a_table_with_recoverable_gets_the_transports_send(recoverable: Any) -> None:
    connection = FakeConnection(answer=1)
    sql = recoverable.sql(connection, SQLSERVER, "send", IN_CATALOG)  # type: ignore[arg-type]
    assert sql == SQLSERVER.sql("send", queue=IN_CATALOG)
    (lookup, params) = connection.lookups[0]
    assert "FROM [receiver].sys.columns" in lookup
    assert params == ("[receiver].[nsb].[Samples.Receiver]",) * 2


def test_a_table_without_recoverable_gets_inserts_without_it(recoverable: Any) -> None:
    connection = FakeConnection(answer=0)
    for name in ("send", "dead_letter"):
        assert "Recoverable" not in recoverable.sql(connection, SQLSERVER, name, QUEUE)  # type: ignore[arg-type]
    many = recoverable.sql(connection, SQLSERVER, "send_many", QUEUE, rows=2)  # type: ignore[arg-type]
    assert many.endswith("(?, ?, CAST(? AS nvarchar(max)), CAST(? AS varbinary(max)))")
    assert "Recoverable" not in many


def test_the_lookup_runs_once_per_table_and_database(recoverable: Any) -> None:
    connection = FakeConnection(answer=1)
    for _ in range(5):
        recoverable.sql(connection, SQLSERVER, "send", QUEUE)  # type: ignore[arg-type]
    recoverable.sql(connection, SQLSERVER, "send", IN_CATALOG)  # type: ignore[arg-type]
    recoverable.sql(FakeConnection(database="other"), SQLSERVER, "send", QUEUE)  # type: ignore[arg-type]
    assert len(connection.lookups) == 2


def test_a_missing_table_is_not_remembered(recoverable: Any) -> None:
    connection = FakeConnection(answer=-1)
    first = recoverable.sql(connection, SQLSERVER, "send", QUEUE)
    assert first == SQLSERVER.sql("send", queue=QUEUE)
    connection.answer = 0
    assert "Recoverable" not in recoverable.sql(connection, SQLSERVER, "send", QUEUE)  # type: ignore[arg-type]
    assert len(connection.lookups) == 2


@pytest.mark.parametrize(
    ("native", "text"),
    [
        (207, "Invalid column name 'Recoverable'. (SQLSTATE 42S22, error 207)"),
        (
            515,
            "Cannot insert the value NULL into column 'Recoverable', table 'x'; column does "
            "not allow nulls. INSERT fails. (SQLSTATE 23000, error 515)",
        ),
    ],
)
def test_a_send_failing_over_recoverable_looks_again_and_retries_once(
    recoverable: Any, native: int, text: str
) -> None:
    connection = FakeConnection(answer=1 if native == 207 else 0)
    recoverable.sql(connection, SQLSERVER, "send", QUEUE)  # type: ignore[arg-type]
    connection.answer = 0 if native == 207 else 1  # the column was dropped / added
    connection.fail = [_error(native, text)]
    assert recoverable.write(connection, SQLSERVER, "send", QUEUE, (1, 2, 3, 4)) == 1  # type: ignore[arg-type]
    assert len(connection.executed) == 2
    assert ("Recoverable" in connection.executed[1]) == (native == 515)
    assert len(connection.lookups) == 2


@pytest.mark.parametrize(
    "error",
    [
        _error(207, "Invalid column name 'Expires'. (SQLSTATE 42S22, error 207)"),
        _error(8152, "String or binary data would be truncated: Recoverable (error 8152)"),
        TableNotFound("receiver", "Invalid object name 'x'. (SQLSTATE 42S02, error 208)"),
    ],
    ids=["another-column", "another-error", "missing-table"],
)
def test_other_failures_are_not_retried(recoverable: Any, error: DatabaseError) -> None:
    connection = FakeConnection(answer=1)
    connection.fail = [error]
    with pytest.raises(type(error)):
        recoverable.write(connection, SQLSERVER, "send", QUEUE, (1, 2, 3, 4))  # type: ignore[arg-type]
    assert len(connection.executed) == 1


def test_a_second_failure_after_looking_again_is_raised(recoverable: Any) -> None:
    connection = FakeConnection(answer=1)
    stale = _error(207, "Invalid column name 'Recoverable'. (error 207)")
    connection.fail = [stale, stale]
    with pytest.raises(DatabaseError):
        recoverable.write(connection, SQLSERVER, "send", QUEUE, (1, 2, 3, 4))  # type: ignore[arg-type]
    assert len(connection.executed) == 2


def test_the_other_dialects_write_with_their_own_statements() -> None:
    writer = QueueWriter()
    for name in ("postgresql", "sqlite"):
        dialect = dialect_for(name)
        assert dialect.queue_shapes is None
        connection = FakeConnection()
        assert writer.sql(connection, dialect, "send", TableAddress("q")) == dialect.sql(  # type: ignore[arg-type]
            "send", queue=TableAddress("q")
        )
        assert connection.lookups == []


# --------------------------------------------------------------------------------------------
# check: what the transport warns about
# --------------------------------------------------------------------------------------------

GOOD_INDEXES = [
    "nonclustered (rowversion)",
    "nonclustered (expires) where ([expires] is not null)",
]
GOOD_COLUMNS = {"headers": "nvarchar", "rowversion": "bigint"}


class PermissionsConnection(FakeConnection):
    def __init__(self, granted: tuple[Any, ...] = (1, 1, 1)) -> None:
        super().__init__()
        self.granted = granted

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self.lookups.append((sql, tuple(params)))
        return [self.granted]


def test_a_queue_table_as_the_transport_creates_it_has_no_problems() -> None:
    connection = PermissionsConnection()
    assert inspect_queue_table(connection, IN_CATALOG, GOOD_COLUMNS, GOOD_INDEXES) == []  # type: ignore[arg-type]
    sql, params = connection.lookups[0]
    assert "HAS_PERMS_BY_NAME" in sql
    assert params == ("[receiver].[nsb].[Samples.Receiver]",) * 3
    assert connection.commits == 1


def test_a_clustered_rowversion_index_is_reported() -> None:
    indexes = ["clustered (rowversion)", GOOD_INDEXES[1]]
    (problem,) = inspect_queue_table(PermissionsConnection(), QUEUE, GOOD_COLUMNS, indexes)  # type: ignore[arg-type]
    assert "CLUSTERED" in problem and "PAGELATCH_EX" in problem


def test_a_missing_expires_index_is_reported_with_the_ddl_to_fix_it() -> None:
    (problem,) = inspect_queue_table(PermissionsConnection(), QUEUE, GOOD_COLUMNS, GOOD_INDEXES[:1])  # type: ignore[arg-type]
    assert "no index on Expires" in problem
    assert (
        "CREATE NONCLUSTERED INDEX [Index_Expires] ON [dbo].[Samples.Receiver] (Expires) "
        "INCLUDE (Id, RowVersion) WHERE Expires IS NOT NULL"
    ) in problem


def test_varchar_headers_are_reported() -> None:
    columns = {**GOOD_COLUMNS, "headers": "varchar"}
    (problem,) = inspect_queue_table(PermissionsConnection(), QUEUE, columns, GOOD_INDEXES)  # type: ignore[arg-type]
    assert "Headers column is varchar" in problem
    assert "ALTER COLUMN Headers nvarchar(max) NOT NULL" in problem


@pytest.mark.parametrize(
    ("granted", "missing"),
    [((0, 1, 1), "SELECT"), ((1, 1, 0), "DELETE"), ((None, 0, 1), "SELECT, INSERT")],
)
def test_missing_permissions_are_reported(granted: tuple[Any, ...], missing: str) -> None:
    connection = PermissionsConnection(granted)
    (problem,) = inspect_queue_table(connection, QUEUE, GOOD_COLUMNS, GOOD_INDEXES)  # type: ignore[arg-type]
    assert f"lacks {missing} permission" in problem
    assert f"GRANT {missing} ON [dbo].[Samples.Receiver]" in problem


def test_the_generic_index_check_finds_the_rowversion_index_in_these_definitions() -> None:
    # bridge/check.py looks for "(<column>" in each definition.
    assert SQLSERVER.queue_indexed_columns == ("rowversion",)
    assert any("(rowversion" in d for d in GOOD_INDEXES)
    assert "recoverable" not in SQLSERVER.queue_columns  # optional since transport 7.0
    assert _columns_of(SQLSERVER.sql("create_queue", queue=QUEUE)).keys() == (
        SQLSERVER.queue_columns | {"recoverable"}
    )


# --------------------------------------------------------------------------------------------
# Catalogs: a destination in another catalog of the forwarding database's server
# --------------------------------------------------------------------------------------------

SENDER = DatabaseConfig("sender", "sqlserver", connection="Driver={FreeTDS};Database=sender")
REMOTE = DatabaseConfig("central", "sqlserver", connection="Driver={FreeTDS};Server=other")
POSTGRES = DatabaseConfig("pg", "postgresql", connection="Driver={PostgreSQL Unicode}")
DATABASES = {"sender": SENDER, "central": REMOTE, "pg": POSTGRES}


def test_a_destination_in_another_catalog_routed_to_the_forwarding_database_stays_local() -> None:
    routes = [RouteConfig("Samples.*", "sender", catalogs=("receiver",))]
    destination = route_destination("Samples.Receiver@[dbo]@[receiver]", SENDER, routes, DATABASES)
    assert destination.database == "sender"  # delivered in the source transaction, no ledger
    assert destination.address == TableAddress("Samples.Receiver", "dbo", "receiver")
    assert destination.canonical == "Samples.Receiver@[dbo]@[receiver]"
    sql = SQLSERVER.sql("send_many", rows=1, queue=destination.address)
    assert sql.startswith("INSERT INTO [receiver].[dbo].[Samples.Receiver] (")


def test_the_catalog_travels_between_sqlserver_databases_but_not_to_other_dialects() -> None:
    routes = [RouteConfig("Samples.*", "central", schema="nsb", catalogs=("receiver",))]
    remote = route_destination("Samples.Receiver@[dbo]@[receiver]", SENDER, routes, DATABASES)
    assert remote.address == TableAddress("Samples.Receiver", "nsb", "receiver")
    routes = [RouteConfig("Samples.*", "pg")]
    to_pg = route_destination("Samples.Receiver@[dbo]@[receiver]", SENDER, routes, DATABASES)
    assert to_pg.address == TableAddress("Samples.Receiver", "public")


def _failed_queue(queue: str, **database: str) -> str:
    from bridge.config.model import BridgeConfig, ForwarderConfig
    from bridge.storage.tables import forwarder_tables

    sender = DatabaseConfig("sender", "sqlserver", **database)  # type: ignore[arg-type]
    forwarder = ForwarderConfig("sender", "sender", queue)
    config = BridgeConfig(databases={"sender": sender}, forwarders=(forwarder,))
    return forwarder_tables(config, forwarder).failed_queue


def test_failed_messages_name_their_queue_with_schema_and_catalog_as_nservicebus_does() -> None:
    by_connection = {"connection": "Driver={FreeTDS};Server=sql1;Database=SenderDb"}
    assert _failed_queue("Samples.Sender.Forward", **by_connection) == (
        "Samples.Sender.Forward@[dbo]@[SenderDb]"
    )
    by_key = {"connection": "DSN=nsb", "catalog": "Sender]Db", "schema": "nsb"}
    assert _failed_queue("Forward", **by_key) == "Forward@[nsb]@[Sender]]Db]"
    # A queue in another catalog of the server is named with that catalog.
    assert _failed_queue("Forward@[dbo]@[Other]", **by_connection) == "Forward@[dbo]@[Other]"


# --------------------------------------------------------------------------------------------
# check: the findings as `sfbridge check` prints them
# --------------------------------------------------------------------------------------------


class CatalogConnection(FakeConnection):
    """Answers check's catalog queries for one table."""

    def __init__(
        self,
        columns: dict[str, str],
        indexes: list[str],
        granted: tuple[Any, ...] | DatabaseError = (1, 1, 1),
    ) -> None:
        super().__init__()
        self.columns = columns
        self.indexes = indexes
        self.granted = granted
        self.rollbacks = 0

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self.lookups.append((sql, tuple(params)))
        if "sys.indexes AS i" in sql:
            return [(f"index{n}", d) for n, d in enumerate(self.indexes)]
        if "sys.columns AS c" in sql:
            return list(self.columns.items())
        if isinstance(self.granted, DatabaseError):
            raise self.granted
        return [self.granted]

    def rollback(self) -> None:
        self.rollbacks += 1


TRANSPORT_COLUMNS = {
    "id": "uniqueidentifier",
    "correlationid": "varchar",
    "replytoaddress": "varchar",
    "recoverable": "bit",
    "expires": "datetime",
    "headers": "nvarchar",
    "body": "varbinary",
    "rowversion": "bigint",
}


def _findings(connection: CatalogConnection) -> list[str]:
    from bridge.commands.check_tables import check_queue
    from bridge.config.model import BridgeConfig

    config = BridgeConfig(databases={}, forwarders=(), routes=())
    findings = check_queue(config, connection, SQLSERVER, IN_CATALOG, "queue")  # type: ignore[arg-type]
    return [str(f) for f in findings]


def test_check_passes_a_queue_table_as_the_transport_creates_it() -> None:
    connection = CatalogConnection(TRANSPORT_COLUMNS, GOOD_INDEXES)
    assert _findings(connection) == [
        "ok       queue: Samples.Receiver@[nsb]@[receiver] has the NServiceBus queue shape"
    ]
    # The catalog views of the table's own catalog, with (schema, table) parameters.
    assert connection.lookups[0][1] == ("nsb", "Samples.Receiver")
    assert "FROM [receiver].sys.columns AS c" in connection.lookups[0][0]


def test_check_accepts_a_queue_table_without_recoverable() -> None:
    columns = {k: v for k, v in TRANSPORT_COLUMNS.items() if k != "recoverable"}
    assert _findings(CatalogConnection(columns, GOOD_INDEXES))[0].startswith("ok ")


def test_check_reports_each_thing_the_transport_warns_about() -> None:
    columns = {**TRANSPORT_COLUMNS, "headers": "varchar"}
    connection = CatalogConnection(columns, ["clustered (rowversion)"], (1, 0, 1))
    findings = _findings(connection)
    assert len(findings) == 4
    assert all(
        f.startswith("PROBLEM  queue: Samples.Receiver@[nsb]@[receiver]: ") for f in findings
    )
    assert "CLUSTERED" in findings[0]
    assert "no index on Expires" in findings[1]
    assert "Headers column is varchar" in findings[2]
    assert "lacks INSERT permission" in findings[3]


def test_check_reports_a_table_it_cannot_inspect_instead_of_failing() -> None:
    denied = DatabaseError("receiver", "VIEW DEFINITION permission denied (error 300)")
    connection = CatalogConnection(TRANSPORT_COLUMNS, GOOD_INDEXES, denied)
    assert _findings(connection) == [
        "PROBLEM  queue: Samples.Receiver@[nsb]@[receiver]: could not be inspected further: "
        "VIEW DEFINITION permission denied (error 300)"
    ]
    assert connection.rollbacks == 1
