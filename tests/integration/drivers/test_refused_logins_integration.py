"""A login the server refuses is AuthenticationFailed, in every driver, naming the login and
never the password; a server that is merely not there, or a database that does not exist, stays
a plain ConnectionFailed.

The test server trusts every login on loopback, so a wrong password cannot be refused there;
a role that does not exist and a role created NOLOGIN are (SQLSTATE 28000, the same class as
28P01 invalid_password), through libpq and through psqlODBC alike.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bridge.drivers.odbc import OdbcConnection
from bridge.drivers.psycopg import PsycopgConnection
from bridge.exceptions import AuthenticationFailed, ConnectionFailed

SECRET = "Tr0ub4dor-never-shown"
NOLOGIN_ROLE = "sfbridge_test_nologin"


def _with_login(connection_string: str, login: str) -> str:
    text = re.sub(r"(?i)Uid=[^;]*;", "", connection_string)
    return f"{text}Uid={login};Pwd={SECRET};"


Open = Callable[[str], Any]
DRIVERS: dict[str, Open] = {
    "psycopg": lambda text: PsycopgConnection("receiver", text, timeout=5),
    "psqlodbc": lambda text: OdbcConnection("receiver", text, timeout=5),
}


@pytest.fixture(scope="module")
def nologin_role(postgres: Any) -> Iterator[str]:
    with postgres.admin() as admin:
        exists = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = ?", NOLOGIN_ROLE).fetchone()
        if not exists:
            admin.execute(f"CREATE ROLE {NOLOGIN_ROLE} NOLOGIN")
    yield NOLOGIN_ROLE


@pytest.mark.integration
@pytest.mark.parametrize("driver", sorted(DRIVERS))
@pytest.mark.parametrize("login", ["sfbridge_no_such_role", NOLOGIN_ROLE])
def test_a_refused_login_is_authentication_failed_naming_the_login_not_the_password(
    driver: str, login: str, new_pg_database: Callable[[], str], nologin_role: str
) -> None:
    with pytest.raises(AuthenticationFailed) as refused:
        DRIVERS[driver](_with_login(new_pg_database(), login))
    assert refused.value.login == login
    assert refused.value.database == "receiver"
    assert SECRET not in str(refused.value)
    assert isinstance(refused.value, ConnectionFailed)  # waits like any outage


@pytest.mark.integration
@pytest.mark.parametrize("driver", sorted(DRIVERS))
def test_a_missing_database_or_server_is_not_a_refused_login(
    driver: str, new_pg_database: Callable[[], str]
) -> None:
    missing_database = re.sub(r"Database=[^;]*;", "Database=no_such_db;", new_pg_database())
    no_server = re.sub(r"Port=\d+;", "Port=1;", new_pg_database())
    for text in (missing_database, no_server):
        with pytest.raises(ConnectionFailed) as failure:
            DRIVERS[driver](text)
        assert not isinstance(failure.value, AuthenticationFailed), str(failure.value)
