"""OpenTelemetry traces of the forwarding hop (issue 36), as a collector receives them: the real
daemon exports over OTLP/HTTP to a receiver on loopback (`support.otlp`), which decodes what
arrives. A sender's trace (`traceparent`) gets the bridge's span under its sender's span, for a
unicast, each subscriber's copy of an event, a retry after an outage and a message sent to the
error queue; the headers arrive unchanged."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyodbc
import pytest
from support import (
    ERROR_QUEUE,
    RETRY_TABLE,
    nsb_message_headers,
    pg_connect,
    pg_count,
    pg_create_queue,
    pg_nsb_receive_all,
    pg_nsb_send,
    wait_until,
)
from support.otlp import OtlpReceiver, ReceivedSpan
from support.pairs import PgPair, make_pg_pair

pytestmark = pytest.mark.integration

CLIENT = 3  # Span.SpanKind.SPAN_KIND_CLIENT in the OTLP protocol
STATUS_ERROR = 2
START_NEW_TRACE = "NServiceBus.OpenTelemetry.StartNewTrace"
TRACING = {"tracing": {"enabled": True}}


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    otlp = OtlpReceiver()
    yield otlp
    otlp.close()


def sender_trace() -> tuple[str, str, str]:
    """(trace id, span id, traceparent) of a sender's send span, sampled."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def send_traced(pair: PgPair, count: int, **headers: str) -> dict[str, tuple[str, str]]:
    """`count` messages, each in a trace of its own: message id -> (trace id, span id)."""
    traces: dict[str, tuple[str, str]] = {}
    for _ in range(count):
        trace_id, span_id, traceparent = sender_trace()
        [message_id] = pair.send(1, traceparent=traceparent, tracestate="vendor=x", **headers)
        traces[message_id] = (trace_id, span_id)
    return traces


def assert_child_of(span: ReceivedSpan, trace: tuple[str, str]) -> None:
    assert (span.trace_id, span.parent_span_id) == trace, span
    assert span.span_id != trace[1]


def test_each_forwarded_message_has_a_span_under_its_senders_span_and_headers_are_unchanged(
    pg_pair_factory: Callable[..., PgPair], start_daemon: Any, receiver: OtlpReceiver
) -> None:
    pair = pg_pair_factory(**TRACING)
    traces = send_traced(pair, 3)
    new_trace_id, new_span_id, new_traceparent = sender_trace()
    [new_trace] = pair.send(1, traceparent=new_traceparent, **{START_NEW_TRACE: "True"})
    [untraced] = pair.send(1)
    daemon = start_daemon(pair.config, env=receiver.env())
    receiver.wait_for(5)
    for message_id, trace in traces.items():
        [span] = receiver.spans_of(message_id)
        assert_child_of(span, trace)
        assert span.name == f"send {pair.queue}" and span.kind == CLIENT
        assert span.attributes == {
            "messaging.system": "nservicebus_sql",
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": pair.queue,
            "messaging.message.id": message_id,
            "sfbridge.forwarder": "sender",
            "sfbridge.source": "queue",
            "sfbridge.source.queue": pair.forward,
            "sfbridge.destination.database": "receiver",
            "sfbridge.attempt": 1,
            "sfbridge.outcome": "delivered",
        }
        assert span.events == [] and span.status_code != STATUS_ERROR
        assert span.resource["service.name"] == "sfbridge"
        assert 0 < span.start_ns <= span.end_ns
    # The sender asked for a new trace: a root, linked to the sender's span.
    [linked] = receiver.spans_of(new_trace)
    assert linked.parent_span_id == "" and linked.trace_id != new_trace_id
    assert linked.links == [(new_trace_id, new_span_id)]
    # No trace at all: a root of its own, and still no traceparent on the wire.
    [root] = receiver.spans_of(untraced)
    assert root.parent_span_id == "" and root.links == []
    assert daemon.stop() == 0, daemon.output()
    arrived = {m["headers"]["NServiceBus.MessageId"]: m["headers"] for m in
               pg_nsb_receive_all(pair.receiver, pair.queue)}  # fmt: skip
    for message_id, (trace_id, span_id) in traces.items():
        assert arrived[message_id]["traceparent"] == f"00-{trace_id}-{span_id}-01"
        assert arrived[message_id]["tracestate"] == "vendor=x"
    assert arrived[new_trace][START_NEW_TRACE] == "True"
    assert arrived[new_trace]["traceparent"] == new_traceparent
    assert "traceparent" not in arrived[untraced]


