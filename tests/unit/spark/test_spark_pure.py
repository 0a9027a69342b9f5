"""The Spark edge's pure parts: splitting a queue into ranges, the report's rows and its HTML.
(The drain, reconcile and report themselves run on a real local Spark in
tests/integration/spark/test_spark.py.)"""

from __future__ import annotations

import itertools
import json
import sys
from datetime import datetime
from typing import Any

import pytest

from bridge.spark.drain import MAX_PARTITIONS, partitions_for
from bridge.spark.html import bar_chart, page
from bridge.spark.ranges import (
    MAX_PAGE_ROWS,
    MAX_TASKS,
    MIN_PAGE_ROWS,
    PAGE_BYTES,
    key_ranges,
    next_page_rows,
    rows_per_range,
    seq_ranges,
    task_count,
)
from bridge.spark.report import describe, render_html


@pytest.mark.parametrize(
    ("first", "last", "cuts"),
    [(1, 100, [25, 50, 75]), (5, 5, []), (1, 10, [10]), (7, 2000003, [9, 500, 1999999])],
)
def test_sequence_ranges_cover_the_bounds_exactly_once_in_order(
    first: int, last: int, cuts: list[int]
) -> None:
    ranges = seq_ranges(first, last, cuts)
    assert ranges[0][0] == first - 1 and ranges[-1][1] == last
    for after, up_to in ranges:
        assert after < up_to
    for (_, up_to), (after, _) in itertools.pairwise(ranges):
        assert after == up_to


def test_sequence_cuts_outside_the_bounds_or_repeated_change_nothing() -> None:
    # A cut read after rows were taken (below first) or added (above last) is ignored.
    assert seq_ranges(10, 20, [3, 15, 15, 25]) == [(9, 15), (15, 20)]
    assert seq_ranges(10, 9, [1]) == []


def test_ranges_follow_rows_not_values_in_a_sparse_queue() -> None:
    # 1..1000 drained long ago but for 10 rows, then a million rows: cut every 100,000 rows,
    # the first range holds the 10 old rows and the new ones up to the first cut.
    old = list(range(1, 11))
    new = list(range(5_000_001, 6_000_001))
    keys = old + new
    step = rows_per_range(len(keys), 10)
    cuts = keys[step - 1 :: step]
    ranges = seq_ranges(keys[0], keys[-1], cuts)
    sizes = [sum(1 for key in keys if after < key <= up_to) for after, up_to in ranges]
    assert sum(sizes) == len(keys) and max(sizes) - min(sizes) <= step


def test_key_ranges_keep_the_databases_order_and_skip_a_cut_at_the_last_key() -> None:
    # The database's collation may not be Python's: the cuts are taken in the order given.
    cuts = [("b", "q"), ("A", "q")]
    assert key_ranges(("", ""), ("Z", "q"), cuts) == [
        (("", ""), ("b", "q")),
        (("b", "q"), ("A", "q")),
        (("A", "q"), ("Z", "q")),
    ]
    assert key_ranges(("", ""), ("c", "d"), [("a", "d"), ("c", "d")]) == [
        (("", ""), ("a", "d")),
        (("a", "d"), ("c", "d")),
    ]


@pytest.mark.parametrize(
    ("rows", "parallelism", "tasks"),
    [(0, 8, 0), (1, 8, 1), (4_999, 8, 1), (20_000, 8, 4), (100_000, 8, 8), (3_000_000, 2, 30),
     (10**10, 2, MAX_TASKS)],
)  # fmt: skip
def test_reading_tasks_are_sized_by_rows_and_by_cores(
    rows: int, parallelism: int, tasks: int
) -> None:
    assert task_count(rows, parallelism) == tasks


def test_pages_hold_about_the_same_bytes_whatever_the_rows_weigh() -> None:
    assert next_page_rows(1000, 1000 * 500) == MAX_PAGE_ROWS
    assert next_page_rows(1000, 1000 * 5 * 1024 * 1024) == MIN_PAGE_ROWS
    assert next_page_rows(1000, 1000 * 16 * 1024) == PAGE_BYTES // (16 * 1024)


def test_partitions_default_to_sparks_parallelism_and_are_capped() -> None:
    assert partitions_for(None, 8) == 8
    assert partitions_for(3, 8) == 3
    assert partitions_for(1000, 8) == MAX_PARTITIONS
    assert partitions_for(0, 0) == 1


