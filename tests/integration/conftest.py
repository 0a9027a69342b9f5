"""Fixtures of the integration tests that need `support`: a SQL Server, when one is given."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from support import SQLSERVER_VARIABLE, SqlServerTestServer


@pytest.fixture(scope="session")
def sqlserver_server() -> Iterator[SqlServerTestServer | None]:
    """The server SFBRIDGE_TEST_SQLSERVER names (its databases dropped after the session), or
    None when the variable is not set."""
    prefix = os.environ.get(SQLSERVER_VARIABLE)
    if not prefix:
        yield None
        return
    server = SqlServerTestServer(prefix)
    yield server
    server.drop_all()
