"""OTLP/HTTP for spans: the protobuf encoding of the few messages a trace export needs, written
by hand, and a background sender that posts them in batches to a collector.

Why by hand: the SDK builds a span object, then a protobuf object per span, attribute and value,
for every message; measured in `bench/forwarding_benchmark.py` that cost about 100 us of CPU per
message, five times what forwarding it costs. Here the attributes a batch's spans share are
encoded once per batch (`SpanEncoder`) and a span costs a few byte joins. What a collector
receives is the same `ExportTraceServiceRequest`
(tests/integration/daemon/test_tracing_integration.py decodes it with the protocol's own classes).

The sender (`SpanSender`) is configured by the standard `OTEL_EXPORTER_OTLP_*` variables
(endpoint, headers, timeout, compression, certificates) and batches as `OTEL_BSP_*` say; a
collector that is slow or away never holds up delivery: a full queue drops spans (counted and
logged once a minute), an export that fails is retried within its timeout, then dropped.
"""

from __future__ import annotations

import gzip
import http.client
import logging
import os
import ssl
import struct
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

AttributeValue = (
    str | bool | int | float | Sequence[str] | Sequence[bool] | Sequence[int] | Sequence[float]
)

# -- protobuf, the parts of the wire format OTLP traces use ----------------------------------

_LENGTH, _FIXED64 = 2, 1
_PACK_FIXED64 = struct.Struct("<Q").pack
_PACK_DOUBLE = struct.Struct("<d").pack


