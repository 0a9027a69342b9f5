"""The unit tier: no database server, no subprocess, no JVM, so it runs in under a minute
(`./dev.sh test --fast`). A test here that starts a process or asks for a database server's
fixture fails at once, naming what it tried: such a test belongs in tests/integration."""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from typing import Any

import pytest


def _refused(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a unit test may not start {what}: move it to tests/integration")

    return refuse


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess.Popen, "__init__", _refused("a subprocess"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refused("a process"))
    monkeypatch.setattr(os, "fork", _refused("a process"))
    for name in ("posix_spawn", "posix_spawnp", "forkpty", "system"):
        monkeypatch.setattr(os, name, _refused("a process"))


@pytest.fixture(scope="session")
def postgres() -> None:
    raise AssertionError("a unit test may not use PostgreSQL: move it to tests/integration")


@pytest.fixture(scope="session")
def sqlserver_server() -> None:
    raise AssertionError("a unit test may not use SQL Server: move it to tests/integration")
