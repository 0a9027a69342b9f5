"""Push on PostgreSQL: a message is picked up when its sender commits, not at the next poll;
a lost listening connection or a missing trigger falls back to polling and misses nothing."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support import (
    RETRY_TABLE,
    SAMPLES_RECEIVER,
    PgPair,
    nsb_message_headers,
    pg_connect,
    pg_count,
    pg_create_queue,
    pg_nsb_send,
    pg_pair_config,
    pg_rows,
    sfbridge,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration

PUSHING = "table(s) push (LISTEN/NOTIFY)"


def database_name(connection_string: str) -> str:
    return connection_string.split("Database=")[1].rstrip(";")


def picked_up_within(pair: PgPair, seconds: float, count: int = 1) -> set[str]:
    """Send `count` messages and wait (at most `seconds`) for them to be delivered."""
    before = pair.delivered()
    ids = pair.send(count)
    wait_until(lambda: pair.delivered() == before + count, seconds, "the messages delivered")
    return ids


def test_a_message_is_pushed_to_the_daemon_though_polls_are_a_minute_apart(
    pg_pair_factory: Any, tmp_path: Path
) -> None:
    pair = pg_pair_factory(forwarder={"peek_interval": "60s"})
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        daemon.wait_for_output(PUSHING)
        sent: set[str] = set()
        for _ in range(5):
            started = time.monotonic()
            sent |= picked_up_within(pair, 10)
            assert time.monotonic() - started < 10
        assert daemon.stop() == 0, daemon.output()
    assert pair.received() == Counter(sent)


def test_messages_sent_while_the_listening_connection_is_down_are_delivered(
    pg_pair_factory: Any, postgres: Any, tmp_path: Path
) -> None:
    pair = pg_pair_factory(forwarder={"peek_interval": "60s"})
    name = database_name(pair.sender)
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        daemon.wait_for_output(PUSHING)
        sent = picked_up_within(pair, 10)
        with pg_connect(pair.sender) as endpoint:  # opened while connections are allowed
            with postgres.admin() as admin:
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            try:
                # Every connection of the bridge to the forwarding database, the watcher's
                # with them; none can be opened again for now.
                killed = pg_rows(
                    pair.sender.replace(name, "postgres"),
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    f"WHERE datname = '{name}' AND application_name = 'sfbridge'",
                )
                assert len(killed) >= 1, "no connection of the bridge to kill"
                daemon.wait_for_output("the listening connection is lost")
                for _ in range(3):
                    headers = nsb_message_headers(pair.queue)
                    sent.add(str(headers["NServiceBus.MessageId"]))
                    pg_nsb_send(endpoint, pair.forward, headers, b"x")
                endpoint.commit()
            finally:
                with postgres.admin() as admin:
                    admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        # Polls are a minute apart: the poll on listening again finds them.
        wait_until(lambda: pair.delivered() == 4, 20, "what was sent meanwhile")
        daemon.wait_for_output(PUSHING, count=2)
        sent |= picked_up_within(pair, 10)  # and pushes again
        assert daemon.stop() == 0, daemon.output()
    assert pair.received() == Counter(sent)


def test_a_queue_whose_trigger_was_dropped_is_polled(pg_pair_factory: Any, tmp_path: Path) -> None:
    pair = pg_pair_factory(forwarder={"peek_interval": "200ms"})
    with pg_connect(pair.sender) as dba:
        dba.execute(f"DROP TRIGGER sfbridge_notify ON {pair.forward}")
        dba.commit()
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        daemon.wait_for_output("without the push trigger")
        assert "1 of 2 table(s) push" in daemon.output()  # retry storage still does
        sent: set[str] = set()
        for _ in range(3):
            # Well within the 5 s of the slow poll: the queue is polled every peek interval.
            sent |= picked_up_within(pair, 3)
        result = sfbridge("-c", str(pair.config), "install")  # what the warning says to run
        assert result.returncode == 0, result.stdout + result.stderr
        daemon.wait_for_output("has the push trigger now")
        sent |= picked_up_within(pair, 3)
        assert daemon.stop() == 0, daemon.output()
    assert pair.received() == Counter(sent)


def test_a_trigger_the_login_may_not_create_is_a_warning_and_the_queue_is_polled(
    pg_pair_factory: Any, postgres: Any, tmp_path: Path
) -> None:
    pair = pg_pair_factory(forwarder={"peek_interval": "200ms"})
    role = f"sfb_notrigger_{uuid.uuid4().hex[:8]}"
    with postgres.admin() as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        for database in (pair.sender, pair.receiver):
            admin.execute(
                f'GRANT CONNECT, CREATE ON DATABASE "{database_name(database)}" TO {role}'
            )
    try:
        # The bridge's tables belong to the role; the forwarding queue, as an endpoint's
        # installer made it, does not: the role may use it but not put a trigger on it.
        with pg_connect(pair.sender) as dba:
            dba.execute(f"DROP TRIGGER sfbridge_notify ON {pair.forward}")
            dba.execute(f"GRANT CREATE, USAGE ON SCHEMA public TO {role}")
            for row in dba.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                "AND tablename LIKE 'sfbridge%'"
            ).fetchall():
                dba.execute(f'ALTER TABLE public."{row[0]}" OWNER TO {role}')
            # Every right but TRIGGER.
            dba.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {pair.forward} TO {role}")
            dba.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
            dba.execute(f'GRANT ALL ON public."error" TO {role}')
            dba.commit()
        with pg_connect(pair.receiver) as dba:
            dba.execute(f"ALTER TABLE public.sfbridge_ledger OWNER TO {role}")
            dba.execute(f"GRANT ALL ON SCHEMA public TO {role}")
            dba.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
            dba.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
            dba.commit()
        import yaml

        raw = yaml.safe_load(pair.config.read_text())
        for name in ("sender", "receiver"):
            text = raw["databases"][name]["connection"]
            raw["databases"][name]["connection"] = text.replace("Uid=postgres", f"Uid={role}")
        write_config(pair.config, raw)
        installed = sfbridge("-c", str(pair.config), "install")
        assert installed.returncode == 0, installed.stdout + installed.stderr
        output = installed.stdout + installed.stderr
        assert "push trigger on forwarding queue" in output and "polls that table" in output
        with pair.daemon(tmp_path / "daemon.log") as daemon:
            daemon.wait_for_output("without the push trigger")
            sent = picked_up_within(pair, 3) | picked_up_within(pair, 3)
            assert daemon.stop() == 0, daemon.output()
        assert pair.received() == Counter(sent)
    finally:
        with postgres.admin() as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ?", role
            )
        for database in (pair.sender, pair.receiver):
            with pg_connect(database) as dba:
                dba.execute(f"REASSIGN OWNED BY {role} TO postgres")
                dba.execute(f"DROP OWNED BY {role}")
                dba.commit()
        with postgres.admin() as admin:
            admin.execute(f"DROP ROLE {role}")


def held_up_pair(tmp_path: Path, new_pg_database: Any) -> tuple[PgPair, str, Callable[[], bool]]:
    """A pair whose forwarding database also holds a second forwarder's queue, `OTHER`, and
    a check that the watcher's look waits for a lock (for up to the 60 s of its
    query_timeout). The receiver's queue is not created."""
    sender, receiver = new_pg_database(), new_pg_database()
    raw = pg_pair_config(sender, receiver, forwarder={"peek_interval": "1s"})
    raw["databases"]["sender"]["query_timeout"] = "60s"
    raw["forwarders"].append({"name": "other", "database": "sender", "queue": OTHER})
    config = write_config(tmp_path / "sfbridge.yaml", raw)
    installed = sfbridge("-c", str(config), "install")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    name = database_name(sender)
    waiting_poll = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sfbridge' "
        f"AND datname = '{name}' AND wait_event_type = 'Lock' "
        "AND query LIKE '%EXISTS (SELECT 1 FROM%'"
    )

    def poll_waits() -> bool:
        return pg_rows(sender.replace(name, "postgres"), waiting_poll)[0][0] == 1

    return PgPair(config, sender, receiver), sender, poll_waits