def test_each_subscribers_copy_of_a_published_event_has_its_own_span_under_the_senders(
    pg_pair_factory: Callable[..., PgPair], start_daemon: Any, receiver: OtlpReceiver
) -> None:
    subscribers = ['"public"."Samples.Billing"', '"public"."Samples.Shipping"']
    pair = pg_pair_factory(subscriptions={"Shared.OrderAccepted": subscribers}, **TRACING)
    for queue in subscribers:
        pg_create_queue(pair.receiver, queue)
    trace_id, span_id, traceparent = sender_trace()
    headers = nsb_message_headers(None, traceparent=traceparent)
    headers["NServiceBus.MessageIntent"] = "Publish"
    headers["$.store-and-forward.eventtype"] = "Shared.OrderAccepted, Shared"
    with pg_connect(pair.sender) as connection:
        pg_nsb_send(connection, pair.forward, headers, b"{}")
        connection.commit()
    daemon = start_daemon(pair.config, env=receiver.env())
    receiver.wait_for(2)
    spans = receiver.spans_of(str(headers["NServiceBus.MessageId"]))
    assert sorted(span.name for span in spans) == [f"publish {queue}" for queue in subscribers]
    for span in spans:
        assert_child_of(span, (trace_id, span_id))
        assert span.attributes["messaging.operation.name"] == "publish"
        assert span.attributes["sfbridge.outcome"] == "delivered"
    assert len({span.span_id for span in spans}) == 2
    assert daemon.stop() == 0, daemon.output()
    for queue in subscribers:
        [copy] = pg_nsb_receive_all(pair.receiver, queue)
        assert copy["headers"]["traceparent"] == traceparent


