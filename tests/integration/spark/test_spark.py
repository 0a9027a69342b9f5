"""`sfbridge spark ...` on a real local Spark, driven as a user would: the CLI in subprocesses,
real PostgreSQL databases, the daemon competing, the drain killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import (
    FORWARD,
    RECEIVER,
    SPARK_ENV,
    DaemonProcess,
    pg_connect,
    pg_count,
    pg_rows,
    received_ids,
    run_spark,
    send_bulk,
    sfbridge,
    spark_world,
    wait_until,
)

pytest.importorskip("pyspark", reason="PySpark is installed by the README's test command")
# Two chains of local Spark runs, each on one test process, beside the standalone cluster's
# (tests/integration/spark/test_spark_cluster.py): one chain of all Spark tests was the longest
# path through a parallel run (about ten minutes), while the two cores were half idle.
pytestmark = [pytest.mark.integration, pytest.mark.slow]
SPARK_LOCAL_1 = pytest.mark.xdist_group("spark-local-1")
SPARK_LOCAL_2 = pytest.mark.xdist_group("spark-local-2")


@SPARK_LOCAL_1
def test_a_drain_beside_a_running_daemon_delivers_each_message_once_and_reports_failures(
    tmp_path: Path, new_pg_database: Any
) -> None:
    world = spark_world(tmp_path, new_pg_database)
    # CI drains 6,000 (the daemon joins after the first 1,000); scale is bench/'s
    # (bench/spark_benchmark.py), or here SFBRIDGE_TEST_SPARK_MESSAGES=200000.
    good = send_bulk(world["sender"], int(os.environ.get("SFBRIDGE_TEST_SPARK_MESSAGES", "6000")))
    send_bulk(world["sender"], 7, destination='"public"."MissingQueue"')
    log = (tmp_path / "drain.log").open("w")
    drain = subprocess.Popen(
        [sys.executable, "-m", "bridge", "-c", str(world["config"]), "spark", "drain",
         "--master", "local[2]", "--partitions", "4"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **SPARK_ENV},
    )  # fmt: skip
    try:
        # Spark takes a while to start; the daemon joins once the drain's tasks are moving.
        wait_until(lambda: pg_count(world["receiver"], RECEIVER) >= 1000, 120, "the drain")
        with DaemonProcess(world["config"], tmp_path / "daemon.log") as daemon:
            assert drain.wait(timeout=300) == 0, (tmp_path / "drain.log").read_text()
            # On a loaded machine the drain may finish before the daemon's first claim; these
            # come after it, so the daemon has a share of the work whatever the timing.
            good |= send_bulk(world["sender"], 5)
            wait_until(lambda: pg_count(world["sender"], FORWARD) == 0, 30, "the queue to empty")
            assert daemon.stop() == 0, daemon.output()
    finally:
        log.close()
        if drain.poll() is None:
            drain.kill()
    output = (tmp_path / "drain.log").read_text()
    assert "partitions done 4/4" in output and "everything reconciles" in output, output
    messages = received_ids(world)
    assert set(messages) == good and max(messages.values()) == 1
    assert pg_count(world["sender"], '"public"."error"') == 7
    # Both did part of the work: the daemon's workers write slots 0-1, drain tasks 1000+.
    slots = dict(pg_rows(world["sender"], "SELECT CASE WHEN slot >= 1000 THEN 'spark' ELSE "
                 "'daemon' END, sum(value) FROM sfbridge_counters WHERE counter = 'claimed' "
                 "GROUP BY 1"))  # fmt: skip
    assert slots.get("spark", 0) > 0 and slots.get("daemon", 0) > 0, slots

    # What the report makes of the seven failures: test_spark_cluster.py (one JVM start less).


def _descendants(pid: int) -> set[int]:
    """Every process below `pid`, from one pass over /proc (a pgrep per process took about a
    second on a loaded VM: time enough for the drain to finish before it was killed)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # ended meanwhile
            parents[int(entry.name)] = int(stat[1])
    found: set[int] = set()
    pending = [pid]
    while pending:
        parent = pending.pop()
        children = {child for child, of in parents.items() if of == parent} - found
        pending.extend(children)
        found |= children
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive.add(pid)
        except ProcessLookupError:
            pass
    return alive


