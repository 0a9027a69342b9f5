"""The integration tier: real databases, the CLI and the daemon in subprocesses, Spark.

Every test here is marked `integration` by where it lives, so `-m integration` and
`-m "not integration"` select the same tests as the two directories."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in item.path.parts:
            item.add_marker(pytest.mark.integration)
