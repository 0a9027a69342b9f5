"""Specification of message headers (bridge.headers): parsing, writing, wire dates, failures."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from bridge.exceptions import PoisonHeaders
from bridge.headers import (
    ATTEMPTS_HEADER,
    DESTINATION_HEADER,
    EVENT_TYPE_HEADER,
    EXCEPTION_HEADER_PREFIX,
    FAILED_QUEUE_HEADER,
    FAILURE_REASON_HEADER,
    MAX_EXCEPTION_TEXT,
    MESSAGE_ID_HEADER,
    PROCESSING_HOST_HEADERS,
    TIME_OF_FAILURE_HEADER,
    parse_headers,
    parse_wire_date,
    serialize_headers,
    wire_date,
    with_failure_headers,
)
from bridge.processing_host import ProcessingHost

# --------------------------------------------------------------------------------------------
# parse_headers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [None, "", " ", "\t\r\n ", "null", " null\n"])
def test_sql_null_empty_blank_and_json_null_mean_no_headers(text: str | None) -> None:
    assert parse_headers(text) == {}


def test_an_empty_json_object_is_no_headers() -> None:
    assert parse_headers("{}") == {}


def test_a_json_object_of_strings_parses_to_a_dict_in_document_order() -> None:
    text = '{"NServiceBus.MessageId":"1","b":"two","a":"three"}'
    headers = parse_headers(text)
    assert headers == {"NServiceBus.MessageId": "1", "b": "two", "a": "three"}
    assert list(headers) == ["NServiceBus.MessageId", "b", "a"]


def test_json_null_values_are_allowed_and_kept_as_none() -> None:
    headers = parse_headers('{"NServiceBus.CorrelationId":null,"x":"y"}')
    assert headers == {"NServiceBus.CorrelationId": None, "x": "y"}
    assert "NServiceBus.CorrelationId" in headers


def test_empty_string_values_and_keys_are_allowed() -> None:
    assert parse_headers('{"":"","k":""}') == {"": "", "k": ""}


def test_escaped_and_non_ascii_text_is_decoded() -> None:
    headers = parse_headers(r'{"caf\u00e9":"na\u00efve \"quoted\" \\ / \n","ü":"日本語 🎉"}')
    assert headers == {"café": 'naïve "quoted" \\ / \n', "ü": "日本語 🎉"}


def test_surrounding_whitespace_is_allowed() -> None:
    assert parse_headers('  \n{"a":"b"}\n  ') == {"a": "b"}


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("1", "int"),
        ("-1.5", "float"),
        ("1e3", "float"),
        ("true", "bool"),
        ("false", "bool"),
        ("[]", "list"),
        ('["a"]', "list"),
        ("{}", "dict"),
        ('{"nested":"x"}', "dict"),
    ],
)
def test_a_value_that_is_not_a_string_or_null_makes_the_headers_poison(
    value: str, kind: str
) -> None:
    with pytest.raises(PoisonHeaders) as info:
        parse_headers('{"ok":"fine","Bad.Header":' + value + "}")
    message = str(info.value)
    assert "'Bad.Header'" in message
    assert kind in message


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ('"a string"', "str"),
        ("42", "int"),
        ("4.2", "float"),
        ("true", "bool"),
        ("[]", "list"),
        ('[{"a":"b"}]', "list"),
    ],
)
def test_json_that_is_not_an_object_makes_the_headers_poison(text: str, kind: str) -> None:
    with pytest.raises(PoisonHeaders, match=f"JSON {kind}, not an object"):
        parse_headers(text)


@pytest.mark.parametrize(
    "text",
    [
        "{",
        '{"a":"b"',
        '{"a":"b",}',
        "{'a':'b'}",
        '{"a":b}',
        '{"a":"b"} trailing',
        '{"a":"b"}{"c":"d"}',
        "NaN-ish",
        "<headers/>",
        '{"a":"unterminated}',
    ],
)
def test_invalid_json_makes_the_headers_poison(text: str) -> None:
    with pytest.raises(PoisonHeaders, match="not valid JSON"):
        parse_headers(text)


def test_poison_from_invalid_json_does_not_chain_the_json_error() -> None:
    with pytest.raises(PoisonHeaders) as info:
        parse_headers("{")
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__


@pytest.mark.parametrize("depth", [10, 100_000])
def test_deeply_nested_json_is_poison_not_a_crash(depth: int) -> None:
    with pytest.raises(PoisonHeaders):
        parse_headers("[" * depth + "]" * depth)
    with pytest.raises(PoisonHeaders):
        parse_headers('{"a":' + "[" * depth + "]" * depth + "}")


def test_unbalanced_deep_nesting_is_poison_not_a_crash() -> None:
    with pytest.raises(PoisonHeaders):
        parse_headers('{"a":' + "{" * 100_000)


def test_duplicate_keys_keep_the_last_value_as_json_parsers_do() -> None:
    assert parse_headers('{"a":"first","a":"last"}') == {"a": "last"}


# --------------------------------------------------------------------------------------------
# serialize_headers
# --------------------------------------------------------------------------------------------


def test_serialized_headers_are_compact_json() -> None:
    assert serialize_headers({"a": "b", "c": None}) == '{"a":"b","c":null}'


def test_no_headers_serialize_to_an_empty_object() -> None:
    assert serialize_headers({}) == "{}"


def test_serialization_keeps_insertion_order() -> None:
    headers = {"z": "1", "a": "2", "m": "3"}
    assert serialize_headers(headers) == '{"z":"1","a":"2","m":"3"}'


def test_non_ascii_is_written_raw_not_escaped() -> None:
    text = serialize_headers({"Ort": "Zürich – 東京"})
    assert text == '{"Ort":"Zürich – 東京"}'
    assert "\\u" not in text


def test_astral_characters_are_written_raw_not_as_surrogate_escapes() -> None:
    text = serialize_headers({"emoji": "🎉𝄞"})
    assert text == '{"emoji":"🎉𝄞"}'
    assert len(text.encode("utf-8")) == len('{"emoji":""}') + 8


def test_an_escaped_surrogate_pair_parses_to_one_astral_character_written_raw() -> None:
    headers = parse_headers(r'{"emoji":"\ud83c\udf89"}')
    assert headers == {"emoji": "🎉"}
    assert serialize_headers(headers) == '{"emoji":"🎉"}'


def test_characters_json_requires_are_escaped() -> None:
    text = serialize_headers({'q"uote': "back\\slash\nnew\tline\x00\x1f"})
    assert text == r'{"q\"uote":"back\\slash\nnew\tline\u0000\u001f"}'
    assert json.loads(text) == {'q"uote': "back\\slash\nnew\tline\x00\x1f"}


def test_serialize_accepts_any_mapping() -> None:
    from types import MappingProxyType

    assert serialize_headers(MappingProxyType({"a": "b"})) == '{"a":"b"}'


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"a": "b"},
        {"NServiceBus.CorrelationId": None, "x": ""},
        {"ünï": "日本語", "emoji": "🎉", "ctrl": "\x00\n\r\t", "q": '"\\'},
        {str(n): str(n) * n for n in range(50)},
    ],
)
def test_parse_and_serialize_round_trip(headers: dict[str, str | None]) -> None:
    text = serialize_headers(headers)
    parsed = parse_headers(text)
    assert parsed == headers
    assert list(parsed) == list(headers)
    assert serialize_headers(parsed) == text


def test_serialized_transport_headers_round_trip_byte_for_byte() -> None:
    # What the transport writes: compact, raw non-ASCII. Forwarding must not change it.
    original = '{"NServiceBus.MessageId":"a-1","Ort":"Zürich 🎉","NServiceBus.ReplyToAddress":null}'
    assert serialize_headers(parse_headers(original)) == original


@pytest.mark.parametrize("escape", ["\\ud800", "\\udfff", "\\udc00\\ud800"])
def test_every_parseable_header_text_serializes_to_utf8_encodable_text(escape: str) -> None:
    original = '{"a":"x' + escape + 'y"}'
    text = serialize_headers(parse_headers(original))
    assert text.encode("utf-8").decode("utf-8") == text
    # Escaped, not replaced: a reader gets back the very strings the endpoint wrote.
    assert text == original
    assert parse_headers(text) == parse_headers(original)


# --------------------------------------------------------------------------------------------
# wire_date / parse_wire_date
# --------------------------------------------------------------------------------------------


def test_wire_date_has_the_exact_nservicebus_format() -> None:
    moment = datetime(2016, 8, 16, 10, 6, 20, 123456, tzinfo=UTC)
    assert wire_date(moment) == "2016-08-16 10:06:20:123456 Z"


@pytest.mark.parametrize(
    "moment",
    [
        datetime(2016, 8, 16, 10, 6, 20, 123456),
        datetime(2000, 1, 1),
        datetime(1999, 12, 31, 23, 59, 59, 999999),
        datetime(9999, 12, 31, 23, 59, 59, 999999),
        datetime(2024, 2, 29, 0, 0, 0, 1),
    ],
)
def test_wire_date_is_always_28_characters_with_zero_padded_fields(moment: datetime) -> None:
    text = wire_date(moment)
    assert len(text) == 28
    assert text[4] == text[7] == "-"
    assert text[10] == " "
    assert text[13] == text[16] == text[19] == ":"
    assert text.endswith(" Z")


def test_whole_seconds_still_get_six_fraction_digits() -> None:
    assert wire_date(datetime(2020, 1, 2, 3, 4, 5)) == "2020-01-02 03:04:05:000000 Z"


def test_a_naive_datetime_is_taken_to_be_utc() -> None:
    assert wire_date(datetime(2016, 8, 16, 10, 6, 20, 123456)) == "2016-08-16 10:06:20:123456 Z"


def test_an_aware_datetime_is_converted_to_utc() -> None:
    cest = timezone(timedelta(hours=2))
    moment = datetime(2016, 8, 16, 12, 6, 20, 123456, tzinfo=cest)
    assert wire_date(moment) == "2016-08-16 10:06:20:123456 Z"


def test_conversion_to_utc_can_cross_midnight_and_the_year() -> None:
    minus_five = timezone(timedelta(hours=-5))
    moment = datetime(2023, 12, 31, 22, 30, tzinfo=minus_five)
    assert wire_date(moment) == "2024-01-01 03:30:00:000000 Z"


def test_parse_wire_date_reads_the_format_as_aware_utc() -> None:
    parsed = parse_wire_date("2016-08-16 10:06:20:123456 Z")
    assert parsed == datetime(2016, 8, 16, 10, 6, 20, 123456, tzinfo=UTC)
    assert parsed is not None
    assert parsed.tzinfo is UTC


@pytest.mark.parametrize(
    "moment",
    [
        datetime(2016, 8, 16, 10, 6, 20, 123456, tzinfo=UTC),
        datetime(2000, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2021, 6, 1, 12, 0, 0, 7, tzinfo=timezone(timedelta(hours=9, minutes=30))),
    ],
)
def test_wire_date_round_trips_through_parse_wire_date(moment: datetime) -> None:
    assert parse_wire_date(wire_date(moment)) == moment


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not a date",
        "2016-08-16 10:06:20:123456",  # no " Z"
        "2016-08-16 10:06:20.123456 Z",  # '.' instead of ':' before the fraction
        "2016-08-16T10:06:20:123456 Z",
        "2016-08-16 10:06:20:123456Z",
        "2016-08-16 10:06:20:123456 Z ",
        "2016-08-16 10:06:20 Z",
        "2016-13-16 10:06:20:123456 Z",
        "2016-02-30 10:06:20:123456 Z",
        "2016-08-16 24:06:20:123456 Z",
        "2016-08-16 10:06:20:1234567 Z",
        "2016-08-16T10:06:20.123456+00:00",
    ],
)
def test_parse_wire_date_returns_none_for_text_that_is_not_a_wire_date(text: str) -> None:
    assert parse_wire_date(text) is None


def test_parse_wire_date_returns_none_for_a_non_string() -> None:
    assert parse_wire_date(None) is None  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# with_failure_headers
# --------------------------------------------------------------------------------------------

FAILED_AT = datetime(2016, 8, 16, 10, 6, 20, 123456, tzinfo=UTC)
HOST = ProcessingHost("orders", "bridge1", "0123456789abcdef0123456789abcdef", "bridge1")
ROW_ID = "6e0c3c29-3d3a-4a8e-9c1f-5f1f6b2b7a10"


def _fail(headers: dict[str, str | None], **overrides: object) -> dict[str, str | None]:
    arguments: dict[str, object] = {
        "failed_queue": "sfbridge.forward",
        "exception_type": "SFBridge.TableNotFound",
        "message": "table 'Receiver' does not exist",
        "reason": "missing-queue",
        "failed_at": FAILED_AT,
        "processed_by": HOST,
        "row_id": ROW_ID,
    }
    arguments.update(overrides)
    return with_failure_headers(headers, **arguments)  # type: ignore[arg-type]


def test_failure_headers_have_the_shape_servicepulse_expects() -> None:
    result = _fail({"NServiceBus.MessageId": "m-1"})
    assert result == {
        "NServiceBus.MessageId": "m-1",
        FAILED_QUEUE_HEADER: "sfbridge.forward",
        "NServiceBus.ExceptionInfo.ExceptionType": "SFBridge.TableNotFound",
        "NServiceBus.ExceptionInfo.Message": "table 'Receiver' does not exist",
        "NServiceBus.ExceptionInfo.Source": "sfbridge",
        "NServiceBus.ExceptionInfo.StackTrace": "table 'Receiver' does not exist",
        TIME_OF_FAILURE_HEADER: "2016-08-16 10:06:20:123456 Z",
        "NServiceBus.ProcessingEndpoint": "orders",
        "NServiceBus.ProcessingMachine": "bridge1",
        "$.diagnostics.hostid": "0123456789abcdef0123456789abcdef",
        "$.diagnostics.hostdisplayname": "bridge1",
        FAILURE_REASON_HEADER: "missing-queue",
    }


@pytest.mark.parametrize("given", [None, "", "absent"])
def test_a_message_without_a_message_id_gets_the_rows_id_as_nservicebus_does(
    given: str | None,
) -> None:
    headers: dict[str, str | None] = {} if given == "absent" else {MESSAGE_ID_HEADER: given}
    assert _fail(headers)[MESSAGE_ID_HEADER] == ROW_ID
    assert _fail({MESSAGE_ID_HEADER: "m-1"})[MESSAGE_ID_HEADER] == "m-1"


def test_who_processed_it_replaces_what_an_earlier_failure_said() -> None:
    earlier = {name: "earlier" for name in PROCESSING_HOST_HEADERS}
    result = _fail(earlier)
    assert [result[name] for name in PROCESSING_HOST_HEADERS] == [
        "orders",
        "bridge1",
        "0123456789abcdef0123456789abcdef",
        "bridge1",
    ]


def test_failure_header_names_are_the_nservicebus_ones() -> None:
    assert FAILED_QUEUE_HEADER == "NServiceBus.FailedQ"
    assert TIME_OF_FAILURE_HEADER == "NServiceBus.TimeOfFailure"
    assert EXCEPTION_HEADER_PREFIX == "NServiceBus.ExceptionInfo."
    assert PROCESSING_HOST_HEADERS == (
        "NServiceBus.ProcessingEndpoint",
        "NServiceBus.ProcessingMachine",
        "$.diagnostics.hostid",
        "$.diagnostics.hostdisplayname",
    )
    assert FAILURE_REASON_HEADER == "$.sfbridge.failure-reason"
    assert ATTEMPTS_HEADER == "$.sfbridge.attempts"


def test_time_of_failure_is_a_wire_date_of_failed_at_in_utc() -> None:
    cest = timezone(timedelta(hours=2))
    result = _fail({}, failed_at=datetime(2016, 8, 16, 12, 6, 20, 5, tzinfo=cest))
    assert result[TIME_OF_FAILURE_HEADER] == "2016-08-16 10:06:20:000005 Z"
    naive = _fail({}, failed_at=datetime(2016, 8, 16, 10, 6, 20))
    assert naive[TIME_OF_FAILURE_HEADER] == "2016-08-16 10:06:20:000000 Z"


def test_failure_headers_keep_the_routing_headers_so_a_servicepulse_retry_is_forwarded_again() -> (
    None
):
    headers = {DESTINATION_HEADER: '"public"."Receiver"', EVENT_TYPE_HEADER: "Samples.Event"}
    result = _fail(headers)
    assert result[DESTINATION_HEADER] == '"public"."Receiver"'
    assert result[EVENT_TYPE_HEADER] == "Samples.Event"


def test_failure_headers_keep_every_other_header_including_nulls_and_non_ascii() -> None:
    headers = {"NServiceBus.CorrelationId": None, "Ort": "Zürich 🎉", "": ""}
    result = _fail(headers)
    for key, value in headers.items():
        assert result[key] == value


def test_retry_counters_of_earlier_processing_are_removed() -> None:
    result = _fail({"NServiceBus.Retries": "3", "NServiceBus.FLRetries": "5", "keep": "me"})
    assert "NServiceBus.Retries" not in result
    assert "NServiceBus.FLRetries" not in result
    assert result["keep"] == "me"


def test_exception_info_of_an_earlier_failure_is_replaced_not_merged() -> None:
    earlier = {
        "NServiceBus.ExceptionInfo.ExceptionType": "System.Exception",
        "NServiceBus.ExceptionInfo.HelpLink": "http://old",
        "NServiceBus.ExceptionInfo.Data.Key": "old",
        "NServiceBus.ExceptionInfo.InnerExceptionType": "System.IO.IOException",
        FAILED_QUEUE_HEADER: "old-queue",
        TIME_OF_FAILURE_HEADER: "2000-01-01 00:00:00:000000 Z",
        FAILURE_REASON_HEADER: "old-reason",
    }
    result = _fail(earlier)
    exception_keys = {key for key in result if key.startswith(EXCEPTION_HEADER_PREFIX)}
    assert exception_keys == {
        "NServiceBus.ExceptionInfo.ExceptionType",
        "NServiceBus.ExceptionInfo.Message",
        "NServiceBus.ExceptionInfo.Source",
        "NServiceBus.ExceptionInfo.StackTrace",
    }
    assert result["NServiceBus.ExceptionInfo.ExceptionType"] == "SFBridge.TableNotFound"
    assert result[FAILED_QUEUE_HEADER] == "sfbridge.forward"
    assert result[TIME_OF_FAILURE_HEADER] == "2016-08-16 10:06:20:123456 Z"
    assert result[FAILURE_REASON_HEADER] == "missing-queue"


def test_the_exception_info_prefix_is_matched_case_sensitively() -> None:
    result = _fail({"nservicebus.exceptioninfo.Custom": "kept"})
    assert result["nservicebus.exceptioninfo.Custom"] == "kept"


def test_with_failure_headers_does_not_modify_its_input() -> None:
    headers = {"NServiceBus.Retries": "1", "NServiceBus.ExceptionInfo.Message": "old"}
    snapshot = dict(headers)
    _fail(headers)
    assert headers == snapshot


def test_the_stack_trace_is_used_when_given() -> None:
    result = _fail({}, stack_trace="Traceback...\n  line 1")
    assert result["NServiceBus.ExceptionInfo.StackTrace"] == "Traceback...\n  line 1"
    assert result["NServiceBus.ExceptionInfo.Message"] == "table 'Receiver' does not exist"


def test_the_message_stands_in_for_a_missing_or_empty_stack_trace() -> None:
    assert _fail({}, stack_trace=None)["NServiceBus.ExceptionInfo.StackTrace"] == (
        "table 'Receiver' does not exist"
    )
    assert _fail({}, stack_trace="")["NServiceBus.ExceptionInfo.StackTrace"] == (
        "table 'Receiver' does not exist"
    )


def test_the_exception_message_is_truncated_to_16_kib() -> None:
    assert MAX_EXCEPTION_TEXT == 16_384
    result = _fail({}, message="m" * 20_000, stack_trace="s" * 20_000)
    assert result["NServiceBus.ExceptionInfo.Message"] == "m" * 16_384
    assert result["NServiceBus.ExceptionInfo.StackTrace"] == "s" * 16_384


def test_texts_at_exactly_the_limit_are_kept_whole() -> None:
    result = _fail({}, message="m" * 16_384, stack_trace="s" * 16_383)
    assert result["NServiceBus.ExceptionInfo.Message"] == "m" * 16_384
    assert result["NServiceBus.ExceptionInfo.StackTrace"] == "s" * 16_383


def test_truncation_counts_characters_not_bytes() -> None:
    result = _fail({}, message="ü" * 16_385)
    assert result["NServiceBus.ExceptionInfo.Message"] == "ü" * 16_384


def test_a_long_message_standing_in_for_the_stack_trace_is_truncated_too() -> None:
    result = _fail({}, message="m" * 16_385)
    assert result["NServiceBus.ExceptionInfo.StackTrace"] == "m" * 16_384


def test_the_failure_reason_is_recorded_under_the_bridge_prefix() -> None:
    assert _fail({}, reason="unroutable")[FAILURE_REASON_HEADER] == "unroutable"


def test_the_attempts_header_is_added_only_when_attempts_are_given() -> None:
    assert ATTEMPTS_HEADER not in _fail({})
    assert _fail({}, attempts=100)[ATTEMPTS_HEADER] == "100"
    assert _fail({}, attempts=0)[ATTEMPTS_HEADER] == "0"


def test_failure_headers_are_serializable_and_parse_back_unchanged() -> None:
    result = _fail(
        {"Ort": "Zürich", "n": None, DESTINATION_HEADER: "Receiver"}, attempts=3, message="💥"
    )
    assert parse_headers(serialize_headers(result)) == result
    assert all(value is None or isinstance(value, str) for value in result.values())
