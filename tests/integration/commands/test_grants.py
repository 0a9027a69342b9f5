"""`check`, the daemon and `install` agree about what the bridge's login may create, for the
grant combinations a DBA uses on PostgreSQL 15+ (where PUBLIC may no longer create in schema
public): a real non-superuser role on the receiver database, whose dedup ledger is missing."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import DaemonProcess, pg_connect, pg_rows, sfbridge, wait_until, write_config
from support.pairs import PgPair

pytestmark = pytest.mark.integration

LEDGER = "sfbridge_ledger"


@dataclass(frozen=True)
class Grants:
    """What the DBA granted (`sql` run as a superuser: `{role}`, `{database}`), which schema
    the bridge's tables go to on the receiver, and what must then happen."""

    sql: tuple[str, ...]
    schema: str | None
    may_create: bool
    grant: str | None = None  # the GRANT check and install must name, when not `may_create`


COMBINATIONS = {
    "database owner": Grants(('ALTER DATABASE "{database}" OWNER TO {role}',), None, True),
    "CREATE ON DATABASE only": Grants(
        ('GRANT CREATE ON DATABASE "{database}" TO {role}',),
        None,
        False,
        'GRANT CREATE ON SCHEMA "public" TO "{role}";',
    ),
    "CREATE ON SCHEMA public only": Grants(
        ("GRANT CREATE ON SCHEMA public TO {role}",), None, True
    ),
    "no CREATE at all": Grants((), None, False, 'GRANT CREATE ON SCHEMA "public" TO "{role}";'),
    # A schema of the bridge's own that does not exist yet: creating it takes the database right.
    "CREATE ON DATABASE, own schema": Grants(
        ('GRANT CREATE ON DATABASE "{database}" TO {role}',), "sfbridge_own", True
    ),
    "CREATE ON SCHEMA public, own schema": Grants(
        ("GRANT CREATE ON SCHEMA public TO {role}",),
        "sfbridge_own",
        False,
        'GRANT CREATE ON DATABASE "{database}" TO "{role}";',
    ),
}


@pytest.fixture
def role(postgres: Any, pg_pair: PgPair) -> Iterator[str]:
    """A login role without rights of its own; removed with whatever it owns or was granted."""
    name = f"sfb_grants_{uuid.uuid4().hex[:8]}"
    with postgres.admin() as admin:
        admin.execute(f"CREATE ROLE {name} LOGIN")
    yield name
    with postgres.admin() as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ?", name
        )
    with pg_connect(pg_pair.receiver) as connection:
        connection.execute(f"REASSIGN OWNED BY {name} TO postgres")
        connection.execute(f"DROP OWNED BY {name}")
        connection.commit()
    with postgres.admin() as admin:
        admin.execute(f"DROP ROLE {name}")


def drop_ledger(pair: PgPair, schema: str | None) -> None:
    with pg_connect(pair.receiver) as connection:
        connection.execute(f'DROP TABLE IF EXISTS "{schema or "public"}".{LEDGER}')
        if schema:
            connection.execute(f'DROP SCHEMA IF EXISTS "{schema}"')
        connection.commit()


def receiver_state(pair: PgPair) -> dict[str, Any]:
    result = pair.cli("status", "--json")
    for entry in json.loads(result.stdout)["destinations"]:
        if entry["database"] == "receiver":
            return entry  # type: ignore[no-any-return]
    return {}


