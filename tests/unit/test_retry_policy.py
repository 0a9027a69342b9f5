"""Specification of the delayed-retry policy (bridge.retry_policy)."""

from __future__ import annotations

import math
import sys
from datetime import UTC, datetime, timedelta

import pytest

from bridge.config.model import RetryConfig
from bridge.retry_policy import (
    delay_before_attempt,
    gives_up_after,
    next_attempt_at,
)

HUGE_ATTEMPTS = [63, 64, 1_000, 1_000_000, 2**31 - 1, 2**63 - 1, sys.maxsize]

# --------------------------------------------------------------------------------------------
# Defaults
# --------------------------------------------------------------------------------------------


def test_the_default_policy_retries_every_10_seconds_up_to_100_attempts() -> None:
    policy = RetryConfig()
    assert policy.backoff == "constant"
    assert policy.delay == 10.0
    assert policy.max_attempts == 100
    assert policy.max_delay == 3600.0


# --------------------------------------------------------------------------------------------
# constant
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attempts", [1, 2, 3, 50, 99, 100])
def test_constant_backoff_waits_the_same_delay_after_every_attempt(attempts: int) -> None:
    assert delay_before_attempt(attempts, RetryConfig(delay=10, backoff="constant")) == 10


def test_constant_backoff_is_capped_at_max_delay() -> None:
    policy = RetryConfig(delay=120, max_delay=30, backoff="constant")
    assert delay_before_attempt(1, policy) == 30


def test_a_zero_delay_retries_at_once() -> None:
    policy = RetryConfig(delay=0)
    assert delay_before_attempt(1, policy) == 0


def test_fractional_delays_are_kept() -> None:
    assert delay_before_attempt(3, RetryConfig(delay=0.25)) == 0.25


# --------------------------------------------------------------------------------------------
# linear
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("attempts", "expected"), [(1, 10), (2, 20), (3, 30), (10, 100)])
def test_linear_backoff_grows_by_the_delay_each_attempt(attempts: int, expected: float) -> None:
    policy = RetryConfig(delay=10, backoff="linear", max_delay=3600)
    assert delay_before_attempt(attempts, policy) == expected


def test_linear_backoff_is_capped_at_max_delay() -> None:
    policy = RetryConfig(delay=10, backoff="linear", max_delay=45)
    assert [delay_before_attempt(n, policy) for n in range(1, 7)] == [10, 20, 30, 40, 45, 45]


# --------------------------------------------------------------------------------------------
# exponential
# --------------------------------------------------------------------------------------------


def test_exponential_backoff_doubles_the_delay_each_attempt() -> None:
    policy = RetryConfig(delay=1, backoff="exponential", max_delay=1_000_000)
    assert [delay_before_attempt(n, policy) for n in range(1, 8)] == [1, 2, 4, 8, 16, 32, 64]


def test_exponential_backoff_starts_at_the_delay() -> None:
    policy = RetryConfig(delay=10, backoff="exponential")
    assert delay_before_attempt(1, policy) == 10
    assert delay_before_attempt(2, policy) == 20


def test_exponential_backoff_is_capped_at_max_delay() -> None:
    policy = RetryConfig(delay=10, backoff="exponential", max_delay=100)
    assert [delay_before_attempt(n, policy) for n in range(1, 7)] == [10, 20, 40, 80, 100, 100]


def test_the_cap_applies_exactly_at_max_delay() -> None:
    policy = RetryConfig(delay=25, backoff="exponential", max_delay=100)
    assert delay_before_attempt(3, policy) == 100
    assert delay_before_attempt(4, policy) == 100


# --------------------------------------------------------------------------------------------
# Huge attempt numbers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backoff", ["constant", "linear", "exponential"])
@pytest.mark.parametrize("attempts", HUGE_ATTEMPTS)
def test_huge_attempt_numbers_do_not_overflow_and_stay_capped(backoff: str, attempts: int) -> None:
    policy = RetryConfig(delay=100, backoff=backoff, max_delay=3600)  # type: ignore[arg-type]
    delay = delay_before_attempt(attempts, policy)
    assert delay == (100 if backoff == "constant" else 3600)
    assert math.isfinite(delay)


