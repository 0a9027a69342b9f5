"""Every T-SQL statement of the SQL Server dialect, run by a real SQL Server.

The unit tests hold each statement to the transport's shape and parse it with a T-SQL grammar;
this runs each one on a server, through the bridge's own ODBC connection (its session setup,
its parameter binding), once with two-part names and once with three-part names (the catalog
named, as for a queue in another catalog of the server), and checks what it returns. It runs
when SFBRIDGE_TEST_SQLSERVER holds an ODBC connection string for a login that may create
databases:

    SFBRIDGE_TEST_SQLSERVER='Driver={FreeTDS};Server=HOST;Port=1433;Uid=sa;Pwd=...;' \\
        ./dev.sh test tests/integration/dialects/test_sqlserver_statements.py

`test_every_statement_has_a_run_here` runs always, so a statement added to the dialect
without a run here fails the suite even where no server is.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from support import NO_SQLSERVER, SqlServerTestServer

from bridge.addressing import TableAddress
from bridge.config.model import DatabaseConfig
from bridge.dialects.sqlserver import (
    DIALECT,
    PERMISSIONS_QUERY,
    WITHOUT_RECOVERABLE,
    RecoverableColumn,
)
from bridge.drivers import Connection
from bridge.storage.tables import split_statements

pytestmark = pytest.mark.integration

NOW = datetime(2026, 1, 2, 3, 4, 5, 678901)  # naive UTC, as the bridge binds times
HEADERS = '{"NServiceBus.MessageId":"m-1","Zürich":"日本 🚀"}'
# Every table a statement names, by its placeholder; `table` is what `table_probe` probes.
TABLE_NAMES = {
    "queue": "Samples.Receiver",
    "retry": "sfbridge_retry",
    "ledger": "sfbridge_ledger",
    "counters": "sfbridge_counters",
    "event_types": "sfbridge_event_types",
    "destination_states": "sfbridge_destination_states",
    "pauses": "sfbridge_pauses",
    "audit": "sfbridge_audit",
    "archive": "sfbridge_error_archive",
    "subscriptions": "SubscriptionRouting",
    "table": "Samples.Receiver",
}
SCHEMA = "sfbridge_test"
# NServiceBus's native subscription table, as its installer creates it.
CREATE_SUBSCRIPTIONS = """
    CREATE TABLE {0} (
        QueueAddress nvarchar(200) NOT NULL,
        Endpoint nvarchar(200) NOT NULL,
        Topic nvarchar(200) NOT NULL,
        PRIMARY KEY CLUSTERED (Endpoint, Topic)
    )"""


@dataclass(frozen=True)
class Run:
    """How one statement is run: its parameters, its rows (`*_many`), whether it returns
    rows, and what to check of the result (rows, or the row count)."""

    params: tuple[Any, ...] = ()
    rows: int | None = None
    query: bool = False
    check: Callable[[Any], bool] = lambda result: True


def _four_in_groups(rows: Any) -> bool:
    return sum(int(row[4]) for row in rows) == 4 and all(row[0] for row in rows)


def _id() -> uuid.UUID:
    return uuid.uuid4()


def _runs() -> list[tuple[str, Run]]:
    """Every statement, in an order in which each finds what it needs."""
    later = NOW + timedelta(hours=1)
    send = (_id(), None, HEADERS, b"body")
    retry_row = (_id(), "sender", "Samples.Receiver@[dbo]", "receiver", NOW, HEADERS, b"\x00")
    return [
        ("create_queue", Run()),
        # A fresh database takes writes: no reason why not; the server's name comes first.
        ("server_role", Run(query=True, check=lambda rows: rows[0][0] and rows[0][1] == "")),
        ("create_retry_table", Run()),
        ("create_ledger_table", Run()),
        ("create_counters_table", Run()),
        ("create_event_types_table", Run()),
        ("create_destination_states_table", Run()),
        ("create_forwarder_states_table", Run()),
        ("create_daemons_table", Run()),
        ("create_pauses_table", Run()),
        ("create_audit_table", Run()),
        ("create_archive_table", Run()),
        ("create_retry_lookup_index", Run()),
        ("read_only_reason", Run(query=True, check=lambda rows: rows[0][0] is None)),
        # The error archive: one message in, read by page and by MessageId, taken out again.
        ("archive_store", Run((str(_id()), "m-1", "error", NOW, later, HEADERS, b"b"))),
        ("archive_page", Run((0, 10), query=True, check=_one_row)),
        ("archive_find", Run(("not-an-id", "m-1"), query=True, check=_one_row)),
        ("archive_take_many", Run((1, 999), rows=2, query=True, check=_one_row)),
        ("archive_expire", Run((later,), check=lambda count: count == 0)),
        ("retry_add_destination_database", Run()),
        ("send", Run(send, check=lambda count: count == 1)),
        ("queue_find_id", Run((str(send[0]),), query=True, check=_one_row)),
        (
            "queue_find_headers",
            Run(("m-1", '"NServiceBus.MessageId":"m-1"'), query=True, check=_one_row),
        ),
        ("send_many", Run((_id(), None, HEADERS, b"1", _id(), later, HEADERS, None), rows=2)),
        ("dead_letter", Run((_id(), HEADERS, b""), check=lambda count: count == 1)),
        ("work_queue", Run((0,), query=True, check=lambda rows: list(rows[0][:2]) == [0, 1])),
        ("queue_count", Run(query=True, check=lambda rows: rows[0][0] == 4)),
        ("queue_seq_bounds", Run(query=True, check=lambda rows: rows[0][2] == 4)),
        ("queue_oldest_headers", Run(query=True, check=lambda rows: rows[0][0] == HEADERS)),
        # Spark's range reads: every 2nd row's key, then a page of one range.
        ("queue_seq_boundaries", Run((2,), query=True, check=_rows(2))),
        ("queue_page", Run((0, 10_000, 3), query=True, check=_rows(3))),
        ("error_queue_page", Run((0, 2), query=True, check=lambda rows: len(rows) == 2)),
        ("error_queue_row", Run((1,), query=True, check=lambda rows: len(rows) == 1)),
        # No row has a FailedQ: one group, NULL, of all four.
        (
            "error_queue_failed_queues",
            Run(query=True, check=lambda rows: [tuple(r) for r in rows] == [(None, 4)]),
        ),
        ("error_queue_count", Run(query=True, check=lambda rows: rows[0][0] == 4)),
        # Grouped by two headers none of the rows has: one readable group of all four.
        *(
            (name, Run(("Missing.One", "Missing.Two"), query=True, check=_four_in_groups))
            for name in ("error_queue_groups", "error_queue_groups_checked")
        ),
        ("error_queue_read_many", Run((1, 2), rows=2, query=True, check=_rows(2))),
        # Takes RowVersion 1, the first send; then the rest go through the receives.
        ("error_queue_claim_many", Run((1, 999), rows=2, query=True, check=_one_row)),
        ("receive_batch", Run((1, 10_000_000), query=True, check=_one_row)),
        ("receive_range", Run((1, 1000, 10, 10_000_000), query=True, check=_rows(2))),
        # The claims again with their text as stored: UTF-16LE bytes.
        ("send", Run((_id(), None, HEADERS, b"raw"), check=lambda count: count == 1)),
        ("receive_batch_raw", Run((1, 10_000_000), query=True, check=_raw_headers)),
        ("send", Run((_id(), None, HEADERS, b"raw"), check=lambda count: count == 1)),
        ("receive_range_raw", Run((1, 1000, 10, 10_000_000), query=True, check=_raw_headers)),
        ("error_queue_delete_many", Run((1, 2), rows=2, check=lambda count: count == 0)),
        ("retry_store", Run((*retry_row, 1, NOW, NOW, "error text"))),
        (
            "retry_find",
            Run(
                (str(retry_row[0]), "m-1", '"NServiceBus.MessageId":"m-1"'),
                query=True,
                check=_one_row,
            ),
        ),
        ("retry_summary", Run(("sender",), query=True, check=_one_row)),
        ("work_retry", Run((1, "sender"), query=True, check=lambda rows: rows[0][2] == NOW)),
        ("retry_seq_bounds", Run(("sender",), query=True, check=lambda rows: rows[0][2] == 1)),
        ("retry_seq_boundaries", Run(("sender", 1), query=True, check=_one_row)),
        ("retry_page", Run(("sender", 0, 10_000, 10), query=True, check=_one_row)),
        ("retry_waiting", Run(query=True, check=lambda rows: rows[0][1] == 1)),
        ("retry_list_page", Run((0, 10), query=True, check=_one_row)),
        ("retry_due_now_many", Run((1, 999), rows=2, check=lambda count: count == 1)),
        (
            "retry_claim_due",
            Run(("sender", later, "|other|", NOW, 10, 10_000_000), query=True, check=_one_row),
        ),
        ("retry_store", Run((_id(), *retry_row[1:], 1, NOW, NOW, "error text"))),
        (
            "retry_claim_due_raw",
            Run(("sender", later, "", NOW, 10, 10_000_000), query=True, check=_raw_headers),
        ),
        ("retry_store", Run((_id(), *retry_row[1:], 1, NOW, later, "error text"))),
        ("retry_take_many", Run((3, 999), rows=2, query=True, check=_one_row)),
        ("ledger_record", Run(("m-1", "Samples.Receiver@[dbo]"), check=lambda n: n == 1)),
        ("ledger_find", Run(("m-1",), query=True, check=_one_row)),
        (
            "ledger_record_many",
            Run(("m-1", "Samples.Receiver@[dbo]", "M-1", "x"), rows=2, query=True, check=_one_row),
        ),
        (
            "ledger_destinations_since",
            Run((datetime(2000, 1, 1),), query=True, check=_rows(2)),
        ),
        ("ledger_last_since", Run((datetime(2000, 1, 1),), query=True, check=_one_row)),
        ("ledger_boundaries_since", Run((datetime(2000, 1, 1), 1), query=True, check=_rows(2))),
        (
            "ledger_page_since",
            # From before the first key ('' sorts first) to after the last: both rows.
            Run((datetime(2000, 1, 1), "", "", "", "~", "~", "~", 10), query=True, check=_rows(2)),
        ),
        ("ledger_cleanup", Run((datetime(2000, 1, 1),), check=lambda count: count == 0)),
        ("counters_add", Run(("sender", "delivered", 0, 5))),
        ("counters_add_many", Run(("sender", "delivered", 0, 1, "sender", "expired", 1, 2), 2)),
        ("counters_read", Run(("sender",), query=True, check=_counters)),
        (
            "subscribers_many",
            Run(("Shared.Event", "System.Object"), rows=2, query=True, check=_subscribers),
        ),
        (
            "subscribers_by_endpoint",
            Run(("Samples.Billing", "nobody"), query=True, check=lambda rows: rows[0][0] == 1),
        ),
        ("event_type_seen", Run(("sender", "Shared.Event, Shared", NOW, '{"subscribers":[]}'))),
        ("event_type_seen", Run(("sender", "Shared.Event, Shared", later, "{}"))),
        ("event_types_read", Run(("sender",), query=True, check=_one_row)),
        (
            "destination_state_save",
            Run(("receiver", "down", NOW, "refused", later, NOW, "host:1")),
        ),
        ("destination_state_save", Run(("receiver", "up", later, None, None, later, "host:2"))),
        (
            "destination_states_read",
            Run(query=True, check=lambda rows: [r[1] for r in rows] == ["up"]),
        ),
        ("forwarder_state_save", Run(("sender", "host:1", "failing", NOW, 3, "locked", NOW))),
        ("forwarder_state_save", Run(("sender", "host:1", "ok", later, 0, None, later))),
        (
            "forwarder_states_read",
            Run(query=True, check=lambda rows: [(r[2], r[4]) for r in rows] == [("ok", 0)]),
        ),
        ("daemons_add_identity", Run()),  # the columns are there: nothing to do
        ("daemon_save", Run(("host:1", "host", 1, NOW, NOW, 5.0, "running", None, "ab", "[]"))),
        ("daemon_save", Run(("host:1", "host", 1, NOW, later, 5.0, "stopped", later, "ab", "[]"))),
        ("daemon_save", Run(("host:2", "host", 2, later, later, 5.0, "running", None, None, None))),
        (
            "daemons_read",
            Run(query=True, check=lambda rows: [r[6] for r in rows] == ["stopped", "running"]),
        ),
        (
            "daemons_read_without_identity",
            Run(query=True, check=lambda rows: [r[8] for r in rows] == [None, None]),
        ),
        ("daemon_delete", Run(("host:1", NOW), check=lambda count: count == 0)),
        (
            "daemons_forget",
            Run((NOW, "host", "host:2", NOW), check=lambda count: count == 1),
        ),
        ("schema_exists", Run((SCHEMA,), query=True, check=lambda rows: rows[0][0] == 1)),
        ("schema_exists", Run(("no_such_schema",), query=True, check=lambda rows: rows[0][0] == 0)),
        ("can_create_schemas", Run(query=True, check=lambda rows: rows[0][0] in (0, 1))),
        ("current_login", Run(query=True, check=lambda rows: len(rows[0]) == 2)),
        # The test server's login is sysadmin; it owns the database it created.
        ("login_powers", Run(query=True, check=lambda rows: ("sysadmin", 1) in map(tuple, rows))),
        ("owned_objects", Run(query=True, check=lambda rows: all(len(r) == 3 for r in rows))),
        (
            "table_rights",
            Run(
                (f"[{SCHEMA}].[Samples.Receiver]",),
                query=True,
                check=lambda rows: {"INSERT", "DELETE"} <= {r[0] for r in rows},
            ),
        ),
        (
            "can_insert",
            Run((f"[{SCHEMA}].[Samples.Receiver]",), query=True, check=_may_insert),
        ),
        ("pause_set", Run(("sender", "", NOW, "upgrade"))),
        ("pause_set", Run(("sender", "", later, "still"))),
        ("pauses_read", Run(("sender",), query=True, check=_pause)),
        ("pause_clear", Run(("sender", ""), check=lambda count: count == 1)),
        ("audit_record", Run((NOW, "ops", "bridge-host", "retries fail", "(all)", 3))),
        (
            "audit_open",
            Run((NOW, "ops", "bridge-host", "errors replay", "(all)"), query=True, check=_one_row),
        ),
        ("audit_add", Run((5, 2), check=lambda count: count == 1)),
        ("audit_read", Run((5,), query=True, check=_one_row)),
        ("table_probe", Run(query=True, check=lambda rows: rows == [])),
        ("list_tables", Run(query=True, check=_lists_the_queue)),
        ("table_columns", Run((SCHEMA, "Samples.Receiver"), query=True, check=_queue_columns)),
        ("table_indexes", Run((SCHEMA, "Samples.Receiver"), query=True, check=_rows(2))),
        ("can_create_tables", Run((SCHEMA,), query=True, check=_one_row)),
        # One transaction: a read opens it, a send after the savepoint is undone.
        ("savepoint", Run(check=lambda count: count == 0)),
        ("rollback_to_savepoint", Run()),
    ]


def _raw_headers(rows: Any) -> bool:
    """One claimed row whose headers came as the UTF-16LE bytes SQL Server stores."""
    (row,) = rows
    return bytes(row[3]) == HEADERS.encode("utf-16-le")


def _rows(count: int) -> Callable[[Any], bool]:
    return lambda rows: len(rows) == count


_one_row = _rows(1)


def _counters(rows: Any) -> bool:
    return {counter: int(value) for counter, value in rows} == {"delivered": 6, "expired": 2}


def _subscribers(rows: Any) -> bool:
    return sorted(row[0] for row in rows) == ["Samples.Billing@[dbo]@[nsb]"]


def _pause(rows: Any) -> bool:
    (database, paused_at, reason), *rest = rows
    return not rest and database == "" and paused_at == NOW and reason == "still"


def _lists_the_queue(rows: Any) -> bool:
    return (SCHEMA, "Samples.Receiver") in {(schema, table) for schema, table in rows}


def _queue_columns(rows: Any) -> bool:
    return dict(rows) == {
        "id": "uniqueidentifier",
        "correlationid": "varchar",
        "replytoaddress": "varchar",
        "recoverable": "bit",
        "expires": "datetime",
        "headers": "nvarchar",
        "body": "varbinary",
        "rowversion": "bigint",
    }


def _may_insert(rows: Any) -> bool:
    return bool(rows[0][0] == 1 and rows[0][1] is None)  # the test's login owns the table


def _statements_run_here() -> set[str]:
    return {name for name, _ in _runs()} | {"create_schema"}


def test_every_statement_has_a_run_here() -> None:
    # `x_row` is a fragment of `x_many`, not a statement of its own.
    fragments = {
        name
        for name in DIALECT.statements
        if name.endswith("_row") and name.removesuffix("_row") + "_many" in DIALECT.statements
    }
    empty = {name for name, sql in DIALECT.statements.items() if not sql}
    assert _statements_run_here() == set(DIALECT.statements) - fragments - empty


# --------------------------------------------------------------------------------------------
# On a server
# --------------------------------------------------------------------------------------------


@pytest.fixture
def server(sqlserver_server: SqlServerTestServer | None) -> SqlServerTestServer:
    if sqlserver_server is None:
        pytest.skip(NO_SQLSERVER)
    return sqlserver_server


@pytest.fixture
def connection(server: SqlServerTestServer) -> Iterator[tuple[Connection, str]]:
    catalog = server.create_database()
    database = DatabaseConfig("live", "sqlserver", connection=server.connection_string(catalog))
    opened = DIALECT.connect(database)
    try:
        yield opened, catalog
    finally:
        opened.close()


@pytest.mark.parametrize("three_part", [False, True], ids=["two-part", "three-part"])
def test_every_statement_runs_on_a_server_and_returns_what_the_bridge_expects(
    connection: tuple[Connection, str], three_part: bool
) -> None:
    opened, catalog = connection
    tables = {
        key: TableAddress(name, SCHEMA, catalog if three_part else None)
        for key, name in TABLE_NAMES.items()
    }
    schema_sql = DIALECT.create_schema_sql(SCHEMA)
    assert schema_sql is not None
    for _ in range(2):  # idempotent
        opened.execute(schema_sql)
        opened.commit()
    subscriptions = DIALECT.grammar.qualified_name(tables["subscriptions"])
    opened.execute(CREATE_SUBSCRIPTIONS.format(subscriptions))
    opened.execute(
        f"INSERT INTO {subscriptions} (QueueAddress, Endpoint, Topic) VALUES (?, ?, ?)",
        ("Samples.Billing@[dbo]@[nsb]", "Samples.Billing", "Shared.Event"),
    )
    opened.commit()

    failures = []
    for name, run in _runs():
        try:
            result = _run(opened, name, run, tables)
            if not run.check(result):
                failures.append(f"{name}: unexpected result {result!r}")
        except Exception as error:  # every statement's failure is reported, not the first
            opened.rollback()
            failures.append(f"{name}: {error}")
    assert failures == []
    _run_queue_variants(opened, tables["queue"])


def _run(connection: Connection, name: str, run: Run, tables: dict[str, TableAddress]) -> Any:
    template = DIALECT.statements[name]
    needed = {key: address for key, address in tables.items() if "{" + key in template}
    if name in ("savepoint", "rollback_to_savepoint"):
        return _savepoint(connection, tables["queue"]) if name == "savepoint" else None
    sql = DIALECT.sql(name, rows=run.rows, **needed)
    if name.startswith("create_") or name == "retry_add_destination_database":
        for _ in range(2):  # idempotent
            for statement in split_statements(sql):
                connection.execute(statement)
            connection.commit()
        return None
    encoded = tuple(DIALECT.encode_id(p) if isinstance(p, uuid.UUID) else p for p in run.params)
    result = connection.query(sql, encoded) if run.query else connection.execute(sql, encoded)
    connection.commit()
    return result


def _savepoint(connection: Connection, queue: TableAddress) -> int:
    """A savepoint inside a transaction a read opened, a send after it, a rollback to it, a
    commit: the queue's count afterwards minus before (0 when the send was undone)."""
    count = DIALECT.sql("queue_count", queue=queue)
    before = connection.query(count)[0][0]
    connection.execute(DIALECT.statements["savepoint"])
    connection.execute(DIALECT.sql("send", queue=queue), (_id(), None, HEADERS, None))
    connection.execute(DIALECT.statements["rollback_to_savepoint"])
    connection.commit()
    return int(connection.query(count)[0][0]) - int(before)


