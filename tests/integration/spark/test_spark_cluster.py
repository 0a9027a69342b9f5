"""`sfbridge spark ...` against a real Spark standalone cluster (a master and a worker started
from the PySpark package, on loopback), with nothing set but what docs/spark.md says: the master's
URL, and for the packed environment `--python-env`. The worker is SIGKILLed mid-drain, as a lost
machine would be."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from support import (
    FORWARD,
    RECEIVER,
    REPO,
    SPARK_ENV,
    pg_connect,
    pg_count,
    pg_rows,
    received_ids,
    run_spark,
    send_bulk,
    spark_world,
    wait_until,
)

pytest.importorskip("pyspark", reason="PySpark is installed by the README's test command")
# One test process runs this module, so its standalone cluster (a module fixture) starts once.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("spark-cluster")]


def queued_ids(world: dict[str, Any]) -> list[str]:
    """The message ids in the receiver's queue, read without receiving them."""
    rows = pg_rows(world["receiver"], f"SELECT headers FROM {RECEIVER}")
    return [json.loads(headers)["NServiceBus.MessageId"] for (headers,) in rows]


def packed_environment(tmp_path: Path) -> tuple[Path, Path]:
    """(archive, marker): an environment whose `bin/python` notes each start in `marker` and
    runs this interpreter, as a venv-pack archive of this environment would."""
    marker = tmp_path / "python-env-started"
    python = tmp_path / "env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$$" >> {marker}\nexec {sys.executable} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    archive = tmp_path / "sfbridge-env.tar.gz"
    with tarfile.open(archive, "w:gz") as packed:
        packed.add(python.parent, arcname="bin")
    return archive, marker


def test_drain_reconcile_and_report_on_a_standalone_cluster(
    tmp_path: Path, new_pg_database: Any, spark_cluster: Any
) -> None:
    world = spark_world(tmp_path, new_pg_database)
    ids = send_bulk(world["sender"], 3000)
    send_bulk(world["sender"], 5, destination='"public"."MissingQueue"')
    master = ("--master", spark_cluster.url)

    drained = run_spark(world["config"], "drain", *master)
    assert drained.returncode == 0, drained.stdout + drained.stderr
    assert "everything reconciles" in drained.stdout
    assert "moved 3,005 of 3,005" in drained.stdout, drained.stdout
    assert sorted(queued_ids(world)) == sorted(ids)
    assert pg_count(world["sender"], '"public"."error"') == 5

    # By hand: a message taken out of the queue, a ledger entry deleted, a message copied.
    with pg_connect(world["receiver"]) as connection:
        [(gone,)] = connection.execute(
            f"DELETE FROM {RECEIVER} WHERE seq = (SELECT min(seq) FROM {RECEIVER}) "
            "RETURNING headers"
        ).fetchall()
        [(unrecorded,)] = connection.execute(
            "DELETE FROM sfbridge_ledger WHERE message_id = (SELECT max(message_id) FROM "
            "sfbridge_ledger) RETURNING message_id"
        ).fetchall()
        [(copied,)] = connection.execute(
            f"INSERT INTO {RECEIVER} (id, headers, body) SELECT gen_random_uuid(), headers, body "
            f"FROM {RECEIVER} WHERE seq = (SELECT max(seq) FROM {RECEIVER}) RETURNING headers"
        ).fetchall()
        connection.commit()
    gone_id = json.loads(gone)["NServiceBus.MessageId"]
    copied_id = json.loads(copied)["NServiceBus.MessageId"]
    checked = run_spark(world["config"], "reconcile", *master)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert f"recorded as delivered but not in the queue: {gone_id}" in checked.stdout
    assert f"in the queue without a ledger entry: {unrecorded}" in checked.stdout
    assert f"recorded once but in the queue more than once: {copied_id}" in checked.stdout

    archive, marker = packed_environment(tmp_path)
    report = run_spark(world["config"], "report", *master, "--python-env", str(archive),
                       "--report", str(tmp_path / "failures"))  # fmt: skip
    assert report.returncode == 0, report.stdout + report.stderr
    data = json.loads((tmp_path / "failures.json").read_text())
    assert data["error_queue"]["messages"] == 5
    assert data["error_queue"]["by_reason"] == [["missing-queue", 5]]
    assert data["error_queue"]["by_destination"] == [['"public"."MissingQueue"', 5]]
    page = (tmp_path / "failures.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") >= 3
    assert "missing-queue" in page and "MissingQueue" in page
    assert "PWD" not in page and "Uid=" not in page
    assert marker.exists(), "the executors did not run the packed environment's python"


