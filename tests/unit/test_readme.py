"""The README and the docs stay true: the configuration reference is the schema's, the
quick-start commands exist, and every page the README points to is there."""

from __future__ import annotations

import os
import re

from support import REPO

from bridge.config.reference import with_current_reference

ROOT = REPO
README = (ROOT / "README.md").read_text(encoding="utf-8")
CONFIGURATION_PAGE = ROOT / "docs" / "configuration.md"


def test_the_configuration_reference_is_generated_from_the_current_schema() -> None:
    page = CONFIGURATION_PAGE.read_text(encoding="utf-8")
    assert page == with_current_reference(page), (
        "docs/configuration.md's reference is stale: run "
        "`python -m bridge.config.reference --write docs/configuration.md`"
    )


def test_quick_start_commands_exist_and_ci_runs_the_readme_test_command() -> None:
    assert "./dev.sh demo" in README and "./dev.sh test" in README
    assert os.access(ROOT / "dev.sh", os.X_OK)
    assert "./dev.sh test" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_stays_a_landing_page_whose_links_lead_somewhere() -> None:
    assert len(README.splitlines()) < 300
    targets = re.findall(r"\]\(((?!https?:)[^)#]+)(?:#[^)]*)?\)", README)
    assert "docs/operating.md" in targets and "docs/troubleshooting.md" in targets
    missing = [target for target in targets if not (ROOT / target).is_file()]
    assert not missing, f"the README links to files that do not exist: {missing}"


# How the daemon declares a metric (bridge/daemon/metrics.py), and the suffix Prometheus adds.
DECLARED_METRIC = re.compile(
    r'\b(Counter|Gauge|Histogram|Info|GaugeMetricFamily)\(\s*"(sfbridge_\w+)"'
)
EXPOSED_SUFFIX = {"Counter": "_total", "Info": "_info"}


def test_the_operating_page_describes_every_metric_and_every_alert() -> None:
    page = (ROOT / "docs" / "operating.md").read_text(encoding="utf-8")
    declared = DECLARED_METRIC.findall((ROOT / "bridge" / "daemon" / "metrics.py").read_text())
    assert len(declared) >= 15, "the metrics are no longer declared the way this test reads them"
    exposed = [name + EXPOSED_SUFFIX.get(kind, "") for kind, name in declared]
    undocumented = [
        name for name in exposed if f"| `{name}`" not in page and f"`{name}` |" not in page
    ]
    alerts = re.findall(
        r"^\s*- alert: (\w+)$", (ROOT / "config" / "prometheus-alerts.yaml").read_text(), re.M
    )
    assert len(alerts) >= 10
    table = page[page.index("### Alerts") :]
    undocumented += [alert for alert in alerts if f"| `{alert}` |" not in table]
    assert not undocumented, f"docs/operating.md does not describe: {undocumented}"
