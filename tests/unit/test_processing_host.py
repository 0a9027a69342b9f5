"""Specification of who a failed message names as its processor (bridge.processing_host)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest

from bridge import processing_host as module
from bridge.processing_host import ProcessingHost, host_id_for, machine_name, processing_host


@pytest.fixture
def host_named(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    def name(host: str) -> None:
        machine_name.cache_clear()
        monkeypatch.setattr(module.socket, "gethostname", lambda: host)

    yield name
    machine_name.cache_clear()


@pytest.mark.parametrize(
    ("host", "machine"),
    [("bridge1", "bridge1"), ("bridge1.example.com", "bridge1"), ("", "localhost")],
)
def test_the_machine_is_the_host_name_up_to_its_first_dot(
    host_named: Callable[[str], None], host: str, machine: str
) -> None:
    host_named(host)
    assert machine_name() == machine


def test_the_host_id_is_a_guid_without_dashes_derived_from_the_machine_alone() -> None:
    host_id = host_id_for("bridge1")
    assert re.fullmatch(r"[0-9a-f]{32}", host_id)
    assert host_id_for("bridge1") == host_id  # the same across restarts
    assert host_id_for("bridge2") != host_id
    # Pinned: a new version must not make ServiceControl see a new host.
    assert host_id == "dc7e17f793e4560d839e8bd8b4f59c68"


def test_the_processing_host_names_the_forwarder_and_this_machine(
    host_named: Callable[[str], None],
) -> None:
    host_named("edge-7.lan")
    assert processing_host("orders") == ProcessingHost(
        endpoint="orders",
        machine="edge-7",
        host_id=host_id_for("edge-7"),
        host_display_name="edge-7",
    )