def test_a_retry_after_an_outage_has_a_span_under_the_senders_after_the_one_that_waited(
    tmp_path: Any,
    new_pg_database: Any,
    private_postgres: Any,
    start_daemon: Any,
    receiver: OtlpReceiver,
) -> None:
    with pyodbc.connect(private_postgres.connection_string(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE receiver")
    pair = make_pg_pair(
        tmp_path, new_pg_database(), private_postgres.connection_string("receiver"), **TRACING
    )
    daemon = start_daemon(pair.config, env=receiver.env())
    daemon.wait_for_output(daemon.STARTED)
    private_postgres.kill()
    traces = send_traced(pair, 2)
    wait_until(lambda: pg_count(pair.sender, RETRY_TABLE) == 2, 30, "the messages to wait")
    private_postgres.start()
    wait_until(lambda: pair.delivered() == 2, 60, "delivery after the outage")
    receiver.wait_for(4)
    for message_id, trace in traces.items():
        waited, delivered = receiver.spans_of(message_id)
        for span in (waited, delivered):
            assert_child_of(span, trace)
        assert waited.attributes["sfbridge.outcome"] == "retries-scheduled"
        assert waited.attributes["error.type"] == "outage"
        assert waited.status_code == STATUS_ERROR
        [(name, event)] = waited.events
        assert name == "sfbridge.outage_wait"
        assert event["sfbridge.destination.database"] == "receiver"
        assert event["sfbridge.attempts_spent"] == 0 and event["sfbridge.error"]
        assert delivered.attributes["sfbridge.source"] == "retry"
        assert delivered.attributes["sfbridge.outcome"] == "delivered"
        assert delivered.attributes["sfbridge.attempt"] == 1  # the outage spent none
        assert delivered.start_ns > waited.end_ns
    assert daemon.stop() == 0, daemon.output()


def test_a_message_given_up_on_has_spans_for_its_retry_and_its_move_to_the_error_queue(
    pg_pair_factory: Callable[..., PgPair], start_daemon: Any, receiver: OtlpReceiver
) -> None:
    pair = pg_pair_factory(retries={"max_attempts": 2}, **TRACING)
    missing = '"public"."Samples.Missing"'
    [(message_id, trace)] = send_traced(pair, 1, destination=missing).items()
    daemon = start_daemon(pair.config, env=receiver.env())
    wait_until(lambda: pg_count(pair.sender, ERROR_QUEUE) == 1, 30, "the error queue")
    receiver.wait_for(2)
    retried, given_up = receiver.spans_of(message_id)
    for span in (retried, given_up):
        assert_child_of(span, trace)
        assert span.name == f"send {missing}" and span.status_code == STATUS_ERROR
    assert retried.attributes["sfbridge.outcome"] == "retries-scheduled"
    [(name, event)] = retried.events
    assert name == "sfbridge.retry_scheduled" and event["sfbridge.attempts_spent"] == 1
    assert given_up.attributes["sfbridge.attempt"] == 2
    assert given_up.attributes["sfbridge.outcome"] == "sent-to-error-queue"
    assert given_up.attributes["error.type"] == "missing-queue"
    [(name, event)] = given_up.events
    assert name == "sfbridge.sent_to_error_queue"
    assert event["sfbridge.failure.code"] == "missing-queue"
    assert daemon.stop() == 0, daemon.output()


def test_worker_processes_export_their_spans_and_sigterm_sends_what_is_queued(
    pg_pair_factory: Callable[..., PgPair], start_daemon: Any, receiver: OtlpReceiver
) -> None:
    pair = pg_pair_factory(
        forwarder={"concurrency": 2, "batch_size": 10}, daemon={"processes": 2}, **TRACING
    )
    traces = send_traced(pair, 200)
    # Spans leave only when 512 are queued, or at the flush on SIGTERM.
    daemon = start_daemon(pair.config, env=receiver.env(OTEL_BSP_SCHEDULE_DELAY="600000"))
    daemon.wait_for_output("in process 2 of 2")
    wait_until(lambda: pair.delivered() == 200, 30, "delivery")
    assert daemon.stop() == 0, daemon.output()
    spans = receiver.received()
    assert sorted(span.message_id or "" for span in spans) == sorted(traces)
    for span in spans:
        assert_child_of(span, traces[span.message_id or ""])
    # Both processes forwarded, each with a provider of its own.
    assert len({span.resource["process.pid"] for span in spans}) == 2


def test_sigterm_does_not_wait_long_for_a_collector_that_does_not_answer(
    pg_pair_factory: Callable[..., PgPair], start_daemon: Any, receiver: OtlpReceiver
) -> None:
    pair = pg_pair_factory(**TRACING)
    receiver.stall.set()
    send_traced(pair, 5)
    daemon = start_daemon(pair.config, env=receiver.env(OTEL_EXPORTER_OTLP_TIMEOUT="60000"))
    wait_until(lambda: pair.delivered() == 5, 30, "delivery")
    wait_until(lambda: receiver.requests >= 1, 30, "an export that hangs")
    started = time.monotonic()
    assert daemon.stop() == 0, daemon.output()
    assert time.monotonic() - started < 15
    assert "the collector took over" in daemon.output()


def test_with_tracing_off_nothing_is_exported_even_with_otel_variables_set(
    pg_pair: PgPair, start_daemon: Any, receiver: OtlpReceiver
) -> None:
    traces = send_traced(pg_pair, 3)
    daemon = start_daemon(pg_pair.config, env=receiver.env())
    wait_until(lambda: pg_pair.delivered() == 3, 30, "delivery")
    # A tracing daemon would export at the latest when it stops.
    assert daemon.stop() == 0, daemon.output()
    assert receiver.requests == 0 and len(traces) == 3
