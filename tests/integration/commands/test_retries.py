"""`sfbridge retries list / now / fail` through the real CLI against PostgreSQL, beside a running
daemon: messages wait in retry storage because the receiver's queue is missing; once it is
created, `retries now` has them delivered at once instead of after the hour's delay; `retries
fail` moves them to the error queue with the failure headers; a `retries fail` SIGKILLed after
its first chunk leaves every message in exactly one place."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import (
    ERROR_QUEUE,
    RETRY_TABLE,
    SAMPLES_RECEIVER,
    SENDER_FORWARD,
    DaemonProcess,
    pg_count,
    pg_create_queue,
    pg_rows,
    wait_until,
)
from support.pairs import PgPair

pytestmark = pytest.mark.integration

# A delay no test waits for: only the operator makes these messages due.
AN_HOUR = {"delay": "1h", "max_delay": "1h"}


def _waiting_pair(pg_pair_factory: Callable[..., PgPair]) -> PgPair:
    """A pair whose receiver has no queue yet: every delivery fails and waits for retry."""
    return pg_pair_factory(create_queue=False, retries=AN_HOUR)


def _park(pair: PgPair, daemon: DaemonProcess, count: int) -> set[str]:
    """Send `count` messages and wait until the daemon has put them all in retry storage."""
    ids = pair.send(count)
    wait_until(
        lambda: pg_count(pair.sender, RETRY_TABLE) == count, 60, f"{count} rows in retry storage"
    )
    assert daemon.process.poll() is None, daemon.output()
    return ids


def _error_rows(pair: PgPair) -> list[dict[str, Any]]:
    return [
        {"id": str(row[0]), "headers": json.loads(row[1])}
        for row in pg_rows(pair.sender, f"SELECT id, headers FROM {ERROR_QUEUE}")
    ]


def test_list_then_now_delivers_at_once_once_the_cause_is_fixed(
    pg_pair_factory: Callable[..., PgPair], tmp_path: Path
) -> None:
    pair = _waiting_pair(pg_pair_factory)
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        ids = _park(pair, daemon, 5)
        listed = pair.cli("retries", "list")
        assert listed.returncode == 0, listed.stderr
        assert "5 message(s)" in listed.stdout
        assert all(message_id in listed.stdout for message_id in ids)
        assert "MESSAGE ID" in listed.stdout and "LAST ERROR" in listed.stdout
        # The last error whole, with its advice (it ends far beyond 80 characters).
        assert "or fix the route or the destination header" in listed.stdout, listed.stdout
        as_json = json.loads(pair.cli("retries", "list", "--json").stdout)
        assert {entry["message_id"] for entry in as_json} == ids
        assert {entry["forwarder"] for entry in as_json} == {"sender"}
        assert all(entry["attempts"] >= 1 and entry["last_error"] for entry in as_json)
        # A filter that matches nothing changes nothing.
        none = pair.cli("retries", "now", "--destination", "Nothing.*")
        assert "nothing to do" in none.stdout, none.stdout

        pg_create_queue(pair.receiver, SAMPLES_RECEIVER)  # the cause, fixed
        result = pair.cli("retries", "now")
        assert result.returncode == 0, result.stderr
        assert "made 5 message(s) due now" in result.stdout
        wait_until(lambda: pair.delivered() == 5, 10, "the 5 messages delivered")
        assert pair.received() == Counter({message_id: 1 for message_id in ids})
        assert pg_count(pair.sender, RETRY_TABLE) == 0
        # Recorded: who, what, how many.
        assert "audit:" in result.stderr and "'retries now'" in result.stderr


def test_fail_moves_every_waiting_message_to_the_error_queue_with_failure_headers(
    pg_pair_factory: Callable[..., PgPair], tmp_path: Path
) -> None:
    pair = _waiting_pair(pg_pair_factory)
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        ids = _park(pair, daemon, 6)
        one = sorted(ids)[0]
        # By NServiceBus.MessageId: exactly one.
        only = pair.cli("retries", "fail", "--yes", "--id", one)
        assert only.returncode == 0, only.stderr
        assert "moved 1 message(s)" in only.stdout, only.stdout
        result = pair.cli("retries", "fail", "--yes", "--forwarder", "sender")
        assert result.returncode == 0, result.stderr
        assert "moved 5 message(s)" in result.stdout, result.stdout
        assert pg_count(pair.sender, RETRY_TABLE) == 0
        rows = _error_rows(pair)
        assert Counter(row["headers"]["NServiceBus.MessageId"] for row in rows) == Counter(
            {message_id: 1 for message_id in ids}
        )
        for row in rows:
            headers = row["headers"]
            assert headers["$.sfbridge.failure-reason"] == "failed-by-operator"
            assert headers["NServiceBus.FailedQ"] == SENDER_FORWARD  # as the daemon writes it
            assert headers["NServiceBus.ProcessingEndpoint"] == "sender"
            assert int(headers["$.sfbridge.attempts"]) >= 1
            assert "sfbridge retries fail" in headers["NServiceBus.ExceptionInfo.Message"]
        listed = pair.cli("errors", "list", "--reason", "failed-by-operator", "--json")
        assert listed.returncode == 0, listed.stderr
        assert {entry["message_id"] for entry in json.loads(listed.stdout)} == ids
        assert daemon.process.poll() is None


def test_a_fail_killed_after_its_first_chunk_loses_and_duplicates_nothing(
    pg_pair_factory: Callable[..., PgPair], tmp_path: Path
) -> None:
    count = 4000
    pair = _waiting_pair(pg_pair_factory)
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        ids = _park(pair, daemon, count)
        process = subprocess.Popen(
            [sys.executable, "-m", "bridge", "-c", str(pair.config), "retries", "fail", "--yes"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None
        first = process.stdout.readline()
        process.send_signal(signal.SIGKILL)
        _, errors = process.communicate(timeout=30)
        assert first.startswith("moved 100 message(s)"), first + errors

        def places() -> tuple[Counter[str], Counter[str]]:
            waiting = Counter(
                json.loads(row[0])["NServiceBus.MessageId"]
                for row in pg_rows(pair.sender, f"SELECT headers FROM {RETRY_TABLE}")
            )
            failed = Counter(row["headers"]["NServiceBus.MessageId"] for row in _error_rows(pair))
            return waiting, failed

        waiting, failed = places()
        assert 0 < sum(failed.values()) < count, "killed before the end, after the first chunk"
        assert not (set(waiting) & set(failed))
        assert max((waiting + failed).values()) == 1
        assert set(waiting) | set(failed) == ids
        # Its audit record, written first and counted up by each chunk as it committed, says
        # exactly what it moved before it was killed.
        audit = "SELECT affected FROM public.sfbridge_audit WHERE command = 'retries fail'"
        assert pg_rows(pair.sender, audit) == [(sum(failed.values()),)]

        again = pair.cli("retries", "fail", "--yes", timeout=120)
        assert again.returncode == 0, again.stderr
        waiting, failed = places()
        assert not waiting and failed == Counter({message_id: 1 for message_id in ids})
        assert sum(row[0] for row in pg_rows(pair.sender, audit)) == count
        assert daemon.process.poll() is None


def test_fail_beside_a_daemon_retrying_the_same_rows_gives_each_message_one_owner(
    pg_pair_factory: Callable[..., PgPair], tmp_path: Path
) -> None:
    # Due every second: the daemon claims, fails and stores the rows again all the while.
    pair = pg_pair_factory(create_queue=False, retries={"delay": "1s"})
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        ids = _park(pair, daemon, 500)
        # Each pass skips the rows a batch holds; passes until none is left, with a deadline
        # (on a loaded machine a batch can hold all of them through several passes).
        deadline = time.monotonic() + 90
        while True:
            result = pair.cli("retries", "fail", "--yes")
            assert result.returncode == 0, result.stderr
            if pg_count(pair.sender, RETRY_TABLE) == 0 or time.monotonic() > deadline:
                break
        waiting = pg_count(pair.sender, RETRY_TABLE)
        failed = Counter(row["headers"]["NServiceBus.MessageId"] for row in _error_rows(pair))
        assert waiting == 0, result.stdout
        assert failed == Counter({message_id: 1 for message_id in ids})
        assert daemon.process.poll() is None


def test_a_proxys_failed_messages_show_its_destination_and_count_as_sent_to_error_queue(
    pg_pair_factory: Callable[..., PgPair], tmp_path: Path
) -> None:
    from bridge.forwarding.settle import CLAIMED, ERRORS
    from bridge.storage.retries import OPERATOR_COUNTS

    assert OPERATOR_COUNTS == (CLAIMED, ERRORS)  # the daemon's names for the same counts
    # A proxy: messages carry no routing header; the receiver's queue is missing, so they wait.
    pair = pg_pair_factory(
        create_queue=False,
        retries=AN_HOUR,
        forward='"public"."Samples.Receiver"',
        forwarder={"destination": {"database": "receiver"}},
    )
    with pair.daemon(tmp_path / "daemon.log") as daemon:
        pair.send(2, destination=None)
        wait_until(lambda: pg_count(pair.sender, RETRY_TABLE) == 2, 60, "2 in retry storage")
        before = pair.status()["forwarders"][0]["counters"]
        result = pair.cli("retries", "fail", "--yes")
        assert result.returncode == 0 and "moved 2 message(s)" in result.stdout, result.stderr
        after = pair.status()["forwarders"][0]["counters"]
        assert after.get(ERRORS, 0) - before.get(ERRORS, 0) == 2, (before, after)
        assert after[CLAIMED] - before[CLAIMED] == 2
        assert daemon.process.poll() is None

    listed = pair.cli("errors", "list")
    where = '"public"."Samples.Receiver" in database \'receiver\''
    rows = [line for line in listed.stdout.splitlines() if "failed-by-operator" in line]
    assert len(rows) == 2 and all(where in row for row in rows), listed.stdout
    as_json = json.loads(pair.cli("errors", "list", "--json").stdout)
    assert [entry["destination"] for entry in as_json] == [where, where]
    # `--destination` matches the proxy's destination, as it does a routing header.
    for glob, count in (("Samples.Rec*", 2), ('"public"."Samples.Receiver"', 2), ("Other*", 0)):
        chosen = json.loads(pair.cli("errors", "list", "--destination", glob, "--json").stdout)
        assert len(chosen) == count, (glob, chosen)
