"""The DDL docs/concepts.md gives for the tables the endpoints own (a receiver's queue, a
SubscriptionRouting table) is what the bridge works with: both blocks run on a real PostgreSQL
database, `check` and `route` read them, and a published event reaches the queue through the
subscription."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from support import REPO, DaemonProcess, pg_connect, wait_until
from support.pairs import make_pg_pair

pytestmark = pytest.mark.integration

PAGE = (REPO / "docs" / "concepts.md").read_text(encoding="utf-8")
EVENT_TYPE = "$.store-and-forward.eventtype"


def documented_sql(name: str) -> list[str]:
    """The statements of the ```sql block after `<!-- endpoint-ddl:NAME -->`."""
    match = re.search(rf"<!-- endpoint-ddl:{name} -->\n```sql\n(.*?)```", PAGE, re.S)
    assert match, name
    return [part.strip() for part in match.group(1).split(";") if part.strip()]


def test_the_documented_tables_are_the_ones_the_bridge_reads_and_writes(
    tmp_path: Path,
    new_pg_database: Callable[[], str],
    start_daemon: Callable[..., DaemonProcess],
) -> None:
    sender, receiver = new_pg_database(), new_pg_database()
    with pg_connect(receiver) as connection:
        for statement in documented_sql("receiver-queue") + documented_sql("subscription-routing"):
            connection.execute(statement)
        connection.commit()
    pair = make_pg_pair(
        tmp_path,
        sender,
        receiver,
        create_queue=False,
        subscription_tables=[{"database": "receiver"}],
    )
    check = pair.cli("check")
    assert '"public"."SubscriptionRouting" is readable' in check.stdout, check.stdout
    route = pair.cli("route", "--event-type", "Shared.Events.OrderAccepted")
    assert route.returncode == 0, route.stdout + route.stderr
    assert '"public"."Samples.Receiver"' in route.stdout and "receiver" in route.stdout

    daemon = start_daemon(pair.config)
    ids = pair.send(1, destination=None, **{EVENT_TYPE: "Shared.Events.OrderAccepted"})
    wait_until(lambda: pair.delivered() == 1, 30, "the event in the documented queue")
    assert daemon.stop() == 0, daemon.output()
    assert set(pair.received()) == ids
