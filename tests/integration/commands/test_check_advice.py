"""What `check` advises before anything is installed: the bridge's missing tables (a queue
whose unquoted dot names a schema that does not exist among them) end in one line saying
`sfbridge install` creates them, and a subscription table that does not exist is a problem
saying what happens meanwhile and who creates it. On real PostgreSQL databases."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support import pg_create_queue, sfbridge, write_config
from support.pairs import pg_pair_config

pytestmark = pytest.mark.integration


def test_check_names_install_for_missing_bridge_tables_and_flags_a_missing_subscription_table(
    tmp_path: Path, new_pg_database: Callable[[], str]
) -> None:
    sender, receiver = new_pg_database(), new_pg_database()
    pg_create_queue(receiver, '"public"."Samples.Receiver"')
    config = pg_pair_config(
        sender,
        receiver,
        forward="sfbridge.forward",  # table forward in schema sfbridge, which does not exist
        subscription_tables=[{"database": "receiver"}],
    )
    path = write_config(tmp_path / "sfbridge.yaml", config)

    before = sfbridge("-c", str(path), "check")
    lines = before.stdout.splitlines()
    assert any(
        line.startswith("ok") and '"sfbridge"."forward" is missing; the daemon creates it' in line
        for line in lines
    ), before.stdout
    [summary] = [line for line in lines if "bridge tables:" in line]
    assert summary.startswith("WARNING") and "'sfbridge install' creates them all now" in summary
    [subscriptions] = [line for line in lines if line.startswith("PROBLEM  subscription table")]
    assert '"public"."SubscriptionRouting" does not exist' in subscriptions
    assert "published events wait in retry storage" in subscriptions
    assert "installers enabled" in subscriptions
    assert before.returncode == 1

    assert sfbridge("-c", str(path), "install").returncode == 0
    after = sfbridge("-c", str(path), "check")
    assert "bridge tables:" not in after.stdout, after.stdout
    assert '"sfbridge"."forward" has the NServiceBus queue shape' in after.stdout
