"""What a log line is about, beside its text: the forwarder, the database, the messages
(`NServiceBus.MessageId`s) and an error code, for the structured log formats
(`logging.format: json` and `journal`, `bridge.daemon.observability`) to carry as fields of
their own. The text format shows only the message, which already says all of it in words.

Pass them as `extra=about(...)` to a logging call. They are kept in attributes prefixed
`sfbridge_` so that they never collide with a `LogRecord` attribute of the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

FORWARDER = "sfbridge_forwarder"
DATABASE = "sfbridge_database"
MESSAGE_IDS = "sfbridge_message_ids"
ERROR_CODE = "sfbridge_error_code"

# Record attribute -> the field's name in a JSON line and in a journal entry.
FIELDS: Mapping[str, tuple[str, str]] = {
    FORWARDER: ("forwarder", "FORWARDER"),
    DATABASE: ("database", "DATABASE"),
    MESSAGE_IDS: ("MessageIds", "MESSAGE_IDS"),
    ERROR_CODE: ("error_code", "ERROR_CODE"),
}


def about(
    *,
    forwarder: str | None = None,
    database: str | None = None,
    message_ids: Sequence[str] | None = None,
    error_code: str | None = None,
) -> dict[str, Any]:
    """The `extra` of a logging call: only what is known (None is left out)."""
    given: dict[str, Any] = {
        FORWARDER: forwarder,
        DATABASE: database,
        MESSAGE_IDS: list(message_ids) if message_ids is not None else None,
        ERROR_CODE: error_code,
    }
    return {key: value for key, value in given.items() if value is not None}
