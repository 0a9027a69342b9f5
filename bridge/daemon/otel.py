"""The OpenTelemetry side of tracing: a span per hop, sampled and exported as the standard
`OTEL_*` variables say. Imported only when `tracing.enabled` (`bridge.daemon.tracing`).

A hop's span (the messaging semantic conventions, for a `send` that is not the message's
creation context, hence kind CLIENT): named `send <destination queue>` (`publish ...` for a
subscriber's copy), from the claim of its batch to the commit; a child of the sender's span in
the message's `traceparent`/`tracestate`, or, when the sender asked for a new trace
(`NServiceBus.OpenTelemetry.StartNewTrace: True`), a new trace's root with a link to it, as
an NServiceBus receiver does; a root when the message carries no trace. The headers themselves
are forwarded unchanged: the receiver stays a child of the sender's span, the bridge's a
sibling of it.

The SDK gives the resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`) and the sampler
(`OTEL_TRACES_SAMPLER`); the spans are encoded and sent by `bridge.daemon.otlp`, which says why.
With the default sampler (`parentbased_always_on`) a span is sampled when its sender's was, or
when it is a root, without asking the sampler per message.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from collections import deque
from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from bridge import __version__
from bridge.daemon import otlp
from bridge.exceptions import TracingUnavailable
from bridge.forwarding.hops import FAILED_OUTCOMES, CommittedBatch, Hop

# `messaging.system`: the queues are tables of NServiceBus's SQL transports (SQL Server,
# PostgreSQL), which the conventions list no value for.
MESSAGING_SYSTEM = "nservicebus_sql"
INSTRUMENTATION = "sfbridge"
SERVICE_NAME = "sfbridge"

# W3C trace context, version 00 and later ones (which may add fields), as the SDK reads it.
_TRACEPARENT = re.compile(r"\s*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?\s*")
_NO_TRACE, _NO_SPAN = "0" * 32, "0" * 16
_ODD = frozenset("13579bdf")
_HEX_DIGITS = frozenset("0123456789abcdef")
_NO_TRACE_ID, _NO_SPAN_ID = bytes(16), bytes(8)
# A message id's attribute, its key encoded once.
_MESSAGE_ID_KEY = otlp.text(1, "messaging.message.id")
_BYTE = [bytes((number,)) for number in range(128)]
# Hops encoded between two chances for the workers to take the interpreter lock.
_CHUNK = 256


# The span context of a message's sender, read from its `traceparent`: trace id, span id,
# sampled, `tracestate`. A plain tuple: one is made per traced message.
SenderContext = tuple[bytes, bytes, bool, str | None]


def sender_context(traceparent: str, tracestate: str | None) -> SenderContext | None:
    """The context `traceparent` gives, None when it is not a valid one (then the span is a
    root, as if there were none)."""
    if (
        len(traceparent) == 55
        and traceparent[:3] == "00-"
        and traceparent[35] == "-"
        and traceparent[52] == "-"
        and traceparent[53] in _HEX_DIGITS
        and traceparent[54] in _HEX_DIGITS
        and traceparent == traceparent.lower()
    ):  # version 00, as nearly every sender writes it: a third of the expression's cost
        try:
            trace_id = bytes.fromhex(traceparent[3:35])
            span_id = bytes.fromhex(traceparent[36:52])
        except ValueError:
            return None
        # fromhex skips spaces: a shorter result had some.
        if len(trace_id) != 16 or len(span_id) != 8:
            return None
        if trace_id == _NO_TRACE_ID or span_id == _NO_SPAN_ID:
            return None
        return trace_id, span_id, traceparent[54] in _ODD, tracestate
    match = _TRACEPARENT.fullmatch(traceparent)
    if match is None:
        return None
    version, trace, span, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or trace == _NO_TRACE or span == _NO_SPAN:
        return None
    # The sampled flag is the lowest bit of the flags' last hex digit.
    return bytes.fromhex(trace), bytes.fromhex(span), flags[1] in _ODD, tracestate


class OtlpHopTracer:
    """Spans of hops, queued and posted over OTLP/HTTP by a thread of their own."""

    def __init__(self, exporter: str = "otlp") -> None:
        """Raises TracingUnavailable for an exporter or protocol other than OTLP/HTTP."""
        if exporter != "otlp":
            raise TracingUnavailable(
                f"OTEL_TRACES_EXPORTER={exporter}: sfbridge exports traces over OTLP only",
                advice="unset OTEL_TRACES_EXPORTER (or set it to otlp, or none for no traces)",
            )
        protocol = os.environ.get(
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
        )
        if protocol.strip() not in ("", "http/protobuf"):
            raise TracingUnavailable(
                f"OTLP protocol {protocol.strip()!r}: sfbridge exports traces over "
                "http/protobuf only",
                advice="unset OTEL_EXPORTER_OTLP_PROTOCOL and point OTEL_EXPORTER_OTLP_ENDPOINT "
                "at the collector's OTLP/HTTP port (4318 by default)",
            )
        # Each process of the daemon exports on its own: its id tells them apart.
        resource = Resource.create({"process.pid": os.getpid()})
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
        # The SDK's reading of OTEL_TRACES_SAMPLER(_ARG); the provider itself makes no spans.
        self._sampler = TracerProvider(shutdown_on_exit=False).sampler
        self._default_sampler = (
            self._sampler.get_description() == sampling.DEFAULT_ON.get_description()
        )
        settings = otlp.export_settings()
        self.endpoint = settings.shown_endpoint
        self._sender = otlp.SpanSender(
            settings,
            otlp.resource_field(dict(resource.attributes)),  # type: ignore[arg-type]
            otlp.scope_field(INSTRUMENTATION, __version__),
        )
        self._random = random.Random(os.urandom(32))  # ids: fast, and distinct per process
        self._common: dict[tuple[str, str, str], bytes] = {}
        self._batches: deque[CommittedBatch] = deque()
        self._queued = 0  # messages in `_batches`
        self._max_queued = settings.max_queue
        self._waiting = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tracing-spans", daemon=True)
        self._thread.start()

    def traced(self, batch: CommittedBatch) -> None:
        """Queue `batch` for the encoding thread; a batch that does not fit (the queue holds
        `OTEL_BSP_MAX_QUEUE_SIZE` hops) is dropped and counted."""
        with self._waiting:
            if self._queued + len(batch.hops) > self._max_queued:
                self._sender.drop(len(batch.hops))
                return
            self._batches.append(batch)
            self._queued += len(batch.hops)
            self._waiting.notify()

    def _run(self) -> None:
        """The encoding thread: each queued batch's hops to spans, for the sender."""
        while True:
            with self._waiting:
                while not self._batches and not self._stopping:
                    self._waiting.wait()
                if not self._batches:
                    return
                batch = self._batches.popleft()
                self._queued -= len(batch.hops)
            try:
                hops = batch.hops
                for first in range(0, len(hops), _CHUNK):
                    chunk = hops[first : first + _CHUNK]
                    spans = self._spans(batch.forwarder, batch.source, batch.source_queue,
                                        chunk, batch.started_ns, batch.ended_ns)  # fmt: skip
                    if spans:
                        self._sender.add(spans)
                    # A worker back from the database waits for the interpreter lock while
                    # this thread holds it, up to the switch interval (5 ms): let it go first.
                    time.sleep(0)
            except Exception:  # the thread must not die; delivery is not concerned
                self._sender.failed(f"cannot trace a batch of {len(batch.hops)} message(s)")

    def _spans(
        self,
        forwarder: str,
        source: str,
        source_queue: str,
        hops: Sequence[Hop],
        started_ns: int,
        ended_ns: int,
    ) -> list[bytes]:
        common = self._common.get((forwarder, source, source_queue))
        if common is None:
            common = self._common[(forwarder, source, source_queue)] = otlp.attributes(
                9,
                {
                    "messaging.system": MESSAGING_SYSTEM,
                    "messaging.operation.type": "send",
                    "sfbridge.forwarder": forwarder,
                    "sfbridge.source": source,
                    "sfbridge.source.queue": source_queue,
                },
            )
        times = otlp.fixed64(7, started_ns) + otlp.fixed64(8, ended_ns)
        # What the hops of a batch share (name, attributes, status) is encoded once.
        shared: dict[tuple[object, ...], bytes] = {}
        spans: list[bytes] = []
        random_bits = self._random.getrandbits
        for hop in hops:
            key = (hop.operation, hop.destination, hop.destination_database, hop.attempt,
                   hop.outcome, hop.error_type)  # fmt: skip
            fields = shared.get(key)
            if fields is None:
                fields = shared[key] = times + common + _hop_fields(hop)
            sender = None
            if hop.traceparent is not None:
                sender = sender_context(hop.traceparent, hop.tracestate)
            if sender is not None and not hop.new_trace:  # the sender's span is the parent
                trace_id, parent_id, sampled, state = sender
                if not (sampled if self._default_sampler else self._sample(hop, sender)):
                    continue
                context = b"\x22\x08" + parent_id  # parent_span_id
                if state:
                    context += otlp.trace_state(state)
            else:  # a root: of a trace of its own, linked to the sender's when it asked so
                trace_id = (random_bits(128) or 1).to_bytes(16, "big")
                if not (self._default_sampler or self._sample(hop, None, trace_id, sender)):
                    continue
                context = b""
                if sender is not None:
                    context = otlp.link(sender[0], sender[1], sender[3])
            span_id = (random_bits(64) or 1).to_bytes(8, "big")
            body = b"".join(
                (b"\x0a\x10", trace_id, b"\x12\x08", span_id, fields, context,
                 _message_id(hop.message_id) if hop.message_id else b"")
            )  # fmt: skip
            if hop.events:
                body += b"".join(
                    otlp.event(ended_ns, event.name, dict(event.attributes)) for event in hop.events
                )
            spans.append(otlp.span(body))
        return spans

    def _sample(
        self,
        hop: Hop,
        sender: SenderContext | None,
        trace_id: bytes | None = None,
        linked: SenderContext | None = None,
    ) -> bool:
        """What a sampler other than the default decides for the span of `hop`: a child of
        `sender`, or a root of trace `trace_id` (linked to `linked`)."""
        parent = Context()
        if sender is not None:
            parent = set_span_in_context(NonRecordingSpan(_span_context(sender)), parent)
            trace_id = sender[0]
        assert trace_id is not None
        links = [Link(_span_context(linked))] if linked is not None else None
        result = self._sampler.should_sample(
            parent,
            int.from_bytes(trace_id, "big"),
            f"{hop.operation} {hop.destination}",
            SpanKind.CLIENT,
            None,
            links,
        )
        return result.decision.is_sampled()

    def shutdown(self) -> None:
        with self._waiting:
            self._stopping = True
            self._waiting.notify()
        self._thread.join()
        self._sender.shutdown()