@SPARK_LOCAL_2
def test_a_drain_killed_with_sigkill_and_run_again_leaves_every_message_in_one_place(
    tmp_path: Path, new_pg_database: Any
) -> None:
    world = spark_world(tmp_path, new_pg_database)
    ids = send_bulk(world["sender"], 6000)  # killed after 500: most are still queued
    log = (tmp_path / "drain.log").open("w")
    drain = subprocess.Popen(
        [sys.executable, "-m", "bridge", "-c", str(world["config"]), "spark", "drain",
         "--master", "local[2]", "--partitions", "4"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **SPARK_ENV},
    )  # fmt: skip
    try:
        # Killed once delivery is under way (a CI run on a slow VM saw all 6,000 delivered
        # between seeing 2,000 and the kill).
        wait_until(lambda: pg_count(world["receiver"], RECEIVER) >= 500, 120, "the drain")
        spawned = _descendants(drain.pid)
        drain.send_signal(signal.SIGKILL)
        drain.wait(timeout=10)
    finally:
        log.close()
    assert pg_count(world["sender"], FORWARD) > 0, "killed too late to prove anything"
    # The JVM and the Python workers go with the driver, and their transactions with them.
    wait_until(lambda: not _alive(spawned), 60, "the drain's processes to exit")

    def open_sessions() -> int:
        names = [world[role].split("Database=")[1].rstrip(";") for role in ("sender", "receiver")]
        with pg_connect(world["sender"]) as connection:
            rows = connection.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname IN (?, ?) "
                "AND pid <> pg_backend_pid()",
                *names,
            ).fetchall()
        return int(rows[0][0])

    wait_until(lambda: open_sessions() == 0, 30, "no sessions left open")

    again = run_spark(world["config"], "drain", "--master", "local[2]", "--partitions", "3")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "everything reconciles" in again.stdout
    assert pg_count(world["sender"], FORWARD) == 0
    assert pg_count(world["receiver"], RECEIVER) == len(ids)

    # Received as the endpoint would: each message once. (What reconcile finds after changes
    # by hand is test_spark_cluster.py's: one JVM start less.)
    messages = received_ids(world)
    assert set(messages) == ids and max(messages.values()) == 1


@SPARK_LOCAL_2
def test_spark_task_retries_after_lost_connections_deliver_each_message_once(
    tmp_path: Path, new_pg_database: Any, postgres: Any
) -> None:
    world = spark_world(tmp_path, new_pg_database)
    ids = send_bulk(world["sender"], 12000)
    sender_name = world["sender"].split("Database=")[1].rstrip(";")
    log = (tmp_path / "drain.log").open("w")
    # local[2,4]: like a cluster, a failed task is tried again (up to 4 times).
    drain = subprocess.Popen(
        [sys.executable, "-m", "bridge", "-c", str(world["config"]), "spark", "drain",
         "--master", "local[2,4]", "--partitions", "4"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **SPARK_ENV},
    )  # fmt: skip
    try:
        wait_until(lambda: pg_count(world["receiver"], RECEIVER) >= 1000, 120, "the drain")

        def tasks_connected() -> int:
            with postgres.admin() as admin:
                return int(
                    admin.execute(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE datname = ? AND pid <> pg_backend_pid()",
                        sender_name,
                    ).fetchone()[0]
                )

        for _ in range(3):  # the source database drops the tasks' connections, over again
            with postgres.admin() as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = ? AND pid <> pg_backend_pid()",
                    sender_name,
                )
            # Once tasks have connected again (or the drain is over), drop them again.
            wait_until(
                lambda: drain.poll() is not None or tasks_connected() > 0, 60, "tasks to reconnect"
            )
        assert drain.wait(timeout=300) == 0, (tmp_path / "drain.log").read_text()
    finally:
        log.close()
        if drain.poll() is None:
            drain.kill()
    output = (tmp_path / "drain.log").read_text()
    assert "everything reconciles" in output, output
    messages = received_ids(world)
    assert set(messages) == ids and max(messages.values()) == 1


@SPARK_LOCAL_1
def test_without_pyspark_the_spark_commands_say_what_to_install(
    tmp_path: Path, new_pg_database: Any
) -> None:
    world = spark_world(tmp_path, new_pg_database)
    blocker = tmp_path / "blocked"
    (blocker / "pyspark").mkdir(parents=True)
    (blocker / "pyspark" / "__init__.py").write_text("raise ImportError('blocked for a test')\n")
    env = {**SPARK_ENV, "PYTHONPATH": os.pathsep.join([str(blocker), *sys.path])}
    for command in (["drain"], ["reconcile"], ["report"]):
        result = sfbridge("-c", str(world["config"]), "spark", *command, env=env)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "pip install 'sfbridge[spark]'" in result.stderr


@SPARK_LOCAL_1
def test_a_driver_out_of_memory_ends_the_command_with_exit_4_and_says_so(
    tmp_path: Path, new_pg_database: Any
) -> None:
    world = spark_world(tmp_path, new_pg_database)
    with pg_connect(world["receiver"]) as connection:
        connection.execute(
            "WITH ids AS (SELECT gen_random_uuid()::text AS id FROM generate_series(1, 2000)), "
            f"queued AS (INSERT INTO {RECEIVER} (id, headers, body) SELECT gen_random_uuid(), "
            "json_build_object('NServiceBus.MessageId', id)::text, 'body'::bytea FROM ids) "
            "INSERT INTO sfbridge_ledger (message_id, destination, forwarded_at) "
            "SELECT id, ?, now() FROM ids",
            RECEIVER,
        )
        connection.commit()
    # A real OutOfMemoryError in the driver's JVM during the job: Spark's memory manager is
    # told it has 2 GB (spark.testing.memory) inside a 128 MB heap, so it does not spill in
    # time. Before, such an error in a scheduler thread left the command waiting for ever.
    result = run_spark(world["config"], "reconcile", "--master", "local[2]",
                       "--driver-memory", "128m", "--conf", "spark.testing.memory=2147483648",
                       timeout=180)  # fmt: skip
    assert result.returncode == 4, result.stdout + result.stderr
    assert "the Spark driver ran out of memory (spark.driver.memory 128m)" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr
