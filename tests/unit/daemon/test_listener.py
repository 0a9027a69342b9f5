"""The metrics listener answers `/metrics`, `/healthz` and `/readyz` (200 or 503 with a JSON
body) and 404 elsewhere, from whatever thread asks, without blocking the others."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from bridge.daemon.listener import Listener


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get(port: int, path: str, method: str = "GET") -> tuple[int, str, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


@pytest.fixture
def served() -> Iterator[tuple[int, dict[str, Any]]]:
    registry = CollectorRegistry()
    Counter("sfbridge_things", "Things.", registry=registry).inc(3)
    state: dict[str, Any] = {"ready": False, "gate": None}

    def readyz() -> tuple[bool, dict[str, Any]]:
        if state["gate"] is not None:
            state["gate"].wait(5)
        return state["ready"], {"ready": state["ready"], "not_ready": ["database 'receiver'"]}

    port = free_port()
    listener = Listener("127.0.0.1", port, registry, lambda: (True, {"live": True}), readyz)
    yield port, state
    listener.close()


def test_each_path_answers_and_any_other_is_404(served: tuple[int, dict[str, Any]]) -> None:
    port, state = served
    status, content_type, text = get(port, "/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    assert "sfbridge_things_total 3.0" in text
    assert get(port, "/healthz")[:2] == (200, "application/json")
    status, content_type, text = get(port, "/readyz")
    assert (status, content_type) == (503, "application/json")
    assert json.loads(text) == {"ready": False, "not_ready": ["database 'receiver'"]}
    state["ready"] = True
    assert get(port, "/readyz?verbose=1")[0] == 200
    assert get(port, "/")[0] == 404 and get(port, "/metrics/x")[0] == 404
    assert get(port, "/readyz", method="HEAD")[::2] == (200, "")


def test_a_slow_answer_holds_up_no_other_request(served: tuple[int, dict[str, Any]]) -> None:
    port, state = served
    state["gate"] = gate = threading.Event()
    slow = threading.Thread(target=get, args=(port, "/readyz"))
    slow.start()
    try:
        assert get(port, "/healthz")[0] == 200
        assert get(port, "/metrics")[0] == 200
    finally:
        gate.set()
        slow.join(5)