@pytest.mark.parametrize("attempts", HUGE_ATTEMPTS)
def test_huge_exponential_delays_stay_finite_even_without_a_useful_cap(attempts: int) -> None:
    policy = RetryConfig(delay=10, backoff="exponential", max_delay=float("inf"))
    delay = delay_before_attempt(attempts, policy)
    assert math.isfinite(delay)
    assert delay >= 10 * 2.0**62


def test_next_attempt_at_for_a_huge_attempt_number_is_the_cap() -> None:
    now = datetime(2024, 1, 1)
    policy = RetryConfig(delay=1, backoff="exponential", max_delay=60)
    assert next_attempt_at(now, 2**63 - 1, policy) == now + timedelta(seconds=60)


# --------------------------------------------------------------------------------------------
# attempts_made must be at least 1
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backoff", ["constant", "linear", "exponential"])
@pytest.mark.parametrize("attempts", [0, -1, -(2**63)])
def test_attempts_made_below_one_is_refused(backoff: str, attempts: int) -> None:
    policy = RetryConfig(backoff=backoff)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="starts at 1"):
        delay_before_attempt(attempts, policy)


def test_next_attempt_at_refuses_attempts_below_one_too() -> None:
    with pytest.raises(ValueError):
        next_attempt_at(datetime(2024, 1, 1), 0, RetryConfig())


# --------------------------------------------------------------------------------------------
# gives_up_after
# --------------------------------------------------------------------------------------------


def test_gives_up_exactly_when_max_attempts_have_been_made() -> None:
    policy = RetryConfig(max_attempts=5)
    assert [gives_up_after(n, policy) for n in range(1, 8)] == [
        False,
        False,
        False,
        False,
        True,
        True,
        True,
    ]


def test_the_default_policy_gives_up_after_the_hundredth_attempt() -> None:
    assert gives_up_after(99, RetryConfig()) is False
    assert gives_up_after(100, RetryConfig()) is True


def test_a_single_attempt_policy_gives_up_after_the_first_failure() -> None:
    assert gives_up_after(1, RetryConfig(max_attempts=1)) is True


def test_giving_up_does_not_depend_on_the_backoff() -> None:
    for backoff in ("constant", "linear", "exponential"):
        policy = RetryConfig(max_attempts=3, backoff=backoff)  # type: ignore[arg-type]
        assert gives_up_after(2, policy) is False
        assert gives_up_after(3, policy) is True


# --------------------------------------------------------------------------------------------
# next_attempt_at
# --------------------------------------------------------------------------------------------


def test_next_attempt_is_now_plus_the_delay() -> None:
    now = datetime(2024, 5, 1, 12, 0, 0, 500_000)
    policy = RetryConfig(delay=10, backoff="linear")
    assert next_attempt_at(now, 3, policy) == datetime(2024, 5, 1, 12, 0, 30, 500_000)


def test_next_attempt_keeps_the_time_zone_of_now() -> None:
    now = datetime(2024, 5, 1, 23, 59, 55, tzinfo=UTC)
    due = next_attempt_at(now, 1, RetryConfig(delay=10))
    assert due == datetime(2024, 5, 2, 0, 0, 5, tzinfo=UTC)
    assert due.tzinfo is UTC


def test_next_attempt_honours_fractional_seconds() -> None:
    now = datetime(2024, 1, 1)
    assert next_attempt_at(now, 1, RetryConfig(delay=1.5)) == now + timedelta(seconds=1.5)


def test_a_message_waiting_out_an_outage_waits_until_max_wait_from_its_first_failure() -> None:
    from datetime import datetime, timedelta

    from bridge.retry_policy import waited_too_long

    policy = RetryConfig(during_outage="wait", max_wait=3600.0)
    first = datetime(2026, 11, 23, 12, 0, 0)
    assert not waited_too_long(first, first, policy)
    assert not waited_too_long(first, first + timedelta(seconds=3599.9), policy)
    assert waited_too_long(first, first + timedelta(seconds=3600), policy)
    assert waited_too_long(first, first + timedelta(days=3), policy)
