"""Whether a daemon process traces, and its tracer's life: made at start, flushed at stop.

With `tracing.enabled` every process of the daemon (its own, and each worker process of
`daemon.processes`) makes its own tracer provider and OTLP exporter (`bridge.daemon.otel`),
configured by the standard `OTEL_*` environment variables, and hands it to its pool workers,
which tell it each committed batch's hops (`bridge.forwarding.hops`). Off, OpenTelemetry is
never imported and the data path works nothing out for it. Stopping waits for the spans still
queued at most `FLUSH_SECONDS`: a collector that does not answer must not hold up SIGTERM.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Protocol

from bridge.config.model import BridgeConfig
from bridge.exceptions import TracingUnavailable
from bridge.forwarding.hops import CommittedBatch

log = logging.getLogger(__name__)

# How long stopping waits for the spans still queued to be exported, at most.
FLUSH_SECONDS = 5.0


class ProcessTracer(Protocol):
    """A `HopTracer` that one process owns, and closes when it stops."""

    def traced(self, batch: CommittedBatch) -> None: ...

    def shutdown(self) -> None:
        """Export what is queued and stop exporting; may block on the collector."""


def start_tracing(config: BridgeConfig, *, quiet: bool = False) -> ProcessTracer | None:
    """This process's tracer, or None when `tracing.enabled` is off, or the standard variables
    turn the SDK off (`OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none`; logged unless
    `quiet`, as in worker processes, where the daemon has said it).

    Raises TracingUnavailable when OpenTelemetry is not installed."""
    if not config.tracing.enabled:
        return None
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        if not quiet:
            log.warning("tracing.enabled is set, but OTEL_SDK_DISABLED=true: no traces")
        return None
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if exporter == "none":
        if not quiet:
            log.warning("tracing.enabled is set, but OTEL_TRACES_EXPORTER=none: no traces")
        return None
    try:
        from bridge.daemon import otel  # loaded only when tracing is on
    except ImportError as error:
        raise TracingUnavailable(
            f"tracing.enabled is set, but OpenTelemetry cannot be loaded ({error})",
            advice="install the otel extra (pip install 'sfbridge[otel]') or set "
            "tracing.enabled: false",
        ) from None
    tracer = otel.OtlpHopTracer(exporter)
    if not quiet:
        log.info("tracing: every forwarded message is traced, exported to %s", tracer.endpoint)
    return tracer


def stop_tracing(tracer: ProcessTracer | None, timeout: float = FLUSH_SECONDS) -> None:
    """Export the spans still queued, waiting at most `timeout` seconds; what is not out by
    then is dropped (logged)."""
    if tracer is None:
        return
    done = threading.Thread(target=tracer.shutdown, name="tracing-flush", daemon=True)
    done.start()
    done.join(timeout)
    if done.is_alive():
        log.warning(
            "tracing: the collector took over %.0f s to take the last spans; leaving without them",
            timeout,
        )
