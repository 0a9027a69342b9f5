"""An OTLP/HTTP trace sink on loopback for the tracing row: it answers as a collector does and
counts the spans that arrive (decoded with opentelemetry-proto, in C), so the row can say
whether every message's span reached it or the daemon dropped some (a full span queue drops
spans rather than slowing delivery, which would flatter the figure)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class OtlpSink:
    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        self.spans = 0
        self._lock = threading.Lock()
        answer = ExportTraceServiceResponse().SerializeToString()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                request = ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
                scopes = [scope for spans in request.resource_spans for scope in spans.scope_spans]
                count = sum(len(scope.spans) for scope in scopes)
                with sink._lock:
                    sink.spans += count
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def take_count(self) -> int:
        """The spans received since the last call."""
        with self._lock:
            count, self.spans = self.spans, 0
        return count

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
