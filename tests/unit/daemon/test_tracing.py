"""Tracing's switch and edges (bridge.daemon.tracing, the spine's hook): off costs no import and
no work; what cannot trace says what to do; a collector or a tracer in trouble never holds up
or fails the daemon. What the spans hold is tested against a real OTLP receiver
(tests/integration/daemon/test_tracing_integration.py)."""

from __future__ import annotations

import ast
import logging
import sys
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

import bridge.daemon
from bridge.addressing import TableAddress
from bridge.config.model import (
    BridgeConfig,
    DatabaseConfig,
    ForwarderConfig,
    RouteConfig,
    TracingConfig,
)
from bridge.connections import Connections
from bridge.daemon.tracing import start_tracing, stop_tracing
from bridge.exceptions import TracingUnavailable
from bridge.forwarding.batch import Batch
from bridge.forwarding.hops import CommittedBatch
from bridge.forwarding.spine import BatchForwarder
from bridge.messages import ClaimedMessage, Delivered, Forward, Unit, utcnow
from bridge.routing import Destination

BRIDGE = Path(__file__).resolve().parents[3] / "bridge"
CONFIG = BridgeConfig(
    databases={
        "sender": DatabaseConfig("sender", "postgresql", connection="x"),
        "receiver": DatabaseConfig("receiver", "postgresql", connection="y"),
    },
    forwarders=(ForwarderConfig("f", "sender", "forward"),),
    routes=(RouteConfig("*", "receiver"),),
)
TRACED = replace(CONFIG, tracing=TracingConfig(enabled=True))


def imports_of(path: Path) -> list[tuple[str, bool]]:
    """(module imported, whether inside a function) for every import in `path`."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend((alias.name, nested) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module:
                names = [f"{child.module}.{alias.name}" for alias in child.names]
                found.extend((name, nested) for name in [child.module, *names])
            visit(child, inner)

    visit(ast.parse(path.read_text()), False)
    return found


def test_only_the_otel_module_imports_opentelemetry_and_it_is_loaded_only_when_tracing() -> None:
    importers = {
        path.relative_to(BRIDGE).as_posix(): imports_of(path) for path in BRIDGE.rglob("*.py")
    }
    of_opentelemetry = {
        name for name, found in importers.items()
        if any(module.split(".")[0] == "opentelemetry" for module, _ in found)
    }  # fmt: skip
    assert of_opentelemetry == {"daemon/otel.py"}
    of_otel = {
        name: [nested for module, nested in found if module == "bridge.daemon.otel"]
        for name, found in importers.items()
    }
    assert {name: nested for name, nested in of_otel.items() if nested} == {
        "daemon/tracing.py": [True]
    }


def test_tracing_off_makes_no_tracer() -> None:
    assert start_tracing(CONFIG) is None


@pytest.mark.parametrize(
    ("variable", "value"), [("OTEL_SDK_DISABLED", "true"), ("OTEL_TRACES_EXPORTER", "none")]
)
def test_the_standard_variables_can_turn_tracing_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    assert start_tracing(TRACED) is None
    assert f"{variable}={value}: no traces" in caplog.text


def test_tracing_without_opentelemetry_installed_says_to_install_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "bridge.daemon.otel", None)  # import fails
    monkeypatch.delattr(bridge.daemon, "otel", raising=False)  # as if never imported
    with pytest.raises(TracingUnavailable) as raised:
        start_tracing(TRACED)
    assert "pip install 'sfbridge[otel]'" in raised.value.advice


@pytest.mark.parametrize(
    ("variable", "value"),
    [("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"), ("OTEL_TRACES_EXPORTER", "console")],
)
def test_an_exporter_other_than_otlp_over_http_is_refused_with_advice(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(TracingUnavailable) as raised:
        start_tracing(TRACED)
    assert value in str(raised.value) and raised.value.advice


class HangingTracer:
    def __init__(self) -> None:
        self.release = threading.Event()

    def traced(self, *args: object) -> None:
        pass

    def shutdown(self) -> None:
        self.release.wait(30)


def test_stopping_gives_up_on_a_collector_that_does_not_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracer = HangingTracer()
    started = time.monotonic()
    stop_tracing(tracer, timeout=0.2)
    assert time.monotonic() - started < 5
    assert "leaving without them" in caplog.text
    tracer.release.set()


class Recording:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.told: list[CommittedBatch] = []

    def traced(self, batch: CommittedBatch) -> None:
        if self.fail:
            raise RuntimeError("tracer bug")
        self.told.append(batch)


def committed_batch() -> Batch:
    destination = Destination("receiver", TableAddress("R", "public"), '"public"."R"')
    message = ClaimedMessage(uuid.uuid4(), False, None, "{}", b"", 1)
    forward = Forward({"NServiceBus.MessageId": "m"}, destination, "{}", "m")
    batch = Batch("queue", None, utcnow(), None)  # type: ignore[arg-type]  # not opened
    batch.claimed_at = time.monotonic() - 0.5
    batch.units, batch.results = [Unit(message, forward, "{}")], [Delivered()]
    return batch


def test_the_tracer_is_told_the_batch_from_its_claim_to_now() -> None:
    tracer = Recording()
    forwarder = BatchForwarder(
        CONFIG, CONFIG.forwarders[0], Connections(CONFIG.databases), tracer=tracer
    )
    forwarder._trace(committed_batch(), tracer)
    [told] = tracer.told
    assert (told.forwarder, told.source, told.source_queue) == ("f", "queue", '"public"."forward"')
    [hop] = told.hops
    assert (hop.message_id, hop.outcome, hop.destination) == ("m", "delivered", '"public"."R"')
    assert 0.4e9 < told.ended_ns - told.started_ns < 5e9


def test_a_tracer_that_fails_is_logged_and_does_not_fail_the_committed_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR)
    tracer = Recording(fail=True)
    forwarder = BatchForwarder(
        CONFIG, CONFIG.forwarders[0], Connections(CONFIG.databases), tracer=tracer
    )
    forwarder._trace(committed_batch(), tracer)
    forwarder._trace(committed_batch(), tracer)
    assert caplog.text.count("tracing a batch failed; delivery goes on") == 1
