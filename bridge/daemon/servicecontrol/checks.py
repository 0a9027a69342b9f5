"""What each of the bridge's custom checks reports, from what was observed: pure, no database.

Every check is in the category `sfbridge` and named after what it watches:

- `sfbridge destination <database>`, for each database that routes or proxies deliver to:
  fails while it cannot be reached, takes no writes (read-only), refuses the bridge's login,
  or lacks the bridge's ledger where the bridge may not create it;
- `sfbridge forwarder <name>`, for each forwarder: fails while it is paused (or its deliveries
  to a database are), and while its batches fail (`bridge.daemon.forwarder_health`);
- `sfbridge error queue <forwarder>`: fails when the forwarder moved messages to its error
  queue since the check before, and passes again after one check without new ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from bridge.config.durations import format_duration
from bridge.daemon.forwarder_health import ForwarderState
from bridge.daemon.servicecontrol.messages import CheckResult
from bridge.secrets import mask_secrets
from bridge.storage.pauses import PauseState

__all__ = [
    "CATEGORY",
    "DestinationTrouble",
    "destination_check_id",
    "destination_result",
    "error_queue_check_id",
    "error_queue_result",
    "forwarder_check_id",
    "forwarder_result",
]

CATEGORY = "sfbridge"

TroubleKind = Literal["unreachable", "read-only", "auth-failed", "not-ready"]


@dataclass(frozen=True)
class DestinationTrouble:
    """What is wrong with a destination database: its kind, the error as the bridge words it
    (without the `database '...': ` it starts with) and the refused login's user, if any."""

    kind: TroubleKind
    detail: str
    login: str | None = None


def destination_check_id(database: str) -> str:
    return f"sfbridge destination {database}"


def forwarder_check_id(forwarder: str) -> str:
    return f"sfbridge forwarder {forwarder}"


def error_queue_check_id(forwarder: str) -> str:
    return f"sfbridge error queue {forwarder}"


def _result(check_id: str, reason: str | None) -> CheckResult:
    # A reason is shown in ServicePulse: no password may reach it, whatever an error said.
    return CheckResult(check_id, CATEGORY, None if reason is None else mask_secrets(reason))


def destination_result(database: str, trouble: DestinationTrouble | None) -> CheckResult:
    """The check of destination `database`: passed without `trouble`."""
    if trouble is None:
        return _result(destination_check_id(database), None)
    detail = trouble.detail.removeprefix(f"database '{database}': ")
    if trouble.kind == "auth-failed":
        who = f" (user '{trouble.login}')" if trouble.login else ""
        reason = (
            f"database '{database}' refuses the bridge's login{who}: {detail}; fix the login "
            "or its password and reload the daemon (messages for it wait in retry storage)"
        )
    elif trouble.kind == "read-only":
        reason = (
            f"database '{database}' does not accept writes (read-only; a standby after a "
            f"failover?): {detail}; messages for it wait in retry storage"
        )
    elif trouble.kind == "not-ready":
        reason = f"database '{database}' is not ready for the bridge: {detail}"
    else:
        reason = (
            f"database '{database}' cannot be reached: {detail}; messages for it wait in "
            "retry storage"
        )
    return _result(destination_check_id(database), reason)


def forwarder_result(
    forwarder: str, pauses: PauseState | None, health: ForwarderState | None
) -> CheckResult:
    """The check of `forwarder`: failed while it is paused (whole, or for some destination
    databases; `pauses` None: not known) or its batches fail (`health`)."""
    reasons: list[str] = []
    if pauses is not None and pauses.forwarder is not None:
        reasons.append(
            f"forwarder '{forwarder}' is {pauses.forwarder.describe()} "
            f"(`sfbridge resume {forwarder}` resumes it)"
        )
    elif pauses is not None:
        for database, pause in sorted(pauses.destinations.items()):
            reasons.append(
                f"forwarder '{forwarder}''s deliveries to database '{database}' are "
                f"{pause.describe()}"
            )
    if health is not None and health.failing:
        reasons.append(
            f"forwarder '{forwarder}' cannot forward since {_utc(health.since)} "
            f"({health.failures} failed batch(es)): {health.last_error}; its messages stay queued"
        )
    return _result(forwarder_check_id(forwarder), "; ".join(reasons) or None)


def error_queue_result(
    forwarder: str, error_queue: str, before: int | None, now: int, interval: float
) -> CheckResult:
    """The error-queue check of `forwarder`: failed when it holds more of the forwarder's
    messages (`now`) than at the check before (`before`; None: this is the first look)."""
    if before is None or now <= before:
        return _result(error_queue_check_id(forwarder), None)
    return _result(
        error_queue_check_id(forwarder),
        f"forwarder '{forwarder}' moved {now - before} message(s) to error queue "
        f"'{error_queue}' in the last {format_duration(interval)} ({now} of its messages are "
        f"there); `sfbridge errors summary --forwarder {forwarder}` says why",
    )


def _utc(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"
