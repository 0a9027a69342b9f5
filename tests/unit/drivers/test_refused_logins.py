"""A login the server refuses is AuthenticationFailed, in every driver, naming the login and
never the password; a server that is merely not there, or a database that does not exist, stays
a plain ConnectionFailed.

The test server trusts every login on loopback, so a wrong password cannot be refused there;
a role that does not exist and a role created NOLOGIN are (SQLSTATE 28000, the same class as
28P01 invalid_password), through libpq and through psqlODBC alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from bridge.drivers.odbc import OdbcConnection, login_of
from bridge.drivers.psycopg import PsycopgConnection
from bridge.drivers.sqlstates import connect_failure
from bridge.exceptions import AuthenticationFailed, ConnectionFailed

Open = Callable[[str], Any]
DRIVERS: dict[str, Open] = {
    "psycopg": lambda text: PsycopgConnection("receiver", text, timeout=5),
    "psqlodbc": lambda text: OdbcConnection("receiver", text, timeout=5),
}


@pytest.mark.parametrize(
    ("state", "message", "login"),
    [
        # PostgreSQL's wrong password (28P01), as a driver that reports the SQLSTATE has it.
        ("28P01", 'FATAL:  password authentication failed for user "bridge"', "bridge"),
        # The same through libpq, which reports no SQLSTATE on connect.
        ("", 'FATAL:  password authentication failed for user "bridge"', "bridge"),
        ("", 'FATAL:  no pg_hba.conf entry for host "10.0.0.9", user "bridge"', None),
        ("", "fe_sendauth: no password supplied", None),
        # SQL Server through FreeTDS / Microsoft's driver: SQLSTATE 28000, error 18456.
        ("28000", "[FreeTDS][SQL Server]Login failed for user 'bridge'. (18456)", "bridge"),
        ("42000", "[SQL Server]Login failed for user 'bridge'. (18456) (SQLDriver)", "bridge"),
    ],
)
def test_refused_logins_are_told_by_sqlstate_class_28_or_the_servers_words(
    state: str, message: str, login: str | None
) -> None:
    failure = connect_failure("receiver", state, message, f"cannot connect: {message}", None)
    assert isinstance(failure, AuthenticationFailed)
    assert failure.login == login


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ("08001", 'connection to server at "127.0.0.1", port 1 failed: Connection refused'),
        ("", 'FATAL:  database "sender" does not exist'),
        ("08001", "[FreeTDS][SQL Server]Unable to connect to data source"),
    ],
)
def test_other_connect_failures_are_outages(state: str, message: str) -> None:
    failure = connect_failure("receiver", state, message, message, None)
    assert type(failure) is ConnectionFailed


def test_the_login_of_an_odbc_connection_string() -> None:
    assert login_of("Driver={x};Server=db;UID=bridge;PWD=x;") == "bridge"
    assert login_of("Server=db;User ID={br;dge};") == "br;dge"
    assert login_of("Server=db;Trusted_Connection=yes;") is None
