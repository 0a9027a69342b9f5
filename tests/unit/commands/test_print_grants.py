"""`install --print-grants` reads no database: per database, the statements for a dedicated
login, as valid SQL of the dialect (sqlfluff's postgres and tsql grammars), with identifiers
quoted (dotted NServiceBus names), and SQLite saying there is nothing to grant."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import pytest

from bridge.addressing import TableAddress
from bridge.dialects.postgresql import serial_sequences


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


@pytest.mark.parametrize(
    ("table", "sequence"),
    [
        ("Samples.Receiver", "Samples.Receiver_seq_seq"),
        ("x" * 70, "x" * 55 + "_seq_seq"),  # as PostgreSQL cuts it (63 bytes)
        ("é" * 40, "é" * 27 + "_seq_seq"),  # never half a character
    ],
)
def test_serial_sequences_are_named_as_postgresql_names_them(table: str, sequence: str) -> None:
    ddl = "CREATE TABLE t (\n    Id uuid NOT NULL,\n    Seq serial NOT NULL UNIQUE\n)"
    assert serial_sequences(TableAddress(table, "public"), ddl) == (
        TableAddress(sequence, "public"),
    )
