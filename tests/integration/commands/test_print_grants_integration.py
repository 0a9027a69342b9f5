"""`install --print-grants` reads no database: per database, the statements for a dedicated
login, as valid SQL of the dialect (sqlfluff's postgres and tsql grammars), with identifiers
quoted (dotted NServiceBus names), and SQLite saying there is nothing to grant."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

from support import sfbridge, write_config

CONFIG = {
    "databases": {
        "sender": {
            "dialect": "postgresql",
            "connection": "Server=db1;Database=Sender Db;Uid=bridge;Pwd=x",
        },
        "receiver": {
            "dialect": "postgresql",
            "connection": "Server=db1;Database=receiver;Uid=bridge",
            "schema": "tenant",
        },
        "billing": {
            "dialect": "sqlserver",
            "connection": "Driver={FreeTDS};Server=sql1;Database=BillingDb;Uid=bridge",
        },
        "edge": {"dialect": "sqlite", "path": "/var/lib/sfbridge/edge.db"},
    },
    "forwarders": [
        {"name": "sender", "database": "sender", "queue": "Samples.Sender.Forward"},
        {"name": "edge", "database": "edge", "queue": "edge_forward"},
    ],
    "routes": [
        {"match": "Samples.Receiver", "database": "receiver"},
        {"match": "Samples.Billing", "database": "billing"},
        {"match": "Samples.*", "database": "receiver"},
    ],
}


def print_grants(tmp_path: Path, *args: str) -> str:
    path = write_config(tmp_path / "sfbridge.yaml", CONFIG)
    result = sfbridge("-c", str(path), "install", "--print-grants", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def section(script: str, name: str) -> str:
    match = re.search(rf"-- ===== database: {name} .*?\n(.*?)(?=\n-- =====|\Z)", script, re.S)
    assert match, name
    return match.group(1)


@cache
def _linter(dialect: str) -> Any:
    from sqlfluff.core import FluffConfig, Linter

    return Linter(config=FluffConfig(configs={"core": {"dialect": dialect}}))


def unparsable(sql: str, dialect: str) -> list[str]:
    parsed = _linter(dialect).parse_string(sql)
    problems = [violation.desc() for violation in parsed.violations]
    if parsed.tree is None or "unparsable" in parsed.tree.stringify():
        problems.append("unparsable section")
    return problems


def test_postgresql_grants_name_each_table_quoted_with_its_sequence(tmp_path: Path) -> None:
    script = print_grants(tmp_path)
    sender = section(script, "sender")
    assert 'CREATE ROLE "bridge" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS;' in sender
    assert 'GRANT CONNECT ON DATABASE "Sender Db" TO "bridge";' in sender
    # The destructive receive, the error queue, retry storage: DML; no CREATE anywhere.
    assert 'GRANT SELECT, INSERT, UPDATE, DELETE ON "Samples"."Sender.Forward" TO' in sender
    assert 'GRANT USAGE ON SEQUENCE "public"."error_seq_seq" TO "bridge";' in sender
    assert 'GRANT SELECT, INSERT, UPDATE, DELETE ON "public"."sfbridge_retry" TO' in sender
    assert "CREATE ON" not in script
    receiver = section(script, "receiver")
    assert "CREATE ROLE" not in receiver  # once per server
    assert 'GRANT SELECT, INSERT, DELETE ON "tenant"."sfbridge_ledger" TO "bridge";' in receiver
    assert 'GRANT INSERT ON "tenant"."Samples.Receiver" TO "bridge";' in receiver
    assert 'GRANT USAGE ON SEQUENCE "tenant"."Samples.Receiver_seq_seq" TO' in receiver
    # The glob: said, and the schema-wide form only as a comment.
    assert "routes[2] (match 'Samples.*'): its queues cannot be listed" in receiver
    assert '-- GRANT INSERT ON ALL TABLES IN SCHEMA "tenant" TO "bridge";' in receiver
    for name in ("sender", "receiver"):
        assert unparsable(section(script, name), "postgres") == [], section(script, name)


def test_sqlserver_grants_are_tsql_and_sqlite_has_nothing_to_grant(tmp_path: Path) -> None:
    script = print_grants(tmp_path, "--login", "bridge]x")
    billing = section(script, "billing")
    assert "CREATE LOGIN [bridge]]x] WITH PASSWORD" in billing
    assert "USE [BillingDb];" in billing and "CREATE USER [bridge]]x] FOR LOGIN" in billing
    assert "GRANT INSERT ON [dbo].[Samples.Billing] TO [bridge]]x];" in billing
    assert "GRANT SELECT, INSERT, DELETE ON [dbo].[sfbridge_ledger] TO [bridge]]x];" in billing
    # sqlfluff's lexer does not know `]]` inside a bracketed name.
    assert unparsable(billing.replace("]]", ""), "tsql") == [], billing
    edge = section(script, "edge")
    assert "nothing to grant" in edge and not [
        line for line in edge.splitlines() if line and not line.startswith("--")
    ]


def test_login_creates_tables_grants_create_on_the_schemas_instead_of_table_rights(
    tmp_path: Path,
) -> None:
    script = print_grants(tmp_path, "--login-creates-tables")
    receiver = section(script, "receiver")
    assert 'CREATE SCHEMA IF NOT EXISTS "tenant";' in receiver
    assert 'GRANT CREATE ON SCHEMA "tenant" TO "bridge";' in receiver
    assert "sfbridge_ledger" not in receiver
    assert 'GRANT INSERT ON "tenant"."Samples.Receiver" TO "bridge";' in receiver
    assert unparsable(receiver, "postgres") == [], receiver


def test_the_queues_and_schemas_a_route_allows_are_granted_and_comments_stay_comments(
    tmp_path: Path,
) -> None:
    config = {
        **CONFIG,
        "routes": [
            {"match": "Samples.Receiver", "database": "receiver", "schemas": ["billing"]},
            # A line break in a route's match must not end the comment that names it.
            {"match": "Odd\nDROP TABLE x;", "database": "receiver"},
        ],
    }
    path = write_config(tmp_path / "sfbridge.yaml", config)
    result = sfbridge("-c", str(path), "install", "--print-grants")
    assert result.returncode == 0, result.stderr
    receiver = section(result.stdout, "receiver")
    assert 'GRANT INSERT ON "tenant"."Samples.Receiver" TO "bridge";' in receiver
    assert 'GRANT INSERT ON "billing"."Samples.Receiver" TO "bridge";' in receiver
    assert "-- destination queue of route 'Odd\\x0aDROP TABLE x;'" in receiver
    # The name stays inside its quoted identifier: the script still parses, nothing is dropped.
    assert unparsable(receiver, "postgres") == []
