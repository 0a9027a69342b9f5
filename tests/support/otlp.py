"""An OTLP/HTTP trace receiver on loopback: what a collector takes in, decoded.

It answers `POST /v1/traces` as a collector does and decodes each `ExportTraceServiceRequest`
with the protocol's own protobuf classes (opentelemetry-proto), so a test sees the spans as
they went over the wire, not as the SDK held them. `stall` makes it take requests and never
answer, as a collector that hangs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from support import wait_until


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it arrived: ids in lowercase hex (the W3C `traceparent` spelling)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]  # (trace id, span id)
    status_code: int
    resource: dict[str, Any]
    start_ns: int
    end_ns: int

    @property
    def message_id(self) -> str | None:
        value = self.attributes.get("messaging.message.id")
        return None if value is None else str(value)

    def event_names(self) -> list[str]:
        return [name for name, _ in self.events]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def _attributes(items: Any) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in items}


class OtlpReceiver:
    """Started on a free loopback port; `endpoint` is what OTEL_EXPORTER_OTLP_ENDPOINT takes."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self.stall = threading.Event()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver._take(self.path, self.headers.get("Content-Type", ""), body)
                if receiver.stall.is_set():
                    threading.Event().wait(3600)  # never answers
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def env(self, **extra: str) -> dict[str, str]:
        """The daemon's environment for exporting here, spans sent within 100 ms."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            **extra,
        }

    def _take(self, path: str, content_type: str, body: bytes) -> None:
        assert path == "/v1/traces", path
        assert content_type == "application/x-protobuf", content_type
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = list(_spans_of(request))
        with self._lock:
            self.requests += 1
            self.spans.extend(spans)

    def received(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def spans_of(self, message_id: str) -> list[ReceivedSpan]:
        """The spans of one message (its `messaging.message.id`), in the order they came."""
        return [span for span in self.received() if span.message_id == message_id]

    def wait_for(self, count: int, timeout: float = 30, what: str = "spans") -> list[ReceivedSpan]:
        wait_until(lambda: len(self.received()) >= count, timeout, f"{count} {what}")
        return self.received()

    def close(self) -> None:
        self.stall.clear()
        self._server.shutdown()
        self._server.server_close()


def _spans_of(request: ExportTraceServiceRequest) -> Iterator[ReceivedSpan]:
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield ReceivedSpan(
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex(),
                    name=span.name,
                    kind=span.kind,
                    attributes=_attributes(span.attributes),
                    events=[(event.name, _attributes(event.attributes)) for event in span.events],
                    links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                    status_code=span.status.code,
                    resource=resource,
                    start_ns=span.start_time_unix_nano,
                    end_ns=span.end_time_unix_nano,
                )
