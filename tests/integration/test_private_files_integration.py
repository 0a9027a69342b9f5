"""Files the bridge creates are readable by its user only (0600), whatever the umask: SQLite
databases with their WAL files (`sfbridge install`, a real subprocess), Spark reports, and the
helpers they are written with."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

from support import write_config


def mode(path: Path | str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_install_creates_sqlite_files_0600_under_a_permissive_umask(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "edge": {"dialect": "sqlite", "path": str(tmp_path / "edge.db")},
                "central": {"dialect": "sqlite", "path": str(tmp_path / "central.db")},
            },
            "forwarders": [{"name": "edge", "database": "edge", "queue": "Forward"}],
            "routes": [{"match": "*", "database": "central"}],
        },
    )
    result = subprocess.run(
        [
            "sh",
            "-c",
            'umask 022 && exec "$0" -m bridge -c "$1" install',
            sys.executable,
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert mode(tmp_path / "edge.db") == 0o600
    assert mode(tmp_path / "central.db") == 0o600
    # A writer opens the WAL: SQLite gives it (and -shm) the database file's mode.
    with sqlite3.connect(tmp_path / "edge.db") as connection:
        connection.execute(
            'INSERT INTO "Forward" (Id, Recoverable, Headers) VALUES (?, 1, ?)', ("x", "{}")
        )
        wal = tmp_path / "edge.db-wal"
        assert wal.exists() and mode(wal) == 0o600
        assert mode(tmp_path / "edge.db-shm") == 0o600