@pytest.mark.parametrize("combination", list(COMBINATIONS))
def test_check_the_daemon_and_install_agree_on_what_the_login_may_create(
    combination: str,
    pg_pair: PgPair,
    role: str,
    postgres: Any,
    tmp_path: Path,
    start_daemon: Callable[..., DaemonProcess],
) -> None:
    grants = COMBINATIONS[combination]
    database = pg_pair.receiver.split("Database=")[1].rstrip(";")
    drop_ledger(pg_pair, None)
    with postgres.admin() as admin:
        for statement in grants.sql:
            if "ON SCHEMA" not in statement:
                admin.execute(statement.format(role=role, database=database))
    with pg_connect(pg_pair.receiver) as connection:
        # What the receiving endpoint's DBA grants in any case: sending into its queue.
        connection.execute(f"GRANT SELECT, INSERT ON {pg_pair.queue} TO {role}")
        connection.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}")
        for statement in grants.sql:
            if "ON SCHEMA" in statement:
                connection.execute(statement.format(role=role, database=database))
        connection.commit()
    raw = yaml.safe_load(pg_pair.config.read_text())
    receiver = raw["databases"]["receiver"]
    receiver["connection"] = pg_pair.receiver.replace("Uid=postgres", f"Uid={role}")
    assert receiver["connection"] != pg_pair.receiver
    if grants.schema:
        receiver["schema"] = grants.schema
        # The queue stays in "public", which the messages name: no longer the default schema.
        raw["routes"][0]["schemas"] = ["public"]
    write_config(pg_pair.config, raw)
    grant = (grants.grant or "").format(role=role, database=database)

    # check's verdict on the missing ledger...
    check = pg_pair.cli("check")
    [line] = [ln for ln in check.stdout.splitlines() if "database 'receiver' dedup ledger" in ln]
    if grants.may_create:
        assert line.startswith("ok") and "the daemon creates it" in line, check.stdout
    else:
        assert line.startswith("PROBLEM") and f"have a DBA run {grant}" in line, check.stdout
        assert check.returncode == 1

    # ...is what the daemon finds...
    daemon = start_daemon(pg_pair.config)
    pg_pair.send(1)  # the daemon learns whether a destination is ready by delivering to it
    if grants.may_create:
        wait_until(lambda: pg_pair.delivered() == 1, 30, "delivery")
    wait_until(
        lambda: receiver_state(pg_pair).get("state") in ("up", "not-ready"),
        30,
        "the daemon to tell whether the receiver is ready",
    )
    state = receiver_state(pg_pair)
    assert daemon.stop() == 0, daemon.output()
    if grants.may_create:
        assert state["state"] == "up", state
    else:
        assert pg_pair.delivered() == 0
        assert state["state"] == "not-ready", state
        assert grant in state["last_error"], state

    # ...and what install does.
    drop_ledger(pg_pair, grants.schema)
    install = pg_pair.cli("install")
    if grants.may_create:
        assert install.returncode == 0, install.stdout + install.stderr
    else:
        assert install.returncode == 3, install.stdout + install.stderr
        assert "permission denied" in install.stderr and f"have a DBA run {grant}" in install.stderr


@pytest.fixture
def dml_role(postgres: Any, pg_pair: PgPair) -> Iterator[str]:
    """A login with CREATE on the forwarding database only (so none in schema public, on
    PostgreSQL 15+) and SELECT, INSERT, UPDATE, DELETE on every table there and on the
    receiver: what a DBA grants after installing as the owner."""
    name = f"sfb_dml_{uuid.uuid4().hex[:8]}"
    database = pg_pair.sender.split("Database=")[1].rstrip(";")
    with postgres.admin() as admin:
        admin.execute(f"CREATE ROLE {name} LOGIN")
        admin.execute(f'GRANT CREATE ON DATABASE "{database}" TO {name}')
    for connection_string in (pg_pair.sender, pg_pair.receiver):
        with pg_connect(connection_string) as connection:
            connection.execute(
                f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {name}"
            )
            connection.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {name}")
            connection.commit()
    yield name
    with postgres.admin() as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ?", name
        )
    for connection_string in (pg_pair.sender, pg_pair.receiver):
        with pg_connect(connection_string) as connection:
            connection.execute(f"DROP OWNED BY {name}")
            connection.commit()
    with postgres.admin() as admin:
        admin.execute(f'REVOKE ALL ON DATABASE "{database}" FROM {name}')
        admin.execute(f"DROP ROLE {name}")


