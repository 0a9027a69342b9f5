"""The statements a dialect renders and keeps (`Dialect._rendered`) must not grow with
every batch length a daemon ever sees.

A VALUES statement is rendered per (statement, number of rows, queue); batches come in every
length from 1 to `batch_size`, so without a bound a long-running daemon keeps about 8 MB of
SQL text per destination queue (and per ledger) for SQLite, SQL Server and `driver: odbc`
PostgreSQL destinations, never freed: memory no longer follows `batch_bytes`.
"""

from __future__ import annotations

import dataclasses

import pytest

from bridge.addressing import TableAddress
from bridge.dialects import dialect_for


@pytest.mark.parametrize("name", ["sqlite", "sqlserver", "postgresql"])
def test_rendering_every_batch_length_keeps_a_bounded_amount_of_sql(name: str) -> None:
    dialect = dataclasses.replace(dialect_for(name))  # a private, empty cache
    queue = dialect.grammar.resolve(TableAddress("Samples.Receiver"), None, None)
    for rows in range(1, 1001):
        dialect.rows_statements("send_many", [[1, 2, 3, 4]] * rows, arrays=False, queue=queue)
    kept = sum(len(text) for text in dialect._rendered.values())
    assert kept < 1_000_000, f"{kept:,} characters of SQL kept for one queue"
