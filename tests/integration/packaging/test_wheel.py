"""The install path for hosts (docs/operating.md, "Installing on a host"): the wheel built from
this checkout, installed into a fresh virtualenv as the documented command does, runs on its
own (no checkout on the path), brings the files of config/ and systemd/, and checks a real
configuration."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from support import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = REPO
# What the wheel is built from; a copy, so the build writes nothing into the checkout.
SOURCES = ["pyproject.toml", "README.md", "bridge", "config", "systemd"]
SHIPPED_FILES = [
    "config/sfbridge.example.yaml",
    "config/edge-sqlite.example.yaml",
    "config/prometheus-alerts.yaml",
    "config/grafana-dashboard.json",
    "systemd/sfbridge.service",
    "systemd/sfbridge.env.example",
    "systemd/README.md",
]


def run(*command: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run `command` in `cwd`, without this checkout on PYTHONPATH (or in the current folder,
    which `python -c` puts first on its path): the virtualenv's own code runs."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    return subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def build_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    built = run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", "dist", source, cwd=tmp_path
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("sfbridge-*.whl")
    return wheel


def test_the_wheel_installs_into_a_fresh_virtualenv_and_checks_a_configuration(
    tmp_path: Path, new_pg_database: Callable[[], str]
) -> None:
    wheel = build_wheel(tmp_path)
    venv = tmp_path / "opt-sfbridge"
    # As docs/operating.md says: python3 -m venv /opt/sfbridge && /opt/sfbridge/bin/pip install
    # ./sfbridge-*.whl (pip resolves the dependencies from the index, as on a host).
    created = run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    installed = run(venv / "bin" / "pip", "install", "-q", wheel, cwd=tmp_path)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    shown = run(venv / "bin" / "sfbridge", "--version", cwd=tmp_path)
    assert (shown.returncode, shown.stdout) == (0, f"sfbridge {version}\n"), shown.stderr
    imported = run(
        venv / "bin" / "python", "-c", "import bridge; print(bridge.__file__)", cwd=tmp_path
    )
    assert Path(imported.stdout.strip()).is_relative_to(venv), imported.stdout + imported.stderr

    for name in SHIPPED_FILES:
        shipped = venv / "share" / "sfbridge" / name
        assert shipped.is_file(), f"the wheel does not bring {name}"
        assert filecmp.cmp(shipped, ROOT / name, shallow=False), name

    config = tmp_path / "sfbridge.yaml"
    config.write_text(
        "databases:\n"
        f"  sender: {{dialect: postgresql, connection: '{new_pg_database()}'}}\n"
        f"  receiver: {{dialect: postgresql, connection: '{new_pg_database()}'}}\n"
        "forwarders:\n"
        "  - {name: orders, database: sender, queue: '\"Samples.Sender.Forward\"'}\n"
        "routes:\n"
        "  - {match: '*', database: receiver}\n",
        encoding="utf-8",
    )
    install = run(venv / "bin" / "sfbridge", "-c", config, "install", cwd=tmp_path)
    assert install.returncode == 0, install.stdout + install.stderr
    check = run(venv / "bin" / "sfbridge", "-c", config, "check", cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "no problems found" in check.stdout, check.stdout