def as_role(pair: PgPair, role: str, path: Path) -> Path:
    """The pair's configuration with both databases reached as `role`, written to `path`."""
    raw = yaml.safe_load(pair.config.read_text())
    for entry in raw["databases"].values():
        entry["connection"] = entry["connection"].replace("Uid=postgres", f"Uid={role}")
        assert role in entry["connection"]
    return write_config(path, raw)


def drop_sender_tables(pair: PgPair, *tables: str) -> None:
    with pg_connect(pair.sender) as connection:
        for table in tables:
            connection.execute(f"DROP TABLE public.{table}")
        connection.commit()


def test_check_looks_at_every_bridge_table_and_says_a_dba_must_create_what_the_login_cannot(
    pg_pair: PgPair, dml_role: str, tmp_path: Path
) -> None:
    drop_sender_tables(pg_pair, "sfbridge_pauses", "sfbridge_audit")
    config = as_role(pg_pair, dml_role, tmp_path / "as-role.yaml")
    # A second forwarder in the same database: its own queue is missing too; the tables the
    # two share are looked at (and counted) once.
    raw = yaml.safe_load(config.read_text())
    raw["forwarders"].append({"name": "second", "database": "sender", "queue": "second_forward"})
    write_config(config, raw)

    check = sfbridge("-c", str(config), "check")
    lines = check.stdout.splitlines()
    grant = f'GRANT CREATE ON SCHEMA "public" TO "{dml_role}";'
    for table in ("sfbridge_pauses", "sfbridge_audit"):
        [line] = [ln for ln in lines if f'"public"."{table}"' in ln]
        assert line.startswith("PROBLEM") and f"have a DBA run {grant}" in line, check.stdout
        assert "the daemon cannot forward from this database" in line
    # The tables that exist are looked at too: all eleven of install's.
    assert '"public"."sfbridge_daemons" exists' in check.stdout
    assert '"public"."sfbridge_transactions" exists' in check.stdout
    [summary] = [ln for ln in lines if "bridge tables:" in ln]
    assert '"public"."second_forward" is missing' in check.stdout
    assert "3 missing" in summary and "creates them all now" not in summary, summary
    assert "a DBA must run the DDL of 'sfbridge install --print-sql'" in summary
    assert check.returncode == 1


def test_a_heartbeat_that_cannot_be_written_is_a_warning_once_naming_the_grant(
    pg_pair: PgPair, dml_role: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from bridge.config.load import load_config
    from bridge.daemon.heartbeat import Heartbeat

    drop_sender_tables(pg_pair, "sfbridge_daemons")
    config, _ = load_config(as_role(pg_pair, dml_role, tmp_path / "as-role.yaml"))
    grant = f'GRANT CREATE ON SCHEMA "public" TO "{dml_role}";'

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]

    heartbeat = Heartbeat(config)
    with caplog.at_level(logging.DEBUG, logger="bridge.daemon.heartbeat"):
        for _ in range(3):
            heartbeat.beat("sender")
        [warning] = warnings()
        assert "heartbeat not written to database 'sender'" in warning
        assert '"public"."sfbridge_daemons" is missing' in warning and grant in warning

        # A DBA creates it: the heartbeat is written again...
        assert pg_pair.cli("install").returncode == 0
        with pg_connect(pg_pair.sender) as connection:
            connection.execute(
                f"GRANT SELECT, INSERT, UPDATE, DELETE ON sfbridge_daemons TO {dml_role}"
            )
            connection.commit()
        heartbeat.beat("sender")
        assert pg_rows(pg_pair.sender, "SELECT count(*) FROM sfbridge_daemons") == [(1,)]
        assert len(warnings()) == 1

        # ...and a new failure is a new warning.
        drop_sender_tables(pg_pair, "sfbridge_daemons")
        heartbeat.beat("sender")
        heartbeat.beat("sender")
        assert len(warnings()) == 2, warnings()
    heartbeat.stopped()
