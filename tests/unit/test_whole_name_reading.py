"""Specification of bridge.addressing.whole_name_reading: which addresses fall into the
dotted-name trap (an unquoted dot read as schema and table), in every grammar."""

from __future__ import annotations

import pytest

from bridge.addressing import TableAddress, whole_name_reading
from bridge.dialects import dialect_for


@pytest.mark.parametrize(
    ("text", "whole"),
    [
        ("Samples.Sender.Forward", TableAddress("Samples.Sender.Forward")),
        (" Samples.Receiver ", TableAddress("Samples.Receiver")),
        ('"Samples.Sender.Forward"', None),  # quoted: one table, as meant
        ('"Samples"."Sender.Forward"', None),  # quoted: schema and table, as meant
        ('"public"."Samples.Sender.Forward"', None),
        ("Receiver", None),  # no dot
        ('"unterminated', None),  # not an address: the config's validation says why
    ],
)
def test_postgresql_reads_an_unquoted_dot_as_schema_and_table(
    text: str, whole: TableAddress | None
) -> None:
    assert whole_name_reading(dialect_for("postgresql").grammar, text) == whole


@pytest.mark.parametrize("dialect", ["sqlserver", "sqlite"])
def test_grammars_where_a_dot_is_part_of_the_name_have_no_trap(dialect: str) -> None:
    assert whole_name_reading(dialect_for(dialect).grammar, "Samples.Sender.Forward") is None
