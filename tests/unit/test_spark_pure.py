"""The Spark edge's pure parts: splitting a queue into ranges, the report's rows and its HTML.
(The drain, reconcile and report themselves run on a real local Spark in
tests/integration/test_spark.py.)"""

from __future__ import annotations

import itertools
import json
from datetime import datetime

import pytest

from bridge.spark.drain import MAX_PARTITIONS, partitions_for
from bridge.spark.html import bar_chart, page
from bridge.spark.ranges import split_range
from bridge.spark.report import describe, render_html


@pytest.mark.parametrize(
    ("first", "last", "parts"), [(1, 100, 4), (1, 10, 3), (5, 5, 4), (1, 3, 8), (7, 2000003, 7)]
)
def test_ranges_cover_the_bounds_exactly_once_in_order(first: int, last: int, parts: int) -> None:
    ranges = split_range(first, last, parts)
    assert ranges[0][0] == first and ranges[-1][1] == last
    assert len(ranges) == min(parts, last - first + 1)
    for (_, end), (start, _) in itertools.pairwise(ranges):
        assert start == end + 1
    sizes = [end - start + 1 for start, end in ranges]
    assert max(sizes) - min(sizes) <= 1


def test_an_empty_queue_has_no_ranges() -> None:
    assert split_range(10, 9, 4) == []
    assert split_range(1, 10, 0) == []


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


def test_the_daemon_and_the_cli_never_import_pyspark() -> None:
    import subprocess
    import sys

    code = (
        "import sys, bridge.cli, bridge.daemon, bridge.forwarding; bridge.cli.build_parser(); "
        "print('pyspark' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


def test_without_java_the_session_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyspark")
    import shutil

    from bridge.spark import session

    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(session.SparkUnavailable, match="openjdk-17-jre-headless"):
        session.spark_session("local[1]", "test")
