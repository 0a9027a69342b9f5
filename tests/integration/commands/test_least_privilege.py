"""A dedicated login made from `install --print-grants` runs the bridge: the DBA creates the
tables (`install` as postgres, the owner) and runs the printed statements; as that login
`check` finds nothing lacking and nothing too much, and the daemon forwards PG -> PG into the
destination queue and the error queue exactly once. A grant taken away is shown by `check`
with the exact GRANT; rights beyond the needs, and a superuser, are warnings."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import (
    ERROR_QUEUE,
    DaemonProcess,
    pg_connect,
    pg_count,
    sfbridge,
    wait_until,
    write_config,
)
from support.pairs import PgPair, make_pg_pair

pytestmark = pytest.mark.integration


def database_of(connection_string: str) -> str:
    return connection_string.split("Database=")[1].rstrip(";")


@pytest.fixture
def pair(tmp_path: Path, new_pg_database: Callable[[], str]) -> PgPair:
    """Installed by postgres (the DBA), routing one queue named outright; at_runtime off."""
    return make_pg_pair(
        tmp_path,
        new_pg_database(),
        new_pg_database(),
        route={"match": "Samples.Receiver"},
        install={"at_runtime": False},
    )


@pytest.fixture
def login(postgres: Any, pair: PgPair) -> Iterator[str]:
    """A unique role name; whatever it becomes is dropped at the end, even on failure."""
    name = f"sfb_least_{uuid.uuid4().hex[:8]}"
    yield name
    with postgres.admin() as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ?", name
        )
        exists = admin.execute("SELECT count(*) FROM pg_roles WHERE rolname = ?", name).fetchone()
    if not exists[0]:
        return
    for connection_string in (pair.sender, pair.receiver):
        with pg_connect(connection_string) as connection:
            connection.execute(f'DROP OWNED BY "{name}"')
            connection.commit()
    with postgres.admin() as admin:
        for connection_string in (pair.sender, pair.receiver):
            admin.execute(
                f'REVOKE ALL ON DATABASE "{database_of(connection_string)}" FROM "{name}"'
            )
        admin.execute(f'DROP ROLE "{name}"')


def sections(script: str) -> dict[str, list[str]]:
    """The printed script's statements per database section (comments left out)."""
    found: dict[str, list[str]] = {}
    current = ""
    for line in script.splitlines():
        header = re.match(r"-- ===== database: (\w+) ", line)
        if header:
            current = header.group(1)
            found[current] = []
        elif line.strip() and not line.startswith("--"):
            found[current].append(line.rstrip(";"))
    return found


def grant_as_dba(pair: PgPair, postgres: Any, login: str) -> str:
    """Run the printed statements as postgres: the role on the server, the rest in each
    database. The script, for the test's messages."""
    result = pair.cli("install", "--print-grants", "--login", login)
    assert result.returncode == 0, result.stdout + result.stderr
    script = result.stdout
    statements = sections(script)
    strings = {"sender": pair.sender, "receiver": pair.receiver}
    with postgres.admin() as admin:
        for statement in statements["sender"]:
            if statement.startswith("CREATE ROLE"):
                admin.execute(statement)
    for name, connection_string in strings.items():
        with pg_connect(connection_string) as connection:
            for statement in statements[name]:
                if not statement.startswith("CREATE ROLE"):
                    connection.execute(statement)
            connection.commit()
    return script


def as_login(pair: PgPair, login: str, path: Path) -> Path:
    raw = yaml.safe_load(pair.config.read_text())
    for entry in raw["databases"].values():
        entry["connection"] = entry["connection"].replace("Uid=postgres", f"Uid={login}")
        assert login in entry["connection"]
    return write_config(path, raw)


def problems_and_warnings(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(("PROBLEM", "WARNING"))]


def test_a_login_made_from_print_grants_checks_clean_and_forwards_exactly_once(
    pair: PgPair, login: str, postgres: Any, tmp_path: Path
) -> None:
    script = grant_as_dba(pair, postgres, login)
    assert f'CREATE ROLE "{login}" LOGIN NOSUPERUSER' in script
    assert f'GRANT INSERT ON "public"."Samples.Receiver" TO "{login}";' in script
    assert "SELECT" not in script.split('Samples.Receiver" TO')[0].splitlines()[-1]
    config = as_login(pair, login, tmp_path / "as-login.yaml")

    check = sfbridge("-c", str(config), "check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert problems_and_warnings(check.stdout) == [], check.stdout
    assert "no problems found" in check.stdout

    with DaemonProcess(config, tmp_path / "daemon.log") as daemon:
        routed = pair.send(5)
        unroutable = pair.send(2, destination='"public"."Samples.Nowhere"')
        wait_until(lambda: pair.delivered() == 5, 30, "delivery to the destination queue")
        wait_until(lambda: pg_count(pair.sender, ERROR_QUEUE) == 2, 30, "the error queue")
        assert daemon.stop() == 0, daemon.output()
    assert "superuser" not in daemon.output()
    received = pair.received()
    assert set(received) == routed and max(received.values()) == 1
    assert pg_count(pair.sender, ERROR_QUEUE) == 2 and unroutable
    assert pair.queued() == 0


def test_check_shows_the_exact_grant_a_login_lacks_and_the_rights_it_does_not_need(
    pair: PgPair, login: str, postgres: Any, tmp_path: Path
) -> None:
    grant_as_dba(pair, postgres, login)
    with pg_connect(pair.sender) as connection:
        connection.execute(f'REVOKE DELETE ON "public"."Samples.Sender.Forward" FROM "{login}"')
        connection.commit()
    with pg_connect(pair.receiver) as connection:
        connection.execute(f'GRANT DELETE, TRUNCATE ON "public"."Samples.Receiver" TO "{login}"')
        connection.commit()
    config = as_login(pair, login, tmp_path / "as-login.yaml")

    check = sfbridge("-c", str(config), "check")
    assert check.returncode == 1, check.stdout
    [lacking] = [line for line in check.stdout.splitlines() if line.startswith("PROBLEM")]
    assert f"database 'sender' login '{login}'" in lacking
    assert (
        f'have a DBA run GRANT DELETE ON "public"."Samples.Sender.Forward" TO "{login}";' in lacking
    ), lacking
    [extra] = [line for line in check.stdout.splitlines() if line.startswith("WARNING")]
    assert f"database 'receiver' login '{login}'" in extra and "DELETE, TRUNCATE" in extra
    assert f'REVOKE DELETE, TRUNCATE ON "public"."Samples.Receiver" FROM "{login}";' in extra


def test_check_and_the_daemon_warn_when_the_login_is_a_superuser(
    pair: PgPair, tmp_path: Path
) -> None:
    check = pair.cli("check")
    warnings = [line for line in check.stdout.splitlines() if "is superuser" in line]
    assert len(warnings) == 2, check.stdout  # sender and receiver
    assert all(line.startswith("WARNING") for line in warnings)
    assert "sfbridge install --print-grants" in warnings[0]
    assert check.returncode == 0, check.stdout  # a warning, not a problem

    with DaemonProcess(pair.config, tmp_path / "daemon.log") as daemon:
        daemon.wait_for_output("login is 'postgres' superuser in database 'sender'")
        assert daemon.stop() == 0
    assert daemon.output().count("--print-grants") == 1
