"""Specification of the sd_notify client (bridge.daemon.systemd)."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.daemon.systemd import notify, watchdog_interval


@pytest.fixture(autouse=True)
def _no_systemd_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def path_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket bound in tmp_path, with NOTIFY_SOCKET pointing at it."""
    path = tmp_path / "notify"
    if len(os.fsencode(path)) >= 108:  # sun_path limit
        pytest.skip(f"tmp_path too long for an AF_UNIX socket path: {path}")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(path))
        server.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        yield server


@pytest.fixture
def abstract_socket(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket in the abstract namespace, with NOTIFY_SOCKET=@name."""
    name = f"sfbridge-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("\0" + name)
        server.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        yield server


def test_notify_delivers_the_state_to_the_notify_socket(path_socket: socket.socket) -> None:
    assert notify("READY=1") is True
    assert path_socket.recv(4096) == b"READY=1"


def test_each_notification_is_one_datagram(path_socket: socket.socket) -> None:
    assert notify("READY=1")
    assert notify("WATCHDOG=1")
    assert path_socket.recv(4096) == b"READY=1"
    assert path_socket.recv(4096) == b"WATCHDOG=1"


def test_several_assignments_and_non_ascii_status_are_sent_as_utf8(
    path_socket: socket.socket,
) -> None:
    assert notify("READY=1\nSTATUS=forwarding 2 queue(s) → Zürich")
    assert path_socket.recv(4096) == "READY=1\nSTATUS=forwarding 2 queue(s) → Zürich".encode()


def test_an_at_sign_names_a_socket_in_the_abstract_namespace(
    abstract_socket: socket.socket,
) -> None:
    assert notify("READY=1") is True
    assert abstract_socket.recv(4096) == b"READY=1"


def test_without_notify_socket_notify_is_a_no_op_returning_false() -> None:
    assert notify("READY=1") is False


def test_an_empty_notify_socket_is_treated_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "")
    assert notify("READY=1") is False


def test_a_socket_that_does_not_exist_returns_false_instead_of_raising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert notify("READY=1") is False


def test_an_unbound_abstract_name_returns_false(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", f"@sfbridge-test-nobody-{uuid.uuid4().hex}")
    assert notify("READY=1") is False


# --------------------------------------------------------------------------------------------
# watchdog_interval
# --------------------------------------------------------------------------------------------


def test_without_watchdog_usec_there_is_no_watchdog() -> None:
    assert watchdog_interval() is None


def test_the_ping_interval_is_half_of_watchdog_usec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "60000000")
    assert watchdog_interval() == 30.0


def test_watchdog_pid_of_this_process_enables_the_watchdog(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "10000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert watchdog_interval() == 5.0


def test_watchdog_pid_of_another_process_means_the_watchdog_is_not_ours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "10000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert watchdog_interval() is None


def test_an_empty_watchdog_pid_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "10000000")
    monkeypatch.setenv("WATCHDOG_PID", "")
    assert watchdog_interval() == 5.0


def test_the_interval_is_never_shorter_than_half_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "1")
    assert watchdog_interval() == 0.5


@pytest.mark.parametrize("value", ["", "sixty", "1.5e6", "60s"])
def test_a_watchdog_usec_that_is_not_an_integer_disables_the_watchdog(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", value)
    assert watchdog_interval() is None