def test_an_error_queue_row_is_described_by_its_failure_headers() -> None:
    headers = {
        "$.sfbridge.failure-reason": "missing-queue",
        "$.store-and-forward.destination": "Receiver",
        "NServiceBus.ExceptionInfo.ExceptionType": "SFBridge.DeliveryFailed",
        "$.sfbridge.attempts": "100",
        "NServiceBus.TimeOfFailure": "2026-11-23 10:05:00:000000 Z",
    }
    row = describe(
        ("error", "f", json.dumps(headers), None, None, None, None), "2026-11-23T12:00:00"
    )
    assert row == (
        "error",
        "f",
        "missing-queue",
        "Receiver",
        "SFBridge.DeliveryFailed",
        100,
        "1 h to 1 d",
        "2026-11-23 10:00",
    )


def test_poison_and_retry_rows_are_described_too() -> None:
    poison = describe(("error", "f", "not json", None, None, None, None), "2026-11-23T12:00:00")
    assert poison[2] == "poison (moved as it was)" and poison[6] == "unknown"
    first = datetime(2026, 11, 23, 11, 59).isoformat()
    retry = describe(
        ("retry", "f", None, "Receiver", 3, first, "database 'r': cannot connect: refused"),
        "2026-11-23T12:00:00",
    )
    assert retry == ("retry", "f", "waiting-for-retry", "Receiver", "database 'r'", 3,
                     "under 1 h", "2026-11-23 11:00")  # fmt: skip


def test_charts_escape_what_they_show_and_say_when_there_is_nothing() -> None:
    svg = bar_chart("By reason", [("<script>", 3), ("ok", 1)])
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "<svg" in svg
    assert "nothing" in bar_chart("By reason", [])


def test_the_page_embeds_its_data_without_breaking_out_of_the_script_tag() -> None:
    text = page("t", ["<p>x</p>"], {"evil": "</script><script>alert(1)</script>"})
    assert text.count("</script>") == 1


def test_the_html_report_has_a_chart_per_breakdown() -> None:
    empty: list[list[object]] = []
    report = {
        "generated_at": "2026-11-23T12:00:00Z",
        "error_queue": {
            "messages": 2,
            "by_reason": [["unroutable", 2]],
            "by_destination": [["Receiver", 2]],
            "by_exception_type": empty,
            "by_age": empty,
            "by_attempts": empty,
            "by_hour": empty,
            "by_forwarder": empty,
        },
        "retry_storage": {
            "messages": 0,
            "by_destination": empty,
            "by_last_error": empty,
            "by_age": empty,
            "by_attempts": empty,
        },
        "problems": [],
    }
    text = render_html(report)
    assert text.count("<svg") == 2 and "unroutable" in text and "By destination" in text


def test_without_java_the_session_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyspark")
    import shutil

    from bridge.spark import session

    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(session.SparkUnavailable, match="openjdk-17-jre-headless"):
        session.spark_session(session.SparkSettings("local[1]"), "test")


# -- Spark settings and failures ----------------------------------------------------------

TASK_FAILED = """An error occurred while calling z:org.apache.spark.api.python.PythonRDD.\
collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 1.0 failed 4 \
times, most recent failure: Lost task 0.3 in stage 1.0 (TID 7) (127.0.0.1 executor 0): \
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/pyspark/worker.py", line 2001, in main
    process()
  File "/venv/lib/python3.11/site-packages/bridge/spark/partitions.py", line 175, in read_ranges
    connection = connections.get(table_range.database)
{exception}

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(\
PythonRunner.scala:621)
\tat org.apache.spark.api.python.PythonRunner$$anon$3.read(PythonRunner.scala:1012)
"""


def _explain(exception: str, **settings: Any) -> tuple[str, int]:
    from bridge.spark.guard import explain
    from bridge.spark.session import SparkSettings

    text = TASK_FAILED.format(exception=exception)
    return explain(text, SparkSettings(**settings), None, None)


def test_a_task_that_cannot_reach_a_database_is_told_as_the_database_error_with_exit_3() -> None:
    message, code = _explain(
        "bridge.drivers.base.ConnectionFailed: database 'receiver': cannot connect: "
        "connection refused (Server=db;Pwd=hunter2;)"
    )
    assert code == 3
    assert message == (
        "a Spark task failed: database 'receiver': cannot connect: connection refused "
        "(Server=db;Pwd=***;) (a task failed 4 time(s))"
    )


def test_executors_without_sfbridge_or_without_a_variable_are_told_what_to_set() -> None:
    message, code = _explain("ModuleNotFoundError: No module named 'bridge'")
    assert code == 2 and "cannot import sfbridge" in message and "--python-env" in message
    message, code = _explain(
        "bridge.config.problems.ConfigError: databases.receiver.connection: environment "
        "variable RECEIVER_PASSWORD is not set"
    )
    assert code == 2
    assert "RECEIVER_PASSWORD is not set" in message
    assert "spark.executorEnv.NAME=VALUE" in message


