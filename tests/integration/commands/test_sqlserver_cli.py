"""SQL Server through the CLI, as far as it goes without a server: FreeTDS loads with the
connection string the bridge builds, an unreachable server is reported without the password,
and `install --print-sql` gives a DBA the T-SQL.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from support import sfbridge, write_config

pytestmark = pytest.mark.integration

FREETDS_CANDIDATES = [
    "/usr/lib/x86_64-linux-gnu/odbc/libtdsodbc.so",
    "/usr/lib/aarch64-linux-gnu/odbc/libtdsodbc.so",
    "/usr/lib/odbc/libtdsodbc.so",
]
PASSWORD = "hunter2-Sup3rSecret"


def _freetds() -> str:
    for candidate in FREETDS_CANDIDATES:
        if Path(candidate).exists():
            return candidate
    pytest.skip("FreeTDS (Debian package tdsodbc) is not installed")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config(tmp_path: Path, sender: str, central: str) -> Path:
    return write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": sender},
                "central": {
                    "dialect": "sqlserver",
                    "connection": central,
                    "schema": "nsb",
                    "connect_timeout": "2s",
                },
            },
            "forwarders": [
                {"name": "sender", "database": "sender", "queue": "Samples.Sender.Forward"}
            ],
            "routes": [{"match": "Samples.*", "database": "central"}],
        },
    )


def test_an_unreachable_sql_server_through_freetds_is_reported_without_its_password(
    tmp_path: Path, new_pg_database: Any
) -> None:
    central = (
        f"Driver={_freetds()};Server=127.0.0.1;Port={_closed_port()};Database=central;"
        "Uid=bridge;Pwd=${CENTRAL_PASSWORD}"
    )
    config = _config(tmp_path, new_pg_database(), central)
    env = {"CENTRAL_PASSWORD": PASSWORD}
    assert sfbridge("-c", str(config), "install", env=env).returncode == 3
    result = sfbridge("-c", str(config), "check", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "PROBLEM  database 'central': cannot connect: Unable to connect: Adaptive Server is "
        "unavailable or does not exist (SQLSTATE 08S01)"
    ) in result.stdout
    assert "ok       database 'sender': reachable" in result.stdout
    assert PASSWORD not in result.stdout + result.stderr


def test_install_print_sql_gives_the_tsql_for_a_dba(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        "Driver={PostgreSQL Unicode};Server=127.0.0.1;Database=sender",
        "Driver={ODBC Driver 18 for SQL Server};Server=db;Database=central",
    )
    result = sfbridge("-c", str(config), "install", "--print-sql")
    assert result.returncode == 0, result.stdout + result.stderr
    script = result.stdout.split("-- ===== database: central =====")[1]
    assert "-- dedup ledger" in script
    # The database's default schema is created before the ledger that lives in it.
    assert script.index("EXEC (N'CREATE SCHEMA ' + N'[nsb]')") < script.index("-- dedup ledger")
    assert "IF OBJECT_ID(N'[nsb].[sfbridge_ledger]', N'U') IS NULL" in script
    assert "CREATE TABLE [nsb].[sfbridge_ledger] (" in script
    assert "PRIMARY KEY NONCLUSTERED (message_id, destination)" in script