def _run_queue_variants(connection: Connection, queue: TableAddress) -> None:
    """The Recoverable lookup, the permissions query and the writes without Recoverable."""
    shapes = RecoverableColumn()
    lookup, params = shapes.lookup(queue)
    assert shapes.variants(connection.query(lookup, params)) == {}
    qualified = DIALECT.grammar.qualified_name(queue)
    connection.execute(f"ALTER TABLE {qualified} DROP COLUMN Recoverable")
    connection.commit()
    variants = shapes.variants(connection.query(lookup, params))
    assert variants == WITHOUT_RECOVERABLE
    sends = {
        "send": (_id(), None, HEADERS, b"x"),
        "send_many": (_id(), None, HEADERS, b"y", _id(), NOW, HEADERS, None),
        "dead_letter": (_id(), HEADERS, b"z"),
    }
    for name, params in sends.items():
        rows = 2 if name == "send_many" else None
        sql = DIALECT.sql_with(WITHOUT_RECOVERABLE, name, rows, queue=queue)
        connection.execute(sql, params)
        connection.commit()
    assert connection.query(DIALECT.sql("queue_count", queue=queue))[0][0] == 4
    granted = connection.query(PERMISSIONS_QUERY, (qualified, qualified, qualified))
    connection.commit()
    assert tuple(granted[0]) == (1, 1, 1)
