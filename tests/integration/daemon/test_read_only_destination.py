"""A destination that turns read-only while messages flow, as a failover to a hot standby looks
to a client: `ALTER DATABASE ... SET default_transaction_read_only = on` and its sessions ended.
It is an outage of that database (`READ-ONLY` in status and metrics, no attempt spent, nothing
in the error queue), and once it is writable again every message arrives exactly once, also
when the setting is reset without ending the sessions opened during the freeze (those stay
read-only: the bridge must have let them go). For ledger and two-phase routes."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import ERROR_QUEUE, RETRY_TABLE, PgPair, make_pg_pair, pg_rows, wait_until
from support.metrics import free_port, scrape, value
from support.pairs import hold_for

pytestmark = pytest.mark.integration

# How long the destination stays read-only: short enough for the developer's tier;
# SFBRIDGE_TEST_FAULT_SECONDS=600 makes it a soak.
FREEZE_SECONDS = float(os.environ.get("SFBRIDGE_TEST_FAULT_SECONDS", "5"))
# max_attempts 3, 1 s apart: a freeze that spent attempts would empty retry storage into the
# error queue within the freeze.
RETRIES = {"delay": "1s", "max_attempts": 3}

TWO_PHASE = pytest.mark.xdist_group("two-phase-faults")


def _database_name(connection_string: str) -> str:
    return connection_string.split("Database=")[1].split(";")[0]


def _end_sessions(admin: Any, name: str) -> None:
    admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = ? AND pid <> pg_backend_pid()",
        name,
    )


def _pair(mode: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[PgPair, Any, int]:
    """The pair for `mode`, the server it lives on, and the port its daemon's metrics take."""
    if mode == "ledger":
        server = request.getfixturevalue("postgres")
        pair = request.getfixturevalue("pg_pair_factory")(retries=RETRIES)
    else:
        server = request.getfixturevalue("two_phase_postgres")
        sender, receiver = (server.connection_string(server.create_database()) for _ in "sr")
        pair = make_pg_pair(
            tmp_path, sender, receiver, route={"transaction": "two-phase"}, retries=RETRIES
        )
    # Metrics on a port of this test's own, added after install so the pair is a clone.
    config = yaml.safe_load(pair.config.read_text())
    port = free_port()
    config["metrics"] = {"listen": f"127.0.0.1:{port}"}
    pair.config.write_text(yaml.safe_dump(config, sort_keys=False))
    return pair, server, port


@pytest.mark.parametrize(
    ("mode", "end_sessions_at_reset"),
    [
        ("ledger", True),
        ("ledger", False),
        pytest.param("two-phase", True, marks=TWO_PHASE),
        pytest.param("two-phase", False, marks=TWO_PHASE),
    ],
    ids=["ledger", "ledger-sessions-kept", "two-phase", "two-phase-sessions-kept"],
)
def test_a_destination_turned_read_only_waits_as_an_outage_and_flows_again_exactly_once(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    start_daemon: Callable[..., Any],
    mode: str,
    end_sessions_at_reset: bool,
) -> None:
    pair, server, port = _pair(mode, tmp_path, request)
    receiver = _database_name(pair.receiver)
    daemon = start_daemon(pair.config)
    ids = pair.send(1000)
    wait_until(lambda: pair.delivered() == 1000, 30, "the first messages to flow")

    # The failover, as a client sees it: the database takes no writes, its sessions are gone.
    with server.admin() as admin:
        admin.execute(f'ALTER DATABASE "{receiver}" SET default_transaction_read_only = on')
        _end_sessions(admin, receiver)
    ids |= pair.send(500)

    def metrics_say(read_only: int) -> bool:
        samples = scrape(port)
        return (
            value(samples, "sfbridge_database_read_only", database="receiver") == read_only
            and value(samples, "sfbridge_database_up", database="receiver") == 1 - read_only
        )

    def status_says(state: str, error: str = "") -> bool:
        entries = {entry["database"]: entry for entry in pair.status()["destinations"]}
        entry = entries.get("receiver", {})
        return entry.get("state") == state and error in (entry.get("last_error") or "")

    began = time.monotonic()
    wait_until(lambda: metrics_say(read_only=1), 20, "the metrics to say read-only")
    said = time.monotonic() - began
    # The probe asks a new session whether the database takes writes, and says why not.
    why = "does not accept writes: its sessions start read-only (default_transaction_read_only"
    wait_until(lambda: status_says("read-only", why), 20, "status to say read-only, and why")
    assert "receiver     READ-ONLY since" in pair.cli("status").stdout
    ids |= pair.send(500)  # more arriving while it lasts

    def nothing_lost_or_spent() -> None:
        assert pg_rows(pair.sender, f"SELECT count(*) FROM {ERROR_QUEUE}") == [(0,)]
        # No attempt spent on an outage (the default during_outage: wait).
        assert pg_rows(pair.sender, f"SELECT coalesce(max(attempts), 0) FROM {RETRY_TABLE}") == [
            (0,)
        ]
        assert pair.delivered() == 1000  # nothing can be written meanwhile

    hold_for(FREEZE_SECONDS, nothing_lost_or_spent)

    with server.admin() as admin:
        admin.execute(f'ALTER DATABASE "{receiver}" RESET default_transaction_read_only')
        if end_sessions_at_reset:
            _end_sessions(admin, receiver)
    reset_at = time.monotonic()
    wait_until(lambda: pair.delivered() == 2000, 30, "every message after the freeze")
    flowing_again = time.monotonic() - reset_at
    print(f"{mode}: read-only in the metrics {said:.1f} s after the freeze; all 2000 delivered "
          f"{flowing_again:.1f} s after the reset")  # fmt: skip
    assert flowing_again < 15, flowing_again

    wait_until(lambda: metrics_say(read_only=0), 15, "the metrics to say the receiver is up")
    wait_until(lambda: status_says("up"), 15, "status to say the receiver is up")
    assert daemon.stop() == 0, daemon.output()
    assert pair.received() == Counter(dict.fromkeys(ids, 1))
    assert pair.queued() == 0
    assert pg_rows(pair.sender, f"SELECT count(*) FROM {RETRY_TABLE}") == [(0,)]
    assert pg_rows(pair.sender, f"SELECT count(*) FROM {ERROR_QUEUE}") == [(0,)]
    assert pg_rows(
        pair.receiver, "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()"
    ) == [(0,)]
    log = daemon.output()
    assert log.count("does not accept writes (read-only)") == 1, log
    assert log.count("is usable again") == 1, log