def _span_context(sender: SenderContext) -> SpanContext:
    trace_id, span_id, sampled, state = sender
    return SpanContext(
        int.from_bytes(trace_id, "big"),
        int.from_bytes(span_id, "big"),
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT),
        trace_state=TraceState.from_header([state]) if state else None,
    )


def _hop_fields(hop: Hop) -> bytes:
    """Name, kind, the hop's own attributes and its status, as Span fields."""
    values: dict[str, otlp.AttributeValue] = {
        "messaging.operation.name": hop.operation,
        "messaging.destination.name": hop.destination,
        "sfbridge.attempt": hop.attempt,
        "sfbridge.outcome": hop.outcome,
    }
    if hop.destination_database is not None:
        values["sfbridge.destination.database"] = hop.destination_database
    if hop.error_type is not None:
        values["error.type"] = hop.error_type
    encoded = otlp.text(5, f"{hop.operation} {hop.destination}") + b"\x30\x03"  # kind CLIENT
    encoded += otlp.attributes(9, values)
    if hop.outcome in FAILED_OUTCOMES:
        encoded += otlp.status_error(hop.error_type)
    return encoded


def _message_id(message_id: str) -> bytes:
    """The `messaging.message.id` attribute (Span field 9)."""
    encoded = message_id.encode("utf-8", "surrogatepass")
    size = len(encoded)
    if size < 100:  # every length below fits one byte: three fields spelled out
        return b"".join(
            (b"\x4a", _BYTE[size + 26], _MESSAGE_ID_KEY, b"\x12", _BYTE[size + 2], b"\x0a",
             _BYTE[size], encoded)
        )  # fmt: skip
    return otlp.field(9, _MESSAGE_ID_KEY + otlp.field(2, otlp.field(1, encoded)))
