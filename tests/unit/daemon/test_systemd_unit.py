"""Specification of the shipped systemd unit (systemd/sfbridge.service)."""

from __future__ import annotations

import re

from support import REPO

UNIT = REPO / "systemd" / "sfbridge.service"
ENV_EXAMPLE = UNIT.with_name("sfbridge.env.example")
INSTALL_STEPS = UNIT.with_name("README.md")
# The virtualenv the wheel is installed into (docs/operating.md, "Installing on a host").
VIRTUALENV = "/opt/sfbridge"
INSTALLED_SCRIPT = f"{VIRTUALENV}/bin/sfbridge"


def _service_settings() -> dict[str, list[str]]:
    """Active (uncommented) `Key=value` lines of the [Service] section."""
    settings: dict[str, list[str]] = {}
    section = None
    for raw in UNIT.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def _commented_settings() -> set[str]:
    return {
        match.group(1)
        for match in re.finditer(r"^#([A-Z][A-Za-z]+)=", UNIT.read_text(encoding="utf-8"), re.M)
    }


def test_the_service_is_a_notify_service_that_only_the_main_process_may_notify() -> None:
    settings = _service_settings()
    assert settings["Type"] == ["notify"]
    assert settings["NotifyAccess"] == ["main"]


def test_exec_start_runs_the_installed_console_script_with_the_etc_config() -> None:
    (exec_start,) = _service_settings()["ExecStart"]
    assert exec_start == f"{INSTALLED_SCRIPT} -c /etc/sfbridge/sfbridge.yaml run"
    assert exec_start.startswith("/")


def test_the_install_steps_create_the_virtualenv_the_unit_runs_with_any_python_3() -> None:
    steps = INSTALL_STEPS.read_text(encoding="utf-8")
    assert f"python3 -m venv {VIRTUALENV} && {VIRTUALENV}/bin/pip install ./sfbridge-" in steps
    # A host's python3 decides the minor version; naming one (python3.11) breaks on the next.
    for path in sorted(UNIT.parent.iterdir()):
        found = re.findall(r"python3\.\d+", path.read_text(encoding="utf-8"))
        assert not found, f"{path.name} names a Python minor version: {found}"


def test_exec_start_comment_says_it_must_be_the_absolute_path_of_the_console_script() -> None:
    text = UNIT.read_text(encoding="utf-8")
    before = text[: text.index("ExecStart=")]
    comment = before[before.rindex("\n\n") :]
    assert "absolute path" in comment
    assert "bin/sfbridge" in comment


def test_reload_sends_sighup_to_the_main_process() -> None:
    assert _service_settings()["ExecReload"] == ["/bin/kill -HUP $MAINPID"]


def test_stop_sends_sigterm_and_allows_a_minute_to_drain_in_flight_batches() -> None:
    settings = _service_settings()
    assert settings["KillSignal"] == ["SIGTERM"]
    assert settings["TimeoutStopSec"] == ["60"]


def test_the_service_restarts_on_failure_after_five_seconds() -> None:
    settings = _service_settings()
    assert settings["Restart"] == ["on-failure"]
    assert settings["RestartSec"] == ["5"]


def test_the_watchdog_is_enabled_for_a_minute() -> None:
    assert _service_settings()["WatchdogSec"] == ["60"]


def test_the_service_runs_as_a_dedicated_user_and_group() -> None:
    settings = _service_settings()
    assert settings["User"] == ["sfbridge"]
    assert settings["Group"] == ["sfbridge"]


def test_secrets_come_from_an_optional_environment_file() -> None:
    assert _service_settings()["EnvironmentFile"] == ["-/etc/sfbridge/sfbridge.env"]


def test_hardening_is_on_by_default_each_setting_with_what_it_allows() -> None:
    settings = _service_settings()
    expected = {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "RestrictNamespaces": "yes",
        "LockPersonality": "yes",
        "MemoryDenyWriteExecute": "yes",
        "SystemCallArchitectures": "native",
        "SystemCallFilter": "@system-service",
        "CapabilityBoundingSet": "",
        "UMask": "0077",
    }
    assert {key: settings.get(key) for key in expected} == {
        key: [value] for key, value in expected.items()
    }
    assert not _commented_settings(), "hardening is on: no setting is left commented out"
    # Every setting of the block has a comment right above it (or above its group).
    text = UNIT.read_text(encoding="utf-8")
    block = text[text.index("NoNewPrivileges=") - 200 : text.index("[Install]")]
    for paragraph in block.split("\n\n")[1:]:
        if paragraph.strip():
            assert paragraph.lstrip().startswith("#"), paragraph


def test_the_state_directory_stays_writable_and_private_to_the_service_user() -> None:
    settings = _service_settings()
    assert settings["StateDirectory"] == ["sfbridge"]
    assert settings["StateDirectoryMode"] == ["0750"]
    assert settings["WorkingDirectory"] == ["/var/lib/sfbridge"]


def test_the_environment_example_names_the_documented_secrets() -> None:
    names = {
        line.partition("=")[0]
        for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    }
    assert {"RECEIVER_ODBC", "SENTRY_DSN"} <= names
