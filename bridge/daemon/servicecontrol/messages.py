"""The wire shape of what NServiceBus's ServiceControl plugins send: pure, no database.

ServiceControl reads its input queue as an NServiceBus endpoint does: the message type from
`NServiceBus.EnclosedMessageTypes` (the bare full name of the plugin's class), the body as
UTF-8 JSON with the plugin's PascalCase property names (matched case-sensitively since
ServiceControl 5.2), dates as System.Text.Json writes them (`2016-02-01T13:59:00Z`: a `T`,
at most 7 fractional digits with trailing zeros trimmed, an upper-case `Z`), GUIDs lower-case
with hyphens. The plugins dispatch straight to the transport, past the pipeline, so the rows
carry four headers only (`NServiceBus.ReplyToAddress` only from an endpoint with an input
queue, which the bridge is not), no `NServiceBus.MessageId` (ServiceControl takes the row's
id) and no `TimeSent`; their time to be received becomes the row's `Expires`.
See docs/operating.md, "ServiceControl".
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from bridge.headers import ENCLOSED_TYPES_HEADER, Headers

__all__ = [
    "CHECK_RESULT_TYPE",
    "HEARTBEAT_TYPE",
    "STARTUP_TYPE",
    "CheckResult",
    "ControlMessage",
    "Instance",
    "check_result_message",
    "heartbeat_message",
    "json_date",
    "startup_message",
]

HEARTBEAT_TYPE = "ServiceControl.Plugin.Heartbeat.Messages.EndpointHeartbeat"
STARTUP_TYPE = "ServiceControl.Plugin.Heartbeat.Messages.RegisterEndpointStartup"
CHECK_RESULT_TYPE = "ServiceControl.Plugin.CustomChecks.Messages.ReportCustomCheckResult"

CONTENT_TYPE_HEADER = "NServiceBus.ContentType"
MESSAGE_INTENT_HEADER = "NServiceBus.MessageIntent"


@dataclass(frozen=True)
class Instance:
    """Who reports: ServiceControl tells instances apart by (`endpoint`, `host_id`), so the
    host id must stay the same across restarts (`bridge.processing_host.host_id_for`)."""

    endpoint: str
    host: str
    host_id: uuid.UUID


@dataclass(frozen=True)
class CheckResult:
    """One custom check's outcome: passed when `failure_reason` is None."""

    check_id: str
    category: str
    failure_reason: str | None = None

    @property
    def has_failed(self) -> bool:
        return self.failure_reason is not None


@dataclass(frozen=True)
class ControlMessage:
    """A message for ServiceControl's queue: its type, body, and how many seconds it may wait
    unread (the row's `Expires` is the time of writing plus that)."""

    message_type: str
    body: bytes
    time_to_be_received: float

    @property
    def headers(self) -> Headers:
        return {
            ENCLOSED_TYPES_HEADER: self.message_type,
            CONTENT_TYPE_HEADER: "application/json",
            MESSAGE_INTENT_HEADER: "Send",
        }


def json_date(moment: datetime) -> str:
    """`moment` (aware, or naive UTC) as System.Text.Json writes a UTC `DateTime`."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    fraction = f"{moment.microsecond:06d}".rstrip("0")
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + (f".{fraction}" if fraction else "") + "Z"


def _body(fields: dict[str, object]) -> bytes:
    # Compact, ASCII-only (as System.Text.Json's default encoder escapes), in the plugin's
    # property order.
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=True).encode("utf-8")


def heartbeat_message(instance: Instance, executed_at: datetime, ttl: float) -> ControlMessage:
    """An `EndpointHeartbeat`: ServiceControl judges liveness by `ExecutedAt`."""
    body = _body(
        {
            "ExecutedAt": json_date(executed_at),
            "EndpointName": instance.endpoint,
            "HostId": str(instance.host_id),
            "Host": instance.host,
        }
    )
    return ControlMessage(HEARTBEAT_TYPE, body, ttl)


def startup_message(
    instance: Instance, started_at: datetime, host_properties: dict[str, str], ttl: float
) -> ControlMessage:
    """A `RegisterEndpointStartup`, sent once when the daemon starts. Its endpoint is named
    `Endpoint`, not `EndpointName` (the plugin's class says so)."""
    body = _body(
        {
            "HostId": str(instance.host_id),
            "Endpoint": instance.endpoint,
            "StartedAt": json_date(started_at),
            "HostProperties": host_properties,
            "HostDisplayName": instance.host,
            "Host": instance.host,
        }
    )
    return ControlMessage(STARTUP_TYPE, body, ttl)


def check_result_message(
    instance: Instance, result: CheckResult, reported_at: datetime, ttl: float
) -> ControlMessage:
    """A `ReportCustomCheckResult`; `FailureReason` is null for a check that passed."""
    body = _body(
        {
            "HostId": str(instance.host_id),
            "CustomCheckId": result.check_id,
            "Category": result.category,
            "HasFailed": result.has_failed,
            "FailureReason": result.failure_reason,
            "ReportedAt": json_date(reported_at),
            "EndpointName": instance.endpoint,
            "Host": instance.host,
        }
    )
    return ControlMessage(CHECK_RESULT_TYPE, body, ttl)
