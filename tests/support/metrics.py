"""Reading a daemon's /metrics page as Prometheus would (prometheus-client's own parser)."""

from __future__ import annotations

import socket
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# A password the metrics tests put in connection strings: no page may show it.
SECRET = "metrics-must-not-show-this"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample on the page, keyed by (name, sorted labels); checks the page's text too."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    assert SECRET not in text
    samples = {}
    for family in text_string_to_metric_families(text):
        assert family.name.startswith("sfbridge_"), family.name
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))