def varint(value: int) -> bytes:
    """A protobuf varint (a negative int64 as its 64-bit two's complement)."""
    if value < 0:
        value += 1 << 64
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (a string, bytes or a message)."""
    return varint(number << 3 | _LENGTH) + varint(len(payload)) + payload


def text(number: int, value: str) -> bytes:
    return field(number, value.encode("utf-8", "surrogatepass"))


def fixed64(number: int, value: int) -> bytes:
    return varint(number << 3 | _FIXED64) + _PACK_FIXED64(value)


def any_value(value: AttributeValue) -> bytes:
    """An AnyValue: string 1, bool 2, int 3, double 4, array 5."""
    if isinstance(value, str):
        return text(1, value)
    if isinstance(value, bool):
        return b"\x10" + varint(int(value))
    if isinstance(value, int):
        return b"\x18" + varint(value)
    if isinstance(value, float):
        return b"\x21" + _PACK_DOUBLE(value)
    return field(5, b"".join(field(1, any_value(item)) for item in value))


def key_value(key: str, value: AttributeValue) -> bytes:
    """A KeyValue (key 1, value 2), as a repeated field `attributes` takes it, untagged."""
    return text(1, key) + field(2, any_value(value))


def attributes(number: int, values: Mapping[str, AttributeValue]) -> bytes:
    """Repeated KeyValue field `number` (Span 9, Event 3, Resource 1, Link 4)."""
    return b"".join(field(number, key_value(key, value)) for key, value in values.items())


# Span fields: trace_id 1, span_id 2, trace_state 3, parent_span_id 4, name 5, kind 6,
# start 7, end 8, attributes 9, events 11, links 13, status 15 (message 2, code 3).
SPAN_KIND_CLIENT = 3
STATUS_ERROR = 2


def span_ids(trace_id: bytes, span_id: bytes) -> bytes:
    return b"\x0a\x10" + trace_id + b"\x12\x08" + span_id


def trace_state(value: str) -> bytes:
    return text(3, value)


def event(time_ns: int, name: str, values: Mapping[str, AttributeValue]) -> bytes:
    """An Event (time 1, name 2, attributes 3) as Span field 11."""
    return field(11, fixed64(1, time_ns) + text(2, name) + attributes(3, values))


def link(trace_id: bytes, span_id: bytes, state: str | None) -> bytes:
    """A Link (trace_id 1, span_id 2, trace_state 3) as Span field 13."""
    return field(13, span_ids(trace_id, span_id) + (trace_state(state) if state else b""))


def status_error(description: str | None) -> bytes:
    return field(15, (text(2, description) if description else b"") + b"\x18\x02")


def span(body: bytes) -> bytes:
    """A Span from its encoded fields, as ScopeSpans field 2."""
    size = len(body)
    if 128 <= size < 16384:  # a span's usual size: the length's two bytes spelled out
        return b"".join((b"\x12", _TWO_BYTES[size & 0x7F], _BYTE[size >> 7], body))
    return b"\x12" + varint(size) + body


_BYTE = [bytes((number,)) for number in range(128)]
_TWO_BYTES = [bytes((number | 0x80,)) for number in range(128)]


def request(resource: bytes, scope: bytes, spans: Sequence[bytes]) -> bytes:
    """An ExportTraceServiceRequest of one ResourceSpans (resource 1, scope_spans 2) of one
    ScopeSpans (scope 1, spans 2): `resource` and `scope` already encoded as their fields."""
    scope_spans = field(2, scope + b"".join(spans))
    return field(1, resource + scope_spans)


def resource_field(values: Mapping[str, AttributeValue]) -> bytes:
    return field(1, attributes(1, values))


def scope_field(name: str, version: str | None) -> bytes:
    return field(1, text(1, name) + (text(2, version) if version else b""))


# -- the standard variables ------------------------------------------------------------------


@dataclass(frozen=True)
class ExportSettings:
    """Where and how spans are posted, and how they are batched (the `OTEL_*` variables)."""

    endpoint: str
    headers: Mapping[str, str]
    timeout: float  # seconds, per export (with its retries)
    gzip: bool
    certificate: str | None
    client_certificate: str | None
    client_key: str | None
    schedule_delay: float  # seconds between exports at most
    max_queue: int
    max_batch: int

    @property
    def shown_endpoint(self) -> str:
        """The endpoint without credentials a URL may carry, for the log."""
        parts = urllib.parse.urlsplit(self.endpoint)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _variable(environ: Mapping[str, str], name: str, default: str = "") -> str:
    """`OTEL_EXPORTER_OTLP_TRACES_<name>`, else `OTEL_EXPORTER_OTLP_<name>`, else `default`."""
    for key in (f"OTEL_EXPORTER_OTLP_TRACES_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
        value = environ.get(key, "").strip()
        if value:
            return value
    return default


def _number(environ: Mapping[str, str], name: str, default: float) -> float:
    return _positive(environ.get(name, "").strip(), name, default)


def _positive(raw: str, name: str, default: float) -> float:
    """`raw` as a positive number, else `default` (logged when `raw` is not a number)."""
    try:
        value = float(raw) if raw else default
    except ValueError:
        log.warning("tracing: %s=%r is not a number; using %g", name, raw, default)
        return default
    return value if value > 0 else default


def export_settings(environ: Mapping[str, str] = os.environ) -> ExportSettings:
    """The settings the variables give, as the OpenTelemetry specification reads them: a
    signal-specific endpoint as it is, a general one with `/v1/traces` added; headers as
    `key=value` pairs, values percent-decoded; the timeout in milliseconds (default 10 s)."""
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if not endpoint:
        base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or "http://localhost:4318"
        endpoint = base.rstrip("/") + "/v1/traces"
    headers = {}
    for pair in _variable(environ, "HEADERS").split(","):
        key, equals, value = pair.partition("=")
        if equals and key.strip():
            headers[key.strip()] = urllib.parse.unquote(value.strip())
    timeout_ms = _positive(_variable(environ, "TIMEOUT"), "OTEL_EXPORTER_OTLP_TIMEOUT", 10_000)
    max_queue = int(_number(environ, "OTEL_BSP_MAX_QUEUE_SIZE", 2048))
    return ExportSettings(
        endpoint=endpoint,
        headers=headers,
        timeout=timeout_ms / 1000,
        gzip=_variable(environ, "COMPRESSION").lower() == "gzip",
        certificate=_variable(environ, "CERTIFICATE") or None,
        client_certificate=_variable(environ, "CLIENT_CERTIFICATE") or None,
        client_key=_variable(environ, "CLIENT_KEY") or None,
        schedule_delay=_number(environ, "OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000,
        max_queue=max_queue,
        max_batch=min(int(_number(environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)), max_queue),
    )


# -- sending ---------------------------------------------------------------------------------

# Answers worth another try within the timeout (the OTLP/HTTP specification's list).
_RETRYABLE = frozenset({429, 502, 503, 504})
# How often a failing export or dropped spans are logged, at most.
_LOG_INTERVAL = 60.0


class SpanSender:
    """Queues encoded spans and posts them in batches from a thread of its own."""

    def __init__(self, settings: ExportSettings, resource: bytes, scope: bytes) -> None:
        self.settings = settings
        self._resource, self._scope = resource, scope
        self._queue: list[bytes] = []
        self._lock = threading.Condition()
        self._stopping = False
        self._dropped = 0
        self._next_log: dict[str, float] = {}
        self._connection: http.client.HTTPConnection | None = None
        parts = urllib.parse.urlsplit(settings.endpoint)
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname or "localhost", parts.port
        self._path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        self._thread = threading.Thread(target=self._run, name="tracing-export", daemon=True)
        self._thread.start()

    def add(self, spans: Sequence[bytes]) -> None:
        """Queue `spans` (encoded by `span`); what does not fit in the queue is dropped."""
        with self._lock:
            room = self.settings.max_queue - len(self._queue)
            if room < len(spans):
                self._dropped += len(spans) - max(room, 0)
                spans = spans[: max(room, 0)]
            self._queue.extend(spans)
            if len(self._queue) >= self.settings.max_batch:
                self._lock.notify()

    def drop(self, count: int) -> None:
        """Count `count` spans dropped before they were made (told like those dropped here)."""
        with self._lock:
            self._dropped += count

    def failed(self, what: str) -> None:
        """Tell of a failure before the sending (once a minute at most)."""
        self._tell("failed", what)

    def shutdown(self) -> None:
        """Post what is queued and stop; blocks while the collector takes it (with retries up
        to the timeout per batch): `bridge.daemon.tracing.stop_tracing` bounds the wait."""
        with self._lock:
            self._stopping = True
            self._lock.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._stopping and len(self._queue) < self.settings.max_batch:
                    self._lock.wait(self.settings.schedule_delay)
                batch = self._queue[: self.settings.max_batch]
                del self._queue[: len(batch)]
                stopping, dropped = self._stopping, self._dropped
                self._dropped = 0
            if dropped:
                self._tell("dropped", f"{dropped} span(s) dropped: the span queue was full")
            if batch:
                try:
                    self._post(request(self._resource, self._scope, batch), len(batch))
                except Exception as error:  # the export thread must not die
                    self._tell("failed", f"cannot export {len(batch)} span(s): {error!r}")
            elif stopping:
                self._close()
                return

    def _post(self, body: bytes, count: int) -> None:
        settings = self.settings
        headers = {**settings.headers, "Content-Type": "application/x-protobuf"}
        if settings.gzip:
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        deadline = time.monotonic() + settings.timeout
        wait = 1.0
        while True:
            left = deadline - time.monotonic()
            try:
                status, reason = self._send(body, headers, max(left, 0.1))
            except (OSError, http.client.HTTPException) as error:
                self._close()
                status, reason = None, str(error) or type(error).__name__
            if status is not None and 200 <= status < 300:
                return
            retryable = status is None or status in _RETRYABLE
            if not retryable or time.monotonic() + wait >= deadline:
                said = f"HTTP {status} {reason}" if status is not None else reason
                self._tell(
                    "failed", f"cannot export {count} span(s) to {settings.shown_endpoint}: {said}"
                )
                return
            time.sleep(wait)
            wait *= 2

    def _send(self, body: bytes, headers: Mapping[str, str], timeout: float) -> tuple[int, str]:
        if self._connection is None:
            self._connection = self._connect(timeout)
        self._connection.timeout = timeout
        if self._connection.sock is not None:
            self._connection.sock.settimeout(timeout)
        self._connection.request("POST", self._path, body=body, headers=dict(headers))
        response = self._connection.getresponse()
        response.read()
        return response.status, response.reason

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if not self._https:
            return http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        context = ssl.create_default_context(cafile=self.settings.certificate)
        if self.settings.client_certificate:
            context.load_cert_chain(self.settings.client_certificate, self.settings.client_key)
        return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=context)

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _tell(self, kind: str, what: str) -> None:
        """Log `what`, once a minute at most for each `kind` of trouble."""
        now = time.monotonic()
        if now >= self._next_log.get(kind, 0.0):
            self._next_log[kind] = now + _LOG_INTERVAL
            log.warning("tracing: %s (said at most once a minute)", what)