def test_executors_without_a_variable_of_a_database_are_told_to_set_it_for_them() -> None:
    message, code = _explain(
        "bridge.exceptions.UnsetVariables: databases.receiver.connection: RECEIVER_PASSWORD not set"
    )
    assert code == 2
    assert "lacks an environment variable: databases.receiver.connection: RECEIVER_PASSWORD" in (
        message
    )
    assert "spark.executorEnv.NAME=VALUE" in message
    message, code = _explain(
        "bridge.exceptions.UnsetVariable: database 'receiver': cannot connect: environment "
        "variable RECEIVER_PASSWORD is not set (databases.receiver.connection names it); "
        "sfbridge.service reads it from /etc/sfbridge/sfbridge.env (EnvironmentFile=)"
    )
    assert code == 2 and "spark.executorEnv.NAME=VALUE" in message
    assert "sfbridge.env" not in message  # the host's unit file is not the executors'


def test_an_executor_refuses_a_configuration_whose_database_variables_it_lacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bridge.exceptions import UnsetVariables
    from bridge.spark.shipped import ShippedConfig

    monkeypatch.delenv("EXECUTOR_TEST_PASSWORD", raising=False)
    text = (
        "databases:\n"
        "  sender: {dialect: postgresql, connection: 'Server=db1;Uid=bridge'}\n"
        "  receiver: {dialect: postgresql,\n"
        "             connection: 'Server=db2;Pwd=${EXECUTOR_TEST_PASSWORD}'}\n"
        "forwarders: [{name: sender, database: sender, queue: forward}]\n"
        "routes: [{match: '*', database: receiver}]\n"
    )
    with pytest.raises(UnsetVariables) as raised:
        ShippedConfig("/etc/sfbridge/sfbridge.yaml", text).load()
    assert raised.value.unset == (("databases.receiver.connection", ("EXECUTOR_TEST_PASSWORD",)),)


def test_a_driver_that_ran_out_of_memory_or_a_watchdogs_verdict_comes_first() -> None:
    from bridge.spark.guard import explain
    from bridge.spark.session import SparkSettings

    settings = SparkSettings(driver_memory="2g")
    message, code = explain("Answer from Java side is empty", settings, None, 3)
    assert code == 4
    assert message.startswith("the Spark driver ran out of memory (spark.driver.memory 2g)")
    assert explain("Job 3 cancelled", settings, "no Spark executor for 120 s", None) == (
        "no Spark executor for 120 s",
        4,
    )


def test_the_session_ends_its_jvm_at_the_first_out_of_memory_and_keeps_the_users_settings() -> None:
    from bridge.spark.session import EXIT_ON_OOM, SparkSettings, session_conf

    conf = session_conf(
        SparkSettings(
            "spark://m:7077",
            conf=(("spark.driver.extraJavaOptions", "-Dx=1"), ("spark.speculation", "true")),
            driver_memory="3g",
        ),
        {},
    )
    assert conf["spark.driver.extraJavaOptions"] == f"-Dx=1 {EXIT_ON_OOM}"
    assert conf["spark.driver.memory"] == "3g"
    assert conf["spark.speculation"] == "true"  # the user's word is final
    assert conf["spark.pyspark.python"] == sys.executable


def test_the_executors_python_comes_from_a_packed_environment_or_the_users_settings() -> None:
    from bridge.spark.session import SparkSettings, executor_python, session_conf

    packed = SparkSettings(
        "yarn", conf=(("spark.archives", "other.zip#other"),), python_env="/x/env.tar.gz"
    )
    conf = session_conf(packed, {})
    assert conf["spark.archives"] == "other.zip#other,/x/env.tar.gz#sfbridge-env"
    assert conf["spark.pyspark.python"] == "./sfbridge-env/bin/python"
    given = SparkSettings("yarn", conf=(("spark.pyspark.python", "/opt/py/bin/python"),))
    assert executor_python(given, {"PYSPARK_PYTHON": "/usr/bin/python3"}) == "/opt/py/bin/python"
    assert executor_python(SparkSettings("yarn"), {"PYSPARK_PYTHON": "/p"}) == "/p"


def test_conf_items_are_key_value_pairs() -> None:
    from bridge.spark.session import parse_conf

    assert parse_conf(["a.b=c=d", "e="]) == (("a.b", "c=d"), ("e", ""))
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_conf(["spark.executor.memory"])
