"""Specification of the shipped systemd unit (systemd/sfbridge.service)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

UNIT = REPO / "systemd" / "sfbridge.service"
INSTALLED_SCRIPT = "/opt/sfbridge/bin/sfbridge"  # where docs/operating.md installs it


def _verifiable_copy(directory: Path) -> Path:
    """The unit with ExecStart pointing at an executable that exists on this machine."""
    text = UNIT.read_text(encoding="utf-8")
    assert f"ExecStart={INSTALLED_SCRIPT} " in text
    text = text.replace(f"ExecStart={INSTALLED_SCRIPT} ", f"ExecStart={sys.executable} ")
    copy = directory / "sfbridge.service"
    copy.write_text(text, encoding="utf-8")
    return copy


def _verify(unit: Path) -> subprocess.CompletedProcess[str]:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed; cannot verify the unit file")
    return subprocess.run(
        [analyze, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_unit_passes_systemd_analyze_verify_without_any_warning(tmp_path: Path) -> None:
    result = _verify(_verifiable_copy(tmp_path))
    assert result.returncode == 0, result.stderr
    # verify prints warnings (unknown keys, bad values) on stderr and still exits 0.
    assert result.stderr == ""


def test_systemd_analyze_security_rates_the_unit_ok_or_better(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed; cannot rate the unit")
    result = subprocess.run(
        [analyze, "security", "--offline=yes", str(_verifiable_copy(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d) (\w+)", result.stdout)
    assert match, result.stdout + result.stderr
    # 1.5 OK on systemd 252 (9.2 UNSAFE before); the issue asks for MEDIUM at most (< 7.0).
    assert float(match.group(1)) <= 4.9 and match.group(2) in {"PERFECT", "SAFE", "OK"}, (
        match.group(0)
    )
