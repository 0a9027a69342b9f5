"""When to try a failed delivery again, and when to give up. Pure."""

from __future__ import annotations

from datetime import datetime, timedelta

from bridge.config.model import RetryConfig


def delay_before_attempt(attempts_made: int, policy: RetryConfig) -> float:
    """Seconds to wait after `attempts_made` failed attempts (>= 1) before the next one.

    constant: `delay` every time (the seed sample's "every 10 s"); linear: `delay` times the
    attempt number (NServiceBus `TimeIncrease`); exponential: `delay` doubled each attempt.
    Always capped at `max_delay`.
    """
    if attempts_made < 1:
        raise ValueError("attempts_made starts at 1")
    if policy.backoff == "constant":
        delay = policy.delay
    elif policy.backoff == "linear":
        delay = policy.delay * attempts_made
    else:
        # Bound the exponent so huge attempt counts cannot overflow a float.
        delay = policy.delay * 2.0 ** min(attempts_made - 1, 62)
    return min(delay, policy.max_delay)


def gives_up_after(attempts_made: int, policy: RetryConfig) -> bool:
    """True when `attempts_made` delivery attempts have used up the policy."""
    return attempts_made >= policy.max_attempts


def waited_too_long(first_failure_at: datetime, now: datetime, policy: RetryConfig) -> bool:
    """True when a message waiting out an outage has waited `max_wait` or longer."""
    return (now - first_failure_at).total_seconds() >= policy.max_wait


def next_attempt_at(now: datetime, attempts_made: int, policy: RetryConfig) -> datetime:
    """The moment the next attempt is due."""
    return now + timedelta(seconds=delay_before_attempt(attempts_made, policy))
