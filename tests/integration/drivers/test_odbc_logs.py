"""psqlODBC's own log files: off per connection, and `check` says where to stop them for good.

Debian's odbcinst.ini turns `CommLog` on for the PostgreSQL driver. The driver reads that when
it loads, before any connection string, and leaves a file per process in /tmp; the control
case below shows it happening, so the `check` warning is about something real.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import write_config

pytestmark = pytest.mark.integration


def _odbc_folder(tmp_path: Path, commlog: str) -> Path:
    candidates = [*glob.glob("/usr/lib/*/odbc/psqlodbcw.so"), "/usr/lib/odbc/psqlodbcw.so"]
    driver = next((p for p in candidates if os.path.exists(p)), None)
    if driver is None:
        pytest.skip("psqlODBC is not installed where Debian puts it")
    folder = tmp_path / f"odbc-{commlog}"
    folder.mkdir()
    (folder / "odbcinst.ini").write_text(
        f"[PostgreSQL Unicode]\nDriver={driver}\nCommLog={commlog}\nDebug=0\n"
    )
    (folder / "odbc.ini").write_text("")
    return folder


def _run(args: list[str], folder: Path) -> tuple[int, int, str]:
    env = {**os.environ, "ODBCSYSINI": str(folder)}
    process = subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    output, _ = process.communicate(timeout=60)
    for path in glob.glob(f"/tmp/psqlodbc_*{process.pid}.log"):
        os.unlink(path)
        output += f"\n[left {path}]"
    return process.pid, process.returncode, output


def test_check_warns_when_the_driver_registry_turns_its_log_on(
    tmp_path: Path, new_pg_database: Any
) -> None:
    database = new_pg_database()
    config = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": database, "driver": "odbc"}
            },
            "forwarders": [{"name": "f", "database": "sender", "queue": "forward"}],
            "routes": [{"match": "*", "database": "sender"}],
        },
    )
    noisy, quiet = _odbc_folder(tmp_path, "1"), _odbc_folder(tmp_path, "0")
    control = f"import pyodbc; pyodbc.connect({database!r} + 'Protocol=7.4-0;').close()"
    assert "[left /tmp/psqlodbc_" in _run([sys.executable, "-c", control], noisy)[2]

    _, code, output = _run([sys.executable, "-m", "bridge", "-c", str(config), "check"], noisy)
    assert code == 0, output
    assert (
        f"WARNING  ODBC driver 'PostgreSQL Unicode': {noisy}/odbcinst.ini sets CommLog=1: "
        "every process that connects" in output
    )
    assert "set CommLog=0 in [PostgreSQL Unicode] there" in output

    _, code, output = _run([sys.executable, "-m", "bridge", "-c", str(config), "check"], quiet)
    # (The bridge's tables are not installed: check's one warning is about those.)
    assert code == 0 and "WARNING  ODBC" not in output and "[left" not in output, output


def test_with_psycopg_the_odbc_registry_is_not_loaded_and_check_says_nothing_of_it(
    tmp_path: Path, new_pg_database: Any
) -> None:
    database = new_pg_database()  # an ODBC-style string, naming psqlODBC: psycopg reads it
    config = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {"sender": {"dialect": "postgresql", "connection": database}},
            "forwarders": [{"name": "f", "database": "sender", "queue": "forward"}],
            "routes": [{"match": "*", "database": "sender"}],
        },
    )
    noisy = _odbc_folder(tmp_path, "1")
    _, code, output = _run([sys.executable, "-m", "bridge", "-c", str(config), "check"], noisy)
    assert code == 0, output
    assert "WARNING  ODBC" not in output and "[left" not in output, output
