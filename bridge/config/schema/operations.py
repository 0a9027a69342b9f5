"""The schema's sections about running the daemon: `daemon`, `logging`, `sentry`, `metrics` and
`tracing`."""

from __future__ import annotations

from bridge.config.keys import Key, Section
from bridge.config.model import (
    DaemonConfig,
    LoggingConfig,
    MetricsConfig,
    SentryConfig,
    TracingConfig,
)

DAEMON = Section(
    name="daemon",
    shape="mapping",
    model=DaemonConfig,
    description=(
        "The running daemon itself. Each daemon records itself in every forwarding database "
        "(`sfbridge_daemons`): host, process id, when it started, its last heartbeat, its "
        "configuration's fingerprint and the forwarders it serves, and `stopped` when it stops "
        "cleanly; `sfbridge status` reads it."
    ),
    keys=(
        Key(
            "heartbeat",
            "duration",
            "How often a running daemon records that it is alive. `status` calls a daemon "
            "`missing` (killed, or its host or database gone) after two and a half heartbeats "
            "without one, so 5s tells a killed daemon within 12.5 s of its last heartbeat for "
            "one small write per forwarding database every 5 s; a warning outside 1s..60s.",
            example="5s",
            default=5.0,
            minimum=0,
            exclusive_minimum=True,
            warn_outside=(1.0, 60.0),
        ),
        Key(
            "processes",
            "string",
            "How many processes run the workers: `auto` (one per CPU the daemon may use, by "
            "its CPU affinity and its cgroups' CPU quota rounded up, at most 4, never more "
            "than the largest worker pool) or a number. Python runs one "
            "thread at a time per process, so one process forwards on little more than one "
            "core. The workers of every pool and each forwarder's `concurrency` are dealt out "
            "among the processes, with no more connections in all; the daemon's own process "
            "keeps the watchers, upkeep, heartbeats, metrics and systemd.",
            example="auto",
            default="auto",
            pattern=r"auto|[1-9]|1[0-6]",
            pattern_message="must be auto or a number from 1 to 16",
            numbers_as_text=True,
        ),
    ),
)

LOGGING = Section(
    name="logging",
    shape="mapping",
    model=LoggingConfig,
    description="Log output.",
    keys=(
        Key(
            "level",
            "choice",
            "Least severe level that is logged.",
            example="INFO",
            default="INFO",
            choices=("DEBUG", "INFO", "WARNING", "ERROR"),
            case_insensitive=True,
        ),
        Key(
            "repeats",
            "duration",
            "How long a failure that repeats is told once: the first batch of messages moved "
            "to the error queue for a reason is logged with its count and a few "
            "`NServiceBus.MessageId`s; further batches for the same reason within this time "
            "are summed into one line when it ends (`... and 1,998 more in the last 1m`).",
            example="1m",
            default=60.0,
            minimum=1,
        ),
        Key(
            "format",
            "choice",
            "How log lines are written: `text` (a line of words on stderr), `json` (one JSON "
            "object a line on stderr: `time`, `level`, `logger`, `message`, and where a line "
            "has them `forwarder`, `database`, `MessageIds`, `error_code`, `exception`), "
            "`journal` (straight into systemd's journal, with the fields `PRIORITY`, `LOGGER`, "
            "`FORWARDER`, `DATABASE`, `MESSAGE_IDS`, `ERROR_CODE`), or `auto`: `journal` where "
            "stderr is the journal's stream (a systemd service), else `text`. `journal` "
            "elsewhere writes text. Every command's log lines follow it; what a command prints "
            "(`status`, `check`) does not.",
            example="auto",
            default="auto",
            choices=("auto", "text", "json", "journal"),
        ),
    ),
)

SENTRY = Section(
    name="sentry",
    shape="mapping",
    model=SentryConfig,
    description="Error reporting to Sentry; an empty or absent `dsn` disables it.",
    keys=(
        Key(
            "dsn",
            "string",
            "Sentry DSN; `${VAR}` is expanded (needed only by `run`); empty means no Sentry.",
            example="${SENTRY_DSN:-}",
            default=None,
            expand_env=True,
            secret=True,
            empty_is_none=True,
            # Only the shape: sentry-sdk checks the rest when it starts, with its own message.
            pattern=r"https?://[^\s@/]+@[^\s/]+/\S+",
            pattern_message="is not a Sentry DSN: expected https://<key>@<host>/<project>",
        ),
        Key(
            "environment",
            "string",
            "Environment name attached to Sentry events; empty means none.",
            example="production",
            default=None,
            empty_is_none=True,
        ),
    ),
)

METRICS = Section(
    name="metrics",
    shape="mapping",
    model=MetricsConfig,
    description="Prometheus metrics, served by `sfbridge run` at `/metrics`; off without `listen`.",
    keys=(
        Key(
            "listen",
            "listen",
            "Address and port the daemon serves `/metrics` on. Keep it on loopback or a "
            "management network: the page names forwarders, databases and queues (never "
            "connection strings); a wildcard (`0.0.0.0`, `[::]`) draws a warning saying so. "
            "Changing it takes a restart, not a reload.",
            example="127.0.0.1:9464",
            default=None,
        ),
    ),
)

TRACING = Section(
    name="tracing",
    shape="mapping",
    model=TracingConfig,
    description=(
        "OpenTelemetry traces of the forwarding hop: one span per forwarded message (per "
        "subscriber copy of a published event), under the trace its sender started "
        "(`traceparent`), exported over OTLP as the standard `OTEL_*` environment variables "
        "say (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_TRACES_SAMPLER`, ...); needs the `otel` "
        "extra (`pip install 'sfbridge[otel]'`). Headers are forwarded unchanged either way. "
        "See [tracing](operating.md#tracing-opentelemetry)."
    ),
    keys=(
        Key(
            "enabled",
            "boolean",
            "Trace every forwarded message. Off, the daemon does not load OpenTelemetry and "
            "does no work per message for it. Changing it takes a restart, not a reload.",
            example=True,
            default=False,
        ),
    ),
)
