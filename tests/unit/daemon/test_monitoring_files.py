"""The Prometheus alert rules and the Grafana dashboard in config/ load and do what they say.

promtool comes from Debian's prometheus package (`./dev.sh test` puts it in .venv/bin). The
names these files use are held against a live scrape in tests/integration/daemon/test_metrics.py.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from support import REPO

CONFIG = REPO / "config"


def promtool() -> str:
    found = shutil.which("promtool") or shutil.which(
        "promtool", path=str(Path(sys.executable).parent)
    )
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: ./dev.sh test installs it into .venv/bin")
        pytest.skip("promtool not installed (./dev.sh test installs it)")
    return found


def test_every_alert_has_a_severity_and_says_what_to_do() -> None:
    rules = yaml.safe_load((CONFIG / "prometheus-alerts.yaml").read_text())
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert {alert["alert"] for alert in alerts} >= {
        "SfbridgeDestinationDown",
        "SfbridgeErrorQueueGrowing",
        "SfbridgeOldestMessageTooOld",
    }
    for alert in alerts:
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), alert["alert"]
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
    tested = yaml.safe_load((CONFIG / "prometheus-alerts.test.yaml").read_text())
    fired = {
        case["alertname"]
        for test in tested["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert {
        "SfbridgeDestinationDown",
        "SfbridgeErrorQueueGrowing",
        "SfbridgeBatchFailures",
        "SfbridgeWorkerProcessRestarting",
        "SfbridgeLoginRefused",
    } <= fired


def test_every_alert_has_a_promtool_case_that_fires_it_and_one_that_does_not() -> None:
    rules = yaml.safe_load((CONFIG / "prometheus-alerts.yaml").read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    tested = yaml.safe_load((CONFIG / "prometheus-alerts.test.yaml").read_text())
    cases = [case for test in tested["tests"] for case in test["alert_rule_test"]]
    fired = {case["alertname"] for case in cases if case["exp_alerts"]}
    quiet = {case["alertname"] for case in cases if not case["exp_alerts"]}
    assert alerts - fired == set(), "alerts without a promtool case where they fire"
    assert alerts - quiet == set(), "alerts without a promtool case where they stay quiet"


def test_the_dashboard_shows_failing_forwarders_failed_batches_and_other_failures() -> None:
    dashboard = json.loads((CONFIG / "grafana-dashboard.json").read_text())
    queried = " ".join(
        target["expr"] for panel in dashboard["panels"] for target in panel["targets"]
    )
    for metric in (
        "sfbridge_forwarder_failing",
        "sfbridge_batch_failures_total",
        "sfbridge_error_queue_other_messages",
        "sfbridge_poison_messages_total",
    ):
        assert metric in queried, metric


def test_the_dashboard_is_grafana_json_with_a_query_in_every_panel() -> None:
    dashboard = json.loads((CONFIG / "grafana-dashboard.json").read_text())
    assert dashboard["uid"] == "sfbridge"
    panels = dashboard["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert "sfbridge_" in target["expr"], panel["title"]
            assert target["datasource"]["uid"].strip("${}") in variables


def test_the_dashboard_picks_instances_and_shows_readiness() -> None:
    dashboard = json.loads((CONFIG / "grafana-dashboard.json").read_text())
    [instance] = [v for v in dashboard["templating"]["list"] if v["name"] == "instance"]
    assert instance["query"]["query"] == "label_values(sfbridge_build_info, instance)"
    assert instance["multi"] and instance["includeAll"]
    expressions = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    for expression in expressions:
        # Every series the dashboard reads is of the instances picked, none of the others.
        names = expression.count("sfbridge_")
        assert expression.count('{instance=~"$instance"') == names, expression
    assert any(expression.startswith("sfbridge_ready{") for expression in expressions)
