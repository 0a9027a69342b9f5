"""Failed messages in groups (`bridge.commands.failure_groups`): pure."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bridge.commands.failed_messages import FailedMessage
from bridge.commands.failure_groups import (
    group_value,
    message_type,
    parse_group,
    summarize,
)
from bridge.exceptions import RequestError
from bridge.headers import parse_wire_date


def failed(reason: str | None, failed_at: str | None, **headers: str) -> FailedMessage:
    values: dict[str, str | None] = dict(headers)
    if reason is not None:
        values["$.sfbridge.failure-reason"] = reason
    if failed_at is not None:
        values["NServiceBus.TimeOfFailure"] = failed_at
    return FailedMessage("id", 1, values, forwarder="orders")


def nowhere(message: FailedMessage) -> str | None:
    return None


def test_groups_are_largest_first_with_their_first_and_last_failure() -> None:
    messages = [
        (failed("unroutable", "2026-11-27 09:30:12:000000 Z"), nowhere),
        (failed("delivery-failed", "2026-11-27 09:30:00:000000 Z"), nowhere),
        (failed("delivery-failed", "2026-11-27 10:00:00:000000 Z"), nowhere),
        (failed("delivery-failed", "2026-11-27 09:00:00:5 Z"), nowhere),
        (failed("delivery-failed", "not a date"), nowhere),
        (failed("delivery-failed", "2026-11-27 09:45:00:000000 Z"), nowhere),
        (FailedMessage("p", 2, None, poison="bad JSON"), nowhere),
    ]
    groups = summarize("reason", messages)
    assert [(g.name, g.count, g.replayable) for g in groups] == [
        ("reason:delivery-failed", 5, 5),
        ("reason:poison", 1, 0),
        ("reason:unroutable", 1, 1),
    ]
    assert groups[0].first_failure == datetime(2026, 11, 27, 9, 0, 0, 500000, tzinfo=UTC)
    assert groups[0].last_failure == datetime(2026, 11, 27, 10, tzinfo=UTC)
    assert groups[1].first_failure is None and groups[1].last_failure is None


def test_each_grouping_reads_its_value_and_none_when_missing() -> None:
    message = failed(
        "unroutable",
        None,
        **{
            "NServiceBus.ExceptionInfo.ExceptionType": "System.TimeoutException",
            "NServiceBus.EnclosedMessageTypes": "Shared.OrderSubmitted, Shared, Version=1.0.0.0;"
            "Shared.IEvent, Shared",
        },
    )
    assert group_value("exception", message, None) == "System.TimeoutException"
    assert group_value("type", message, None) == "Shared.OrderSubmitted"
    assert group_value("destination", message, '"public"."Samples.Billing"') == (
        '"public"."Samples.Billing"'
    )
    assert group_value("destination", message, None) == "(none)"
    assert group_value("exception", failed(None, None), None) == "(none)"
    assert message_type(None) is None and message_type(" ; x") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("reason:unroutable", ("reason", "unroutable")),
        (
            "exception:System.Exception: with a colon",
            ("exception", "System.Exception: with a colon"),
        ),
        ("destination:(none)", ("destination", "(none)")),
    ],
)
def test_a_group_is_named_as_summary_prints_it(text: str, expected: tuple[str, str]) -> None:
    assert parse_group(text) == expected


@pytest.mark.parametrize("text", ["unroutable", "colour:red", "reason:", ":x"])
def test_a_group_that_is_no_group_says_how_one_is_named(text: str) -> None:
    with pytest.raises(RequestError, match="BY:VALUE with BY one of reason, destination"):
        parse_group(text)


def test_wire_dates_read_fast_as_strptime_reads_them() -> None:
    assert parse_wire_date("2026-11-21 10:06:20:123456 Z") == datetime(
        2026, 11, 21, 10, 6, 20, 123456, tzinfo=UTC
    )
    assert parse_wire_date("2026-11-21 10:06:20:12 Z") == datetime(
        2026, 11, 21, 10, 6, 20, 120000, tzinfo=UTC
    )
    assert parse_wire_date("2026-13-21 10:06:20:123456 Z") is None
    assert parse_wire_date("2026-11-21T10:06:20Z") is None
