"""The OpenTelemetry side of tracing: one process's tracer provider, its OTLP/HTTP exporter, and
a span per hop. Imported only when `tracing.enabled` (`bridge.daemon.tracing`).

A hop's span (the messaging semantic conventions, for a `send` that is not the message's
creation context, hence kind CLIENT): named `send <destination queue>` (`publish ...` for a
subscriber's copy), from the claim of its batch to the commit; a child of the sender's span in
the message's `traceparent`/`tracestate`, or, when the sender asked for a new trace
(`NServiceBus.OpenTelemetry.StartNewTrace: True`), a new trace's root with a link to it, as
an NServiceBus receiver does; a root when the message carries no trace. The headers themselves
are forwarded unchanged: the receiver stays a child of the sender's span, the bridge's a
sibling of it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from bridge.exceptions import TracingUnavailable
from bridge.forwarding.hops import FAILED_OUTCOMES, Hop
from bridge.messages import Source

# `messaging.system`: the queues are tables of NServiceBus's SQL transports (SQL Server,
# PostgreSQL), which the conventions list no value for.
MESSAGING_SYSTEM = "nservicebus_sql"
INSTRUMENTATION = "sfbridge"
SERVICE_NAME = "sfbridge"


class OtlpHopTracer:
    """Spans of hops, batched and exported over OTLP/HTTP (protobuf) by a background thread of
    the SDK (`OTEL_BSP_*`); sampled as `OTEL_TRACES_SAMPLER` says (`parentbased_always_on`
    unless set)."""

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
        # Shut down by `bridge.daemon.tracing.stop_tracing`, bounded: not at exit, where a
        # collector that does not answer would hold the process.
        self._provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        exporter_ = OTLPSpanExporter()
        self.endpoint: str = getattr(exporter_, "_endpoint", "the OTLP endpoint")
        self._provider.add_span_processor(BatchSpanProcessor(exporter_))
        self._tracer = self._provider.get_tracer(INSTRUMENTATION)
        self._propagator = TraceContextTextMapPropagator()

    def traced(
        self,
        forwarder: str,
        source: Source,
        source_queue: str,
        hops: Sequence[Hop],
        started_ns: int,
        ended_ns: int,
    ) -> None:
        common: dict[str, AttributeValue] = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "send",
            "sfbridge.forwarder": forwarder,
            "sfbridge.source": source,
            "sfbridge.source.queue": source_queue,
        }
        tracer, root = self._tracer, Context()
        for hop in hops:
            parent, links = root, None
            if hop.trace_headers is not None:
                extracted = self._propagator.extract(hop.trace_headers)
                if hop.new_trace:
                    sender = get_current_span(extracted).get_span_context()
                    links = [Link(sender)] if sender.is_valid else None
                else:
                    parent = extracted
            attributes = {
                **common,
                "messaging.operation.name": hop.operation,
                "messaging.destination.name": hop.destination,
                "sfbridge.attempt": hop.attempt,
                "sfbridge.outcome": hop.outcome,
            }
            if hop.message_id:
                attributes["messaging.message.id"] = hop.message_id
            if hop.destination_database is not None:
                attributes["sfbridge.destination.database"] = hop.destination_database
            if hop.error_type is not None:
                attributes["error.type"] = hop.error_type
            span = tracer.start_span(
                f"{hop.operation} {hop.destination}",
                context=parent,
                kind=SpanKind.CLIENT,
                attributes=attributes,
                links=links,
                start_time=started_ns,
            )
            for event in hop.events:
                span.add_event(event.name, dict(event.attributes), timestamp=ended_ns)
            if hop.outcome in FAILED_OUTCOMES:
                span.set_status(Status(StatusCode.ERROR, hop.error_type))
            span.end(end_time=ended_ns)

    def shutdown(self) -> None:
        self._provider.shutdown()
