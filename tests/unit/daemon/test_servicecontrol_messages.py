"""The wire shape of heartbeats, startup registrations and custom-check results, held to the
approved examples of NServiceBus's plugins (see bridge/daemon/servicecontrol/messages.py)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from bridge.daemon.servicecontrol.messages import (
    CHECK_RESULT_TYPE,
    HEARTBEAT_TYPE,
    STARTUP_TYPE,
    CheckResult,
    Instance,
    check_result_message,
    heartbeat_message,
    json_date,
    startup_message,
)

INSTANCE = Instance("My.Endpoint", "Host", uuid.UUID(int=0))
AT = datetime(2016, 2, 1, 13, 59)


def test_a_heartbeat_is_the_plugins_approved_body_byte_for_byte() -> None:
    message = heartbeat_message(INSTANCE, AT, 40.0)
    assert message.body == (
        b'{"ExecutedAt":"2016-02-01T13:59:00Z","EndpointName":"My.Endpoint",'
        b'"HostId":"00000000-0000-0000-0000-000000000000","Host":"Host"}'
    )
    assert message.message_type == HEARTBEAT_TYPE
    assert message.time_to_be_received == 40.0


def test_a_failed_check_is_the_plugins_approved_body_byte_for_byte() -> None:
    result = CheckResult("MyCheckId", "MyCategory", "Failure reason.")
    message = check_result_message(INSTANCE, result, AT, 120.0)
    assert message.body == (
        b'{"HostId":"00000000-0000-0000-0000-000000000000","CustomCheckId":"MyCheckId",'
        b'"Category":"MyCategory","HasFailed":true,"FailureReason":"Failure reason.",'
        b'"ReportedAt":"2016-02-01T13:59:00Z","EndpointName":"My.Endpoint","Host":"Host"}'
    )
    assert message.message_type == CHECK_RESULT_TYPE


def test_a_passed_check_has_no_failure_reason() -> None:
    body = json.loads(check_result_message(INSTANCE, CheckResult("c", "k"), AT, 1.0).body)
    assert body["HasFailed"] is False
    assert body["FailureReason"] is None


def test_the_startup_registration_names_the_endpoint_endpoint_not_endpoint_name() -> None:
    properties = {"Machine": "Host", "ProcessID": "42", "UserName": "sfbridge"}
    body = json.loads(startup_message(INSTANCE, AT, properties, 40.0).body)
    assert body == {
        "HostId": "00000000-0000-0000-0000-000000000000",
        "Endpoint": "My.Endpoint",
        "StartedAt": "2016-02-01T13:59:00Z",
        "HostProperties": properties,
        "HostDisplayName": "Host",
        "Host": "Host",
    }
    assert startup_message(INSTANCE, AT, {}, 40.0).message_type == STARTUP_TYPE


def test_every_message_carries_the_plugins_three_headers_of_a_send_only_sender() -> None:
    for message in (
        heartbeat_message(INSTANCE, AT, 1.0),
        startup_message(INSTANCE, AT, {}, 1.0),
        check_result_message(INSTANCE, CheckResult("c", "k"), AT, 1.0),
    ):
        assert message.headers == {
            "NServiceBus.EnclosedMessageTypes": message.message_type,
            "NServiceBus.ContentType": "application/json",
            "NServiceBus.MessageIntent": "Send",
        }


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        (datetime(2016, 2, 1, 13, 59), "2016-02-01T13:59:00Z"),
        (datetime(2016, 2, 1, 13, 59, 0, 500000), "2016-02-01T13:59:00.5Z"),
        (datetime(2016, 2, 1, 13, 59, 0, 123456), "2016-02-01T13:59:00.123456Z"),
        (datetime(2016, 2, 1, 13, 59, 0, 120, tzinfo=UTC), "2016-02-01T13:59:00.00012Z"),
        (
            datetime(2016, 2, 1, 15, 59, tzinfo=timezone(timedelta(hours=2))),
            "2016-02-01T13:59:00Z",
        ),
    ],
)
def test_dates_are_utc_as_system_text_json_writes_them(moment: datetime, text: str) -> None:
    assert json_date(moment) == text


def test_non_ascii_text_is_escaped_and_reads_back() -> None:
    result = CheckResult("sfbridge destination Zürich", "sfbridge", "kein Zugriff: ü")
    body = check_result_message(INSTANCE, result, AT, 1.0).body
    assert body.isascii()
    assert json.loads(body)["CustomCheckId"] == "sfbridge destination Zürich"
