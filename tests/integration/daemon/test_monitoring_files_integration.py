"""The Prometheus alert rules and the Grafana dashboard in config/ load and do what they say.

promtool comes from Debian's prometheus package (`./dev.sh test` puts it in .venv/bin). The
names these files use are held against a live scrape in tests/integration/daemon/test_metrics.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
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


def test_alert_rules_are_valid_prometheus_rules() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", "prometheus-alerts.yaml"],
        cwd=CONFIG,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rules = yaml.safe_load((CONFIG / "prometheus-alerts.yaml").read_text())
    count = sum(len(group["rules"]) for group in rules["groups"])
    assert f"SUCCESS: {count} rules found" in result.stdout


def test_each_alert_fires_when_it_should_and_not_before() -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", "prometheus-alerts.test.yaml"],
        cwd=CONFIG,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
