"""Logging and crash reporting, both scrubbed of secrets.

Log lines go to stderr as text (`logging.format: text`), as one JSON object a line (`json`),
or straight into systemd's journal with fields of their own (`journal`,
`bridge.daemon.journal`); `auto`, the default, is `journal` where stderr is the journal's
stream and `text` elsewhere. Every format gets the record after `SecretMaskingFilter`.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from bridge.config.model import SentryConfig
from bridge.daemon.journal import JournalHandler, under_journald
from bridge.messages import FIELDS
from bridge.secrets import inert, mask_secrets

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class SecretMaskingFilter(logging.Filter):
    """Masks passwords in every record, whatever a driver or library put in the message, and
    escapes the control characters of its arguments (`bridge.secrets.inert`): they carry what
    messages and databases say (destinations, headers, errors quoting either), and a line break
    or an escape sequence there would forge log lines or act on the terminal reading the
    journal. The format string is the bridge's own and keeps its line breaks."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_inert_argument(argument) for argument in record.args)
        elif isinstance(record.args, dict):
            record.args = {key: _inert_argument(value) for key, value in record.args.items()}
        message = record.getMessage()
        masked = mask_secrets(message)
        if masked != message or record.args:
            record.msg, record.args = masked, None
        if record.exc_info and record.exc_info[1] is not None:
            # Render the traceback now so it can be masked too.
            formatted = logging.Formatter().formatException(record.exc_info)
            record.exc_text = mask_secrets(formatted)
            record.exc_info = None
        return True


def _inert_argument(argument: Any) -> Any:
    if argument is None or isinstance(argument, int | float):
        return argument  # for %d and %f, and nothing to escape
    return inert(str(argument))


class JsonFormatter(logging.Formatter):
    """One JSON object a line: `time` (UTC, ISO 8601), `level`, `logger`, `message`, the
    fields of `bridge.messages` a line has (`forwarder`, `database`, `MessageIds`,
    `error_code`) and `exception` (a traceback). Whatever a value holds, the line stays one
    line: JSON escapes line breaks and control characters, and `ensure_ascii` the Unicode
    line separators too, which some readers split lines at."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for attribute, (name, _) in FIELDS.items():
            value = getattr(record, attribute, None)
            if isinstance(value, list):
                line[name] = [inert(mask_secrets(str(item))) for item in value]
            elif value is not None:
                line[name] = inert(mask_secrets(str(value)))
        if record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=True)


def log_handler(log_format: str) -> logging.Handler:
    """The handler of `logging.format` (`auto`, `text`, `json`, `journal`), with the secret
    filter. `journal` where stderr is not the journal's stream writes text."""
    text = logging.StreamHandler(sys.stderr)
    text.setFormatter(logging.Formatter(TEXT_FORMAT, "%Y-%m-%d %H:%M:%S"))
    handler: logging.Handler = text
    if log_format == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
    elif log_format in ("journal", "auto") and under_journald():
        handler = JournalHandler(fallback=text)
    handler.addFilter(SecretMaskingFilter())
    return handler


def setup_logging(level: str, *, verbose: bool = False, log_format: str = "auto") -> None:
    """Log to stderr or the journal (`log_handler`) through the secret filter."""
    handler = log_handler(log_format)
    root = logging.getLogger()
    for replaced in root.handlers:
        replaced.close()
    root.handlers[:] = [handler]
    root.setLevel("DEBUG" if verbose else level)
    # APScheduler narrates every job run at INFO; that is noise for operators.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


def scrub_event(event: Any, hint: Any = None) -> Any:
    """Sentry `before_send`: mask secrets anywhere in the event (messages, values, frames)."""
    return _scrub(event)


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return mask_secrets(value)
    if isinstance(value, dict):
        return {key: _scrub(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_scrub(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_scrub(item) for item in value)
    return value


def setup_sentry(config: SentryConfig) -> bool:
    """Start Sentry crash reporting when a DSN is configured. True if started."""
    if not config.dsn:
        return False
    import sentry_sdk

    from bridge import __version__

    sentry_sdk.init(
        dsn=config.dsn,
        environment=config.environment,
        release=f"sfbridge@{__version__}",
        # Local variables can hold connection strings; masking every frame is not enough
        # guarantee, so they are not sent at all.
        include_local_variables=False,
        before_send=scrub_event,
        before_breadcrumb=lambda crumb, hint: _scrub(crumb),
    )
    return True


def report_exception(error: BaseException) -> None:
    """Send an unexpected exception to Sentry if it is set up; never raises."""
    try:
        import sentry_sdk

        sentry_sdk.capture_exception(error)
    except Exception:  # a failing observer must never stop delivery
        logging.getLogger(__name__).debug("could not report exception to Sentry", exc_info=True)


def flush_sentry(timeout: float = 2.0) -> None:
    """Send what Sentry still holds, for at most `timeout` seconds; never raises."""
    try:
        import sentry_sdk

        if sentry_sdk.is_initialized():
            sentry_sdk.flush(timeout=timeout)
    except Exception:
        logging.getLogger(__name__).debug("could not flush Sentry", exc_info=True)
