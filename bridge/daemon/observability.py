"""Logging and crash reporting, both scrubbed of secrets."""

from __future__ import annotations

import logging
import sys
from typing import Any

from bridge.config.model import SentryConfig
from bridge.secrets import inert, mask_secrets


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


def setup_logging(level: str, *, verbose: bool = False) -> None:
    """Log to stderr (journald picks it up under systemd) through the secret filter."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S")
    )
    handler.addFilter(SecretMaskingFilter())
    root = logging.getLogger()
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
