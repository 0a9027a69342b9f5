"""Specification of bridge.daemon.otlp: the hand-written OTLP encoding decodes with the protocol's
own classes (opentelemetry-proto) to what was meant; the standard variables are read as the
OpenTelemetry specification says; the sender retries what may succeed, drops what does not fit,
and never raises."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from bridge.daemon import otlp
from bridge.daemon.otel import sender_context

TRACE = bytes(range(1, 17))
SPAN = bytes(range(20, 28))
PARENT = bytes(range(40, 48))


def decoded(body: bytes) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    return request


def value(any_value: AnyValue) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value(item) for item in any_value.array_value.values]
    return getattr(any_value, kind)


@pytest.mark.parametrize("number", [0, 1, 127, 128, 300, 16383, 16384, 2**35, 2**63 - 1, -1, -300])
def test_attribute_integers_of_every_size_decode_to_themselves(number: int) -> None:
    any_value = AnyValue()
    any_value.ParseFromString(otlp.any_value(number))
    assert any_value.int_value == number


def test_a_span_with_every_field_the_tracer_writes_decodes_to_what_was_meant() -> None:
    attributes = {"s": "ünïcode", "b": True, "f": False, "i": -7, "d": 2.5, "a": ["x", "y"]}
    body = b"".join(
        (
            otlp.span_ids(TRACE, SPAN),
            b"\x22\x08" + PARENT,
            otlp.trace_state("vendor=x"),
            otlp.text(5, "send Samples.Receiver"),
            b"\x30\x03",
            otlp.fixed64(7, 1_700_000_000_000_000_000),
            otlp.fixed64(8, 1_700_000_000_500_000_000),
            otlp.attributes(9, attributes),
            otlp.event(1_700_000_000_400_000_000, "sfbridge.retry_scheduled", {"n": 1}),
            otlp.link(PARENT + PARENT, SPAN, "k=v"),
            otlp.status_error("outage"),
        )
    )
    long_body = body + otlp.attributes(9, {"long": "x" * 20_000})  # a three-byte length
    request = decoded(
        otlp.request(
            otlp.resource_field({"service.name": "sfbridge", "process.pid": 42}),
            otlp.scope_field("sfbridge", "0.1.0"),
            [otlp.span(body), otlp.span(long_body)],
        )
    )
    [resource_spans] = request.resource_spans
    resource = {kv.key: value(kv.value) for kv in resource_spans.resource.attributes}
    assert resource == {"service.name": "sfbridge", "process.pid": 42}
    [scope_spans] = resource_spans.scope_spans
    assert (scope_spans.scope.name, scope_spans.scope.version) == ("sfbridge", "0.1.0")
    span, long_span = scope_spans.spans
    assert (span.trace_id, span.span_id, span.parent_span_id) == (TRACE, SPAN, PARENT)
    assert (span.trace_state, span.name, span.kind) == ("vendor=x", "send Samples.Receiver", 3)
    assert span.start_time_unix_nano == 1_700_000_000_000_000_000
    assert span.end_time_unix_nano == 1_700_000_000_500_000_000
    assert {kv.key: value(kv.value) for kv in span.attributes} == attributes
    [event] = span.events
    assert (event.name, event.time_unix_nano) == (
        "sfbridge.retry_scheduled",
        1_700_000_000_400_000_000,
    )
    assert [(kv.key, value(kv.value)) for kv in event.attributes] == [("n", 1)]
    [link] = span.links
    assert (link.trace_id, link.span_id, link.trace_state) == (PARENT + PARENT, SPAN, "k=v")
    assert (span.status.code, span.status.message) == (2, "outage")
    assert long_span.attributes[-1].value.string_value == "x" * 20_000


def test_a_traceparent_is_read_as_the_w3c_specification_says() -> None:
    trace, span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    assert sender_context(f"00-{trace}-{span}-01", "a=b") == (
        bytes.fromhex(trace),
        bytes.fromhex(span),
        True,
        "a=b",
    )
    assert sender_context(f"00-{trace}-{span}-02", None) == (
        bytes.fromhex(trace),
        bytes.fromhex(span),
        False,
        None,
    )
    assert sender_context(f"01-{trace}-{span}-03-more", None) == (  # a later version
        bytes.fromhex(trace),
        bytes.fromhex(span),
        True,
        None,
    )
    for invalid in (
        f"00-{trace}-{span}-01-more",  # version 00 has four fields
        f"ff-{trace}-{span}-01",
        f"00-{'0' * 32}-{span}-01",
        f"00-{trace}-{'0' * 16}-01",
        f"00-{trace.upper()}-{span}-01",
        f"00-{trace}-{span}",
        f"00-{trace[:-2]} 1-{span}-01",
        f"00-{trace}-{span}-0g",
        "garbage",
    ):
        assert sender_context(invalid, None) is None, invalid


def test_the_standard_variables_say_where_and_how_spans_go() -> None:
    settings = otlp.export_settings(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "https://user:secret@collector:4318/",
            "OTEL_EXPORTER_OTLP_HEADERS": "api-key=a%20b, x=1",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_BSP_MAX_QUEUE_SIZE": "100",
        }
    )
    assert settings.endpoint == "https://user:secret@collector:4318/v1/traces"
    assert settings.shown_endpoint == "https://collector:4318/v1/traces"
    assert settings.headers == {"api-key": "a b", "x": "1"}
    assert (settings.timeout, settings.gzip, settings.schedule_delay) == (2.5, True, 0.2)
    assert (settings.max_queue, settings.max_batch) == (100, 100)
    traces_only = otlp.export_settings({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c/x"})
    assert traces_only.endpoint == "http://c/x"  # as it is: no path added
    defaults = otlp.export_settings({})
    assert (defaults.endpoint, defaults.timeout) == ("http://localhost:4318/v1/traces", 10.0)
    assert (defaults.max_queue, defaults.max_batch, defaults.schedule_delay) == (2048, 512, 5.0)


class Collector:
    """Answers `statuses` in turn (200 once they are used up); keeps what it received."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.bodies: list[bytes] = []
        self.encodings: list[str | None] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.encodings.append(self.headers.get("Content-Encoding"))
                status = collector.statuses.pop(0) if collector.statuses else 200
                if status == 200:
                    collector.bodies.append(body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def settings(self, **extra: str) -> otlp.ExportSettings:
        port = self.server.server_address[1]
        return otlp.export_settings(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", **extra}
        )


@pytest.fixture
def collector() -> Iterator[Collector]:
    yield (made := Collector())
    made.server.shutdown()
    made.server.server_close()


def spans_in(body: bytes) -> int:
    return sum(len(s.spans) for r in decoded(body).resource_spans for s in r.scope_spans)


def one_span() -> bytes:
    return otlp.span(otlp.span_ids(TRACE, SPAN) + otlp.text(5, "send x"))


def test_the_sender_retries_a_collector_that_is_busy_and_compresses_when_told(
    collector: Collector,
) -> None:
    collector.statuses = [503]
    sender = otlp.SpanSender(collector.settings(OTEL_EXPORTER_OTLP_COMPRESSION="gzip"), b"", b"")
    sender.add([one_span()] * 3)
    sender.shutdown()
    [body] = collector.bodies
    assert spans_in(gzip.decompress(body)) == 3
    assert collector.encodings == ["gzip", "gzip"]


def test_the_sender_drops_what_does_not_fit_its_queue_and_what_the_collector_refuses(
    collector: Collector, caplog: pytest.LogCaptureFixture
) -> None:
    collector.statuses = [400]
    sender = otlp.SpanSender(
        collector.settings(OTEL_BSP_MAX_QUEUE_SIZE="4", OTEL_BSP_SCHEDULE_DELAY="60000"),
        b"",
        b"",
    )
    sender.add([one_span()] * 6)
    sender.shutdown()
    assert collector.bodies == []  # 400 is not retried
    assert "2 span(s) dropped: the span queue was full" in caplog.text
    assert "cannot export 4 span(s)" in caplog.text and "HTTP 400" in caplog.text


def test_the_sender_survives_a_collector_that_is_not_there(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = otlp.export_settings(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_TIMEOUT": "300"}
    )
    sender = otlp.SpanSender(settings, b"", b"")
    sender.add([one_span()])
    sender.shutdown()
    assert "cannot export 1 span(s) to http://127.0.0.1:9/v1/traces" in caplog.text