def test_executors_given_a_python_that_is_not_there_are_told_so(
    tmp_path: Path, new_pg_database: Any, spark_cluster: Any
) -> None:
    world = spark_world(tmp_path, new_pg_database)
    result = run_spark(world["config"], "report", "--master", spark_cluster.url,
                       "--conf", "spark.pyspark.python=/nowhere/bin/python")  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "the executors cannot run the Python '/nowhere/bin/python'" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


# A cluster of its own, killed: a chain of its own beside the shared cluster's.
@pytest.mark.xdist_group("spark-cluster-lost")
def test_a_drain_that_loses_its_cluster_ends_with_exit_4_and_a_rerun_finishes_it(
    tmp_path: Path, new_pg_database: Any, spark_standalone: Any
) -> None:
    world = spark_world(tmp_path, new_pg_database)
    ids = send_bulk(world["sender"], 8000)  # the worker is killed after 1,000
    log = tmp_path / "drain.log"
    with log.open("w") as output:
        drain = subprocess.Popen(
            [sys.executable, "-m", "bridge", "-c", str(world["config"]), "spark", "drain",
             "--master", spark_standalone.url, "--wait-for-executors", "15s"],
            stdout=output, stderr=subprocess.STDOUT, env={**os.environ, **SPARK_ENV},
        )  # fmt: skip
        # The wait covers the executors' start too, which on a loaded two-core machine took
        # more than 5 s: a shorter one cancelled the drain before it began (CI, 2026-11-28).

        def delivering() -> bool:
            assert drain.poll() is None, f"the drain ended early:\n{log.read_text()}"
            return pg_count(world["receiver"], RECEIVER) >= 1000

        try:
            wait_until(delivering, 120, "the drain")
            spark_standalone.kill_worker()
            # The watchdog gives up 15 s after the last executor went; a hang fails here.
            assert drain.wait(timeout=120) == 4, log.read_text()
        finally:
            if drain.poll() is None:
                drain.kill()
    assert "no Spark executor for" in log.read_text(), log.read_text()
    assert "Traceback" not in log.read_text()
    assert pg_count(world["sender"], FORWARD) > 0, "the worker was killed too late"

    again = run_spark(world["config"], "drain", "--master", "local[2]")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "everything reconciles" in again.stdout
    messages = received_ids(world)
    assert set(messages) == ids and max(messages.values()) == 1


def test_spark_submit_in_client_mode_finds_the_yaml_given_with_files(
    tmp_path: Path, new_pg_database: Any, spark_cluster: Any
) -> None:
    import pyspark

    world = spark_world(tmp_path, new_pg_database)
    # Three failed messages, put straight into the error queue: a drain to fail them there
    # first would be one more Spark application, with nothing to prove here.
    send_bulk(world["sender"], 3, destination='"public"."MissingQueue"', queue='"public"."error"')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    main = REPO / "bridge" / "__main__.py"
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    # As docs/spark.md writes it, but for the packed environment: this interpreter on both sides.
    result = subprocess.run(
        [str(submit), "--master", spark_cluster.url, "--deploy-mode", "client",
         "--conf", f"spark.pyspark.python={sys.executable}",
         "--conf", f"spark.pyspark.driver.python={sys.executable}",
         "--driver-java-options", "-XX:+ExitOnOutOfMemoryError",
         "--files", str(world["config"]), str(main),
         "-c", "sfbridge.yaml", "spark", "report", "--master", spark_cluster.url],
        cwd=elsewhere, capture_output=True, text=True, timeout=300,
        env={**os.environ, **SPARK_ENV},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "error queues: 3 message(s)" in result.stdout
    assert (elsewhere / "sfbridge-report.html").exists()
