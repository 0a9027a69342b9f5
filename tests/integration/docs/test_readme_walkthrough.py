"""The README's PostgreSQL to PostgreSQL walkthrough works as written: its shell blocks, fed
line by line to bash as a person pastes them, forward both messages end to end and clean up
after themselves. Only the server and the database names are the test's own."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from support import REPO

pytestmark = pytest.mark.integration

README = REPO / "README.md"
# The lines of the walkthrough that name the server and the databases, as the README has them.
SERVER_LINE = "export PGHOST=127.0.0.1 PGPORT=5432 PGUSER=postgres"
DATABASES_LINE = "SENDER_DB=sfbridge_sender RECEIVER_DB=sfbridge_receiver"


def walkthrough_script() -> str:
    """The ```sh blocks of the README's "Walkthrough" section, in order, as one script."""
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## Walkthrough")
    section = text[start : text.index("\n## ", start + 1)]
    blocks = re.findall(r"^```sh\n(.*?)^```$", section, re.S | re.M)
    assert len(blocks) >= 5, "the walkthrough's shell blocks are not where the test looks"
    return "".join(blocks)


def _setting(prefix: str, key: str, default: str) -> str:
    found = re.search(rf"(?:^|;)\s*{key}\s*=\s*([^;]*)", prefix, re.I)
    return found.group(1).strip() if found else default


def test_the_readme_walkthrough_forwards_both_messages_and_cleans_up(
    tmp_path: Path, postgres: Any
) -> None:
    if shutil.which("psql") is None:
        pytest.fail("psql is not installed (apt-get install postgresql-client; ./dev.sh does)")
    host = _setting(postgres.prefix, "Server", "127.0.0.1")
    port = _setting(postgres.prefix, "Port", "5432")
    user = _setting(postgres.prefix, "Uid", "postgres")
    suffix = uuid.uuid4().hex[:10]
    sender, receiver = f"sfbtest_walk_s_{suffix}", f"sfbtest_walk_r_{suffix}"
    script = walkthrough_script()
    assert SERVER_LINE in script and DATABASES_LINE in script
    script = script.replace(SERVER_LINE, f"export PGHOST={host} PGPORT={port} PGUSER={user}")
    script = script.replace(DATABASES_LINE, f"SENDER_DB={sender} RECEIVER_DB={receiver}")
    # The venv's sfbridge first on PATH, as the walkthrough asks of its reader.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    try:
        # `bash -e` reading the script from stdin runs it a line at a time, as a paste does,
        # and stops at the first command that fails.
        result = subprocess.run(
            ["bash", "-e"],
            input=script,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, output
        assert "no problems found" in result.stdout, output
        # psql's table of the Receiver's queue, and status's counters.
        assert re.search(r"^ hello from sfbridge send \| [0-9a-f-]{36}$", result.stdout, re.M), (
            output
        )
        assert re.search(
            r"^ hello from psql +\| 5d3c2f1e-0a4b-4c6d-8e9f-102132435465$", result.stdout, re.M
        ), output
        assert "(2 rows)" in result.stdout, output
        assert "since install      claimed 2, delivered 2" in result.stdout, output
        with postgres.admin() as admin:
            left = admin.execute(
                "SELECT datname FROM pg_database WHERE datname IN (?, ?)", sender, receiver
            ).fetchall()
        assert not left, f"the walkthrough left databases behind: {left}"
    finally:
        with postgres.admin() as admin:
            for name in (sender, receiver):
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