OTHER = '"public"."Other.Forward"'


@contextmanager
def other_queue_locked(sender: str, poll_waits: Callable[[], bool]) -> Iterator[None]:
    """While open, another client holds `OTHER` locked and the watcher's look waits for it
    (the next look at every source, 5 s apart, runs into the lock)."""
    with pg_connect(sender) as dba:
        dba.execute(f"LOCK TABLE {OTHER} IN ACCESS EXCLUSIVE MODE")
        try:
            wait_until(poll_waits, 15, "the watcher's poll to wait for the lock")
            yield
        finally:
            dba.rollback()


def test_a_message_is_pushed_while_the_poll_waits_for_a_table_kept_locked(
    tmp_path: Path, new_pg_database: Any
) -> None:
    """The safety poll is stuck behind another client's lock on a second forwarder's queue
    (for up to the 60 s of its query_timeout); a message to the first is picked up all the
    same, while the poll still waits."""
    pair, sender, poll_waits = held_up_pair(tmp_path, new_pg_database)
    pg_create_queue(pair.receiver, SAMPLES_RECEIVER)
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        daemon.wait_for_output(PUSHING)
        with other_queue_locked(sender, poll_waits):
            sent = picked_up_within(pair, 5)
            assert poll_waits(), "the poll ended before the message came: nothing shown"
        assert daemon.stop() == 0, daemon.output()
        assert "Traceback" not in daemon.output()  # the listener thread ended cleanly too
    assert pair.received() == Counter(sent)


def test_a_retry_comes_due_while_the_poll_waits_for_a_table_kept_locked(
    tmp_path: Path, new_pg_database: Any
) -> None:
    """The same held-up poll, for retry storage: a message whose first delivery failed (its
    destination queue did not exist yet) is stored for a retry 1 s later. The look that
    would tell when it is due waits for the lock, and the retry is made all the same once
    the queue is there, while the poll still waits."""
    pair, sender, poll_waits = held_up_pair(tmp_path, new_pg_database)
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        daemon.wait_for_output(PUSHING)
        with other_queue_locked(sender, poll_waits):
            sent = pair.send(1)
            wait_until(lambda: pg_count(sender, RETRY_TABLE) == 1, 10, "the first attempt to fail")
            pg_create_queue(pair.receiver, SAMPLES_RECEIVER)
            wait_until(lambda: pair.delivered() == 1, 10, "the retry delivered")
            assert poll_waits(), "the poll ended before the retry was made: nothing shown"
        assert daemon.stop() == 0, daemon.output()
    assert pair.received() == Counter(sent)
    assert pg_count(sender, RETRY_TABLE) == 0
