"""The psycopg driver's pure parts: ODBC-style connection strings read as libpq parameters, and
the dialects' `?` placeholders rewritten for psycopg without touching quoted text."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from bridge.drivers.psycopg import PsycopgConnection


@pytest.mark.integration
def test_uuids_read_in_binary_are_the_uuids_the_server_holds(new_pg_database: Any) -> None:
    # The driver loads uuid columns without uuid.UUID's constructor (a claim loads thousands):
    # each must still be the same value, equal, hashed, printed and versioned as one made by it.
    texts = [str(uuid.uuid4()), str(uuid.uuid1()), "00000000-0000-0000-0000-000000000000"]
    connection = PsycopgConnection("db", new_pg_database(), timeout=5)
    try:
        names, rows = connection.query_columns(
            "SELECT x::uuid AS id FROM unnest(?::text[]) AS x", (texts,)
        )
    finally:
        connection.close()
    assert names == ["id"]
    loaded = [row[0] for row in rows]
    expected = [uuid.UUID(text) for text in texts]
    assert all(type(value) is uuid.UUID for value in loaded)
    assert loaded == expected and {*loaded} == {*expected}
    assert [str(value) for value in loaded] == texts
    assert [value.version for value in loaded] == [value.version for value in expected]
    assert [value.bytes for value in loaded] == [value.bytes for value in expected]
