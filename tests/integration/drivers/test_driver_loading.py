"""`load_drivers`: the daemon imports the drivers its databases use before its threads
start, so that their first connections do not each wait for one import; a driver that
cannot be imported is said once and left to fail on its own databases' connections.

Each case runs in a fresh interpreter: this one has imported every driver long ago.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import write_config

SCRIPT = """
import logging, sys
{before}
from bridge.config import load_config
from bridge.connections import load_drivers
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
config, _ = load_config(sys.argv[1])
print("before:", sorted(m for m in ("psycopg", "pyodbc") if sys.modules.get(m) is not None))
load_drivers(config.databases{quiet})
print("after:", sorted(m for m in ("psycopg", "pyodbc") if sys.modules.get(m) is not None))
"""


def run(config: Path, before: str = "", quiet: bool = False) -> subprocess.CompletedProcess[str]:
    script = SCRIPT.format(before=before, quiet=", quiet=True" if quiet else "")
    return subprocess.run(
        [sys.executable, "-c", script, str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def config_with(tmp_path: Path, *drivers: str) -> Path:
    """PostgreSQL databases opened with these drivers (never connected to), and a SQLite
    one, which has no driver to load."""
    databases: dict[str, dict[str, str]] = {
        f"pg{index}": {
            "dialect": "postgresql",
            "connection": f"Server=127.0.0.1;Port=5432;Database=x{index};Uid=postgres;",
            "driver": driver,
        }
        for index, driver in enumerate(drivers)
    }
    databases["local"] = {"dialect": "sqlite", "path": "local.db"}
    return write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": databases,
            "forwarders": [{"name": "f", "database": "local", "queue": "forward"}],
            "routes": [{"match": "*", "database": "pg0"}],
        },
    )


def test_the_drivers_the_databases_use_are_imported(tmp_path: Path) -> None:
    result = run(config_with(tmp_path, "psycopg"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["before: []", "after: ['psycopg']"]


def test_a_driver_that_cannot_be_imported_is_said_once_and_not_raised(tmp_path: Path) -> None:
    # `None` in sys.modules makes `import pyodbc` raise ImportError, as a missing libodbc does.
    result = run(config_with(tmp_path, "odbc", "odbc", "psycopg"), "sys.modules['pyodbc'] = None")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "after: ['psycopg']"
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("ERROR database 'pg0': its driver cannot be loaded: ")


def test_a_worker_process_leaves_saying_so_to_its_daemon(tmp_path: Path) -> None:
    result = run(
        config_with(tmp_path, "odbc", "psycopg"), "sys.modules['pyodbc'] = None", quiet=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "after: ['psycopg']"
    assert "ERROR" not in result.stderr, result.stderr
