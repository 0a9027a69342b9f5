"""The error-queue tools' pure core: reading a row, who drains its FailedQ, selecting, the
header clean-up for replay, and previews."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from support import SENDER_FORWARD as FORWARD

from bridge.addressing import TableAddress
from bridge.commands.failed_messages import (
    BRIDGE_REASONS,
    POISON,
    FailedMessage,
    QueueOwners,
    body_preview,
    describe,
    one_line,
    replay_headers,
    row_id_text,
)
from bridge.commands.selection import Selection, check_reason, missing_ids, parse_since
from bridge.dialects import dialect_for
from bridge.exceptions import RequestError
from bridge.headers import serialize_headers, with_failure_headers
from bridge.processing_host import ProcessingHost

PG = dialect_for("postgresql").grammar
SQLITE = dialect_for("sqlite").grammar
SQLSERVER = dialect_for("sqlserver").grammar
NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)
OWNERS = QueueOwners(
    "sender",
    PG,
    None,
    {
        "orders": TableAddress("Samples.Sender.Forward", "public"),
        "billing": TableAddress("Billing.Forward", "nsb"),
    },
)
SENT = {
    "NServiceBus.MessageId": "m-1",
    "NServiceBus.ReplyToAddress": '"public"."Samples.Sender"',
    "NServiceBus.EnclosedMessageTypes": "Shared.OrderSubmitted",
    "$.store-and-forward.destination": '"public"."Samples.Receiver"',
    "NServiceBus.Retries": "2",
    "custom": None,
}
HOST = ProcessingHost("orders", "bridge1", "0123456789abcdef0123456789abcdef", "bridge1")
ROW_ID = "f1f2f3f4-0000-4000-8000-000000000001"


def failed(
    headers: dict[str, str | None] | None = None,
    *,
    reason: str = "unroutable",
    failed_at: datetime = NOW,
    attempts: int | None = None,
    failed_queue: str = FORWARD,
    row_id: str | None = None,
    seq: int = 1,
) -> FailedMessage:
    text = serialize_headers(
        with_failure_headers(
            SENT if headers is None else headers,
            failed_queue=failed_queue,
            exception_type="SFBridge.UnroutableMessage",
            message="no route matches destination table 'Samples.Receiver'",
            reason=reason,
            failed_at=failed_at,
            processed_by=HOST,
            row_id=row_id or ROW_ID,
            attempts=attempts,
        )
    )
    return describe(row_id or str(uuid.uuid4()), seq, text, OWNERS)


# -- reading a row ---------------------------------------------------------------------------


def test_a_row_the_bridge_failed_reads_back_its_failure() -> None:
    message = failed(attempts=7, seq=42)
    assert message.seq == 42
    assert message.forwarder == "orders" and message.replayable
    assert message.not_replayable is None
    assert message.failed_queue == FORWARD
    assert message.reason == "unroutable"
    assert message.failed_at == NOW
    assert message.destination == '"public"."Samples.Receiver"'
    assert message.attempts == 7
    assert message.exception_message == "no route matches destination table 'Samples.Receiver'"
    assert message.message_id == "m-1"


def test_an_event_names_its_type_as_destination() -> None:
    headers = {"$.store-and-forward.eventtype": "Shared.OrderAccepted, Shared"}
    assert failed(headers).destination == "event Shared.OrderAccepted, Shared"


@pytest.mark.parametrize("headers", [{}, {"$.store-and-forward.destination": "  "}])
def test_no_routing_header_means_no_destination(headers: dict[str, str | None]) -> None:
    assert failed(headers).destination is None


def test_missing_or_malformed_failure_headers_read_as_none() -> None:
    message = describe(uuid.uuid4(), 1, json.dumps({"$.sfbridge.attempts": "many"}), OWNERS)
    assert message.attempts is None
    assert message.failed_at is None
    assert message.reason is None
    assert message.exception_message is None
    odd_time = json.dumps({"NServiceBus.TimeOfFailure": "yesterday"})
    assert describe(uuid.uuid4(), 1, odd_time, OWNERS).failed_at is None


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"a": 1}'])
def test_a_poison_row_is_listed_with_reason_poison_and_never_replayed(text: str) -> None:
    message = describe(uuid.uuid4(), 3, text, OWNERS)
    assert message.headers is None
    assert message.reason == POISON
    assert not message.replayable
    assert message.not_replayable is not None
    assert message.not_replayable.startswith("its headers cannot be read (")
    assert message.exception_message == message.poison
    assert message.destination is None and message.failed_queue is None


@pytest.mark.parametrize("text", [None, "", "null"])
def test_empty_headers_are_no_headers_and_so_no_failed_queue(text: str | None) -> None:
    message = describe(uuid.uuid4(), 1, text, OWNERS)
    assert message.headers == {}
    assert message.not_replayable == (
        "it has no 'NServiceBus.FailedQ' header, so the queue it failed in is unknown"
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (uuid.UUID("3F2A0000-0000-0000-0000-00000000000A"), "3f2a0000-0000-0000-0000-00000000000a"),
        ("3F2A0000-0000-0000-0000-00000000000A", "3f2a0000-0000-0000-0000-00000000000a"),
        ("{3f2a0000-0000-0000-0000-00000000000a}", "3f2a0000-0000-0000-0000-00000000000a"),
        ("not-a-uuid", "not-a-uuid"),
        (12, "12"),
    ],
)
def test_row_ids_are_shown_and_compared_as_canonical_uuid_text(value: object, shown: str) -> None:
    assert row_id_text(value) == shown


def test_a_row_whose_id_is_no_uuid_is_not_replayed() -> None:
    message = failed(row_id="row-7")
    assert message.row_id == "row-7" and not message.replayable
    assert message.not_replayable == "its Id 'row-7' is not a UUID, as queue rows' Ids are"


# -- who drains the queue a message failed in ------------------------------------------------


@pytest.mark.parametrize(
    ("failed_queue", "forwarder"),
    [
        ('"public"."Samples.Sender.Forward"', "orders"),
        ("public.Samples.Sender.Forward", "orders"),  # split on the first dot
        ("Samples.Sender.Forward", None),  # schema Samples, table Sender.Forward
        ('"Samples.Sender.Forward"', "orders"),  # no schema: the database default
        ('"nsb"."Billing.Forward"', "billing"),
        ('"public"."Billing.Forward"', None),
        ('"public"."samples.sender.forward"', None),  # table names compare exactly
    ],
)
def test_failed_queue_names_the_forwarder_draining_it(
    failed_queue: str, forwarder: str | None
) -> None:
    assert OWNERS.owner_of(failed_queue)[0] == forwarder


def test_an_endpoints_queue_is_not_replayed_and_says_where_it_failed() -> None:
    assert OWNERS.owner_of('"public"."Samples.Billing"') == (
        None,
        'it failed in "public"."Samples.Billing", which no forwarder in database \'sender\' '
        "drains (an endpoint's failed message: retry it from ServicePulse)",
    )


def test_a_failed_queue_that_is_no_address_says_so() -> None:
    forwarder, why = OWNERS.owner_of('"unbalanced')
    assert forwarder is None
    assert why is not None and why.startswith(
        "its 'NServiceBus.FailedQ' '\"unbalanced' is not a queue address ("
    )


@pytest.mark.parametrize("failed_queue", [None, "", "   "])
def test_no_failed_queue_is_unknown(failed_queue: str | None) -> None:
    assert OWNERS.owner_of(failed_queue)[0] is None


def test_the_database_default_schema_applies_to_addresses_without_one() -> None:
    owners = QueueOwners("sender", PG, "nsb", {"orders": TableAddress("Forward", "nsb")})
    assert owners.owner_of('"Forward"')[0] == "orders"
    assert owners.owner_of('"public"."Forward"')[0] is None


def test_sqlite_reads_bare_and_sql_server_style_addresses() -> None:
    owners = QueueOwners("edge", SQLITE, None, {"edge": TableAddress("Edge.Forward")})
    assert owners.owner_of("Edge.Forward")[0] == "edge"
    assert owners.owner_of("Edge.Forward@[dbo]@[edge]")[0] == "edge"
    assert owners.owner_of("Other")[0] is None


def test_sql_server_compares_catalogs_only_when_both_name_one() -> None:
    owners = QueueOwners(
        "sender", SQLSERVER, "dbo", {"orders": TableAddress("Forward", "dbo", "Sales")}
    )
    assert owners.owner_of("Forward@[dbo]@[sales]")[0] == "orders"
    assert owners.owner_of("Forward@[dbo]")[0] == "orders"
    assert owners.owner_of("Forward@[dbo]@[Other]")[0] is None


def test_sql_server_failed_q_with_its_catalog_is_the_forwarders_queue_in_its_own_catalog() -> None:
    # FailedQ is written `table@[schema]@[catalog]`; a queue configured without a catalog is
    # in the database's own, and a FailedQ naming another catalog is another endpoint's.
    owners = QueueOwners(
        "sender",
        SQLSERVER,
        "dbo",
        {"orders": TableAddress("Forward", "dbo")},
        default_catalog="SenderDb",
    )
    assert owners.owner_of("Forward@[dbo]@[SenderDb]")[0] == "orders"
    assert owners.owner_of("Forward@[dbo]@[senderdb]")[0] == "orders"
    assert owners.owner_of("Forward@[dbo]")[0] == "orders"
    forwarder, why = owners.owner_of("Forward@[dbo]@[OtherDb]")
    assert forwarder is None
    assert why is not None and "no forwarder in database 'sender' drains" in why
    unnamed = QueueOwners("sender", SQLSERVER, "dbo", {"orders": TableAddress("Forward", "dbo")})
    assert unnamed.owner_of("Forward@[dbo]@[anything]")[0] == "orders"


# -- selecting -------------------------------------------------------------------------------


def test_an_empty_selection_selects_everything() -> None:
    assert Selection().selects(failed())
    assert Selection().selects(describe(uuid.uuid4(), 1, "poison", OWNERS))


def test_select_by_forwarder() -> None:
    billing = failed(failed_queue='"nsb"."Billing.Forward"')
    endpoint = failed(failed_queue='"public"."Other"')
    assert Selection(forwarder="billing").selects(billing)
    assert not Selection(forwarder="orders").selects(billing)
    assert not Selection(forwarder="orders").selects(endpoint)


def test_select_by_reason_poison_included() -> None:
    assert Selection(reason="unroutable").selects(failed())
    assert not Selection(reason="delivery-failed").selects(failed())
    poison = describe(uuid.uuid4(), 1, "poison", OWNERS)
    assert Selection(reason=POISON).selects(poison)
    assert not Selection(reason=POISON).selects(failed())


def test_select_since_a_time_of_failure() -> None:
    assert Selection(since=NOW).selects(failed(failed_at=NOW))
    assert Selection(since=NOW - timedelta(seconds=1)).selects(failed(failed_at=NOW))
    assert not Selection(since=NOW + timedelta(microseconds=1)).selects(failed(failed_at=NOW))
    assert not Selection(since=NOW).selects(describe(uuid.uuid4(), 1, "poison", OWNERS))


@pytest.mark.parametrize(
    ("glob", "selected"),
    [
        ("Samples.Receiver", True),  # the table name, read in the forwarding database's grammar
        ("Samples.*", True),
        ('"public"."Samples.Receiver"', True),  # the whole header
        ("*Receiver*", True),
        ("samples.*", False),  # case-sensitive, as routes are
        ("Billing.*", False),
    ],
)
def test_select_by_destination_glob(glob: str, selected: bool) -> None:
    assert Selection(destination=glob).selects(failed(), PG) is selected


def test_a_destination_glob_matches_an_events_type_and_never_a_message_without_one() -> None:
    event = failed({"$.store-and-forward.eventtype": "Shared.OrderAccepted, Shared"})
    assert Selection(destination="Shared.Order*").selects(event, PG)
    assert not Selection(destination="*").selects(failed({}), PG)
    unparsable = failed({"$.store-and-forward.destination": '"bad'})
    assert Selection(destination='"bad').selects(unparsable, PG)
    assert not Selection(destination="bad").selects(unparsable, PG)


def test_select_by_id() -> None:
    message = failed()
    assert Selection(ids=frozenset({message.row_id})).selects(message)
    assert not Selection(ids=frozenset({str(uuid.uuid4())})).selects(message)


def test_every_criterion_must_hold() -> None:
    message = failed(failed_at=NOW)
    assert Selection(reason="unroutable", forwarder="orders", since=NOW).selects(message)
    assert not Selection(reason="unroutable", forwarder="billing").selects(message)
    assert not Selection(reason="unroutable", since=NOW + timedelta(1)).selects(message)


def test_missing_ids_are_those_no_message_has_in_the_order_given() -> None:
    messages = [failed(row_id=str(uuid.UUID(int=n))) for n in (1, 2)]
    wanted = [str(uuid.UUID(int=3)), str(uuid.UUID(int=1)), str(uuid.UUID(int=3))]
    assert missing_ids(wanted, messages) == [str(uuid.UUID(int=3))]
    assert missing_ids([], messages) == []


# -- filters a person gives ------------------------------------------------------------------


@pytest.mark.parametrize("reason", [*BRIDGE_REASONS, POISON])
def test_every_reason_the_bridge_writes_is_accepted(reason: str) -> None:
    assert check_reason(reason) == reason


def test_an_unknown_reason_names_the_nearest_and_the_choices() -> None:
    with pytest.raises(RequestError) as raised:
        check_reason("unroutabel")
    assert str(raised.value).startswith(
        "no failure reason 'unroutabel' (did you mean 'unroutable'? reasons: no-routing-header, "
    )
    with pytest.raises(RequestError) as raised:
        check_reason("xyz")
    assert str(raised.value).startswith("no failure reason 'xyz' (reasons: no-routing-header")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2h", NOW - timedelta(hours=2)),
        ("30m", NOW - timedelta(minutes=30)),
        ("1d12h", NOW - timedelta(days=1, hours=12)),
        ("2026-11-23T10:00:00Z", datetime(2026, 11, 23, 10, tzinfo=UTC)),
        ("2026-11-23T10:00:00+02:00", datetime(2026, 11, 23, 8, tzinfo=UTC)),
        ("2026-11-23 10:00", datetime(2026, 11, 23, 10, tzinfo=UTC)),  # UTC unless it says
        ("2026-11-23", datetime(2026, 11, 23, tzinfo=UTC)),
    ],
)
def test_since_is_a_duration_back_from_now_or_an_iso_time(text: str, expected: datetime) -> None:
    assert parse_since(text, NOW) == expected


@pytest.mark.parametrize("text", ["yesterday", "2h ago", "-2h", "2026-13-01", "", "90"])
def test_since_that_is_neither_names_both_forms(text: str) -> None:
    with pytest.raises(RequestError) as raised:
        parse_since(text, NOW)
    assert "a duration back from now such as 2h" in str(raised.value)
    assert "an ISO time such as 2026-11-23T12:00:00Z" in str(raised.value)


# -- the header clean-up for replay ----------------------------------------------------------


def test_replay_takes_off_exactly_what_the_bridge_added_on_failure() -> None:
    written = with_failure_headers(
        SENT,
        failed_queue=FORWARD,
        exception_type="SFBridge.DeliveryFailed",
        message="database 'receiver': cannot connect",
        reason="delivery-failed",
        failed_at=NOW,
        processed_by=HOST,
        row_id=ROW_ID,
        attempts=100,
        stack_trace="trace",
    )
    expected = {key: value for key, value in SENT.items() if key != "NServiceBus.Retries"}
    assert replay_headers(written) == expected
    assert list(replay_headers(written)) == list(expected)  # order kept


def test_replay_keeps_the_routing_headers_and_everything_the_endpoint_wrote() -> None:
    headers = {
        "$.store-and-forward.destination": "Samples.Receiver",
        "$.store-and-forward.eventtype": "Shared.E",
        "$.sfbridge.address-database": "receiver",
        "NServiceBus.FailedQueue": "kept: not the FailedQ header",
        "NServiceBus.TimeSent": "2026-11-21 10:06:20:123456 Z",
        "NServiceBus.OriginatingEndpoint": "Samples.Sender",
        "$.diagnostics.originating.hostid": "kept: the sender's",
        "$.sfbridge.other": "kept",
        "traceparent": "00-abc-def-01",
    }
    assert replay_headers(headers) == headers


@pytest.mark.parametrize(
    "added",
    [
        "NServiceBus.FailedQ",
        "NServiceBus.TimeOfFailure",
        "NServiceBus.ExceptionInfo.ExceptionType",
        "NServiceBus.ExceptionInfo.Message",
        "NServiceBus.ExceptionInfo.Source",
        "NServiceBus.ExceptionInfo.StackTrace",
        "NServiceBus.ExceptionInfo.Data.Custom",
        "$.sfbridge.failure-reason",
        "$.sfbridge.attempts",
        "NServiceBus.ProcessingEndpoint",
        "NServiceBus.ProcessingMachine",
        "$.diagnostics.hostid",
        "$.diagnostics.hostdisplayname",
    ],
)
def test_each_failure_header_is_removed(added: str) -> None:
    assert replay_headers({"a": "1", added: "x", "b": None}) == {"a": "1", "b": None}


def test_replayed_headers_make_the_same_failure_again_without_piling_up() -> None:
    once = with_failure_headers(
        SENT, failed_queue=FORWARD, exception_type="T", message="m", reason="unroutable",
        failed_at=NOW, processed_by=HOST, row_id=ROW_ID,
    )  # fmt: skip
    twice = with_failure_headers(
        replay_headers(once), failed_queue=FORWARD, exception_type="T", message="m",
        reason="unroutable", failed_at=NOW + timedelta(hours=1), processed_by=HOST,
        row_id=ROW_ID,
    )  # fmt: skip
    assert set(twice) == set(once)
    assert twice["NServiceBus.TimeOfFailure"] == "2026-11-23 13:00:00:000000 Z"


# -- showing ---------------------------------------------------------------------------------


def test_a_text_body_is_shown_as_text_lines() -> None:
    assert body_preview(b'{"a": 1}\n{"b": "\xc3\xa4"}') == (
        "text, 20 bytes",
        ['{"a": 1}', '{"b": "ä"}'],
    )


def test_a_binary_body_is_shown_as_a_hex_dump() -> None:
    kind, lines = body_preview(bytes(range(20)))
    assert kind == "binary, 20 bytes"
    assert lines == [
        "00000000  00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f  |................|",
        "00000010  10 11 12 13                                      |....|",
    ]


def test_invalid_utf8_is_binary_even_at_the_end() -> None:
    assert body_preview(b"abc\xff")[0] == "binary, 4 bytes"


def test_a_long_body_is_cut_at_the_limit_even_inside_a_character() -> None:
    body = "ä".encode() * 10  # 20 bytes; 5 bytes cut one character in half
    assert body_preview(body, limit=5) == ("text, 20 bytes (first 5 shown)", ["ää"])
    kind, lines = body_preview(bytes(100), limit=32)
    assert kind == "binary, 100 bytes (first 32 shown)" and len(lines) == 2


def test_no_body_and_an_empty_body_are_said_so() -> None:
    assert body_preview(None) == ("no body (NULL)", [])
    assert body_preview(b"") == ("empty body", [])


@pytest.mark.parametrize(
    ("text", "width", "expected"),
    [
        (None, 10, "-"),
        ("short", 10, "short"),
        ("line one\nline  two", 40, "line one line two"),
        ("abcdefghijkl", 10, "abcdefg..."),
    ],
)
def test_one_line_flattens_and_cuts(text: str | None, width: int, expected: str) -> None:
    assert one_line(text, width) == expected


def test_a_destination_glob_matches_a_proxys_destination_for_its_header_less_messages() -> None:
    proxied = failed({})  # a proxy's message: no routing header
    target = ('"public"."Samples.Receiver"', "Samples.Receiver")
    assert Selection(destination="Samples.*").selects(proxied, PG, target)
    assert Selection(destination='"public"."Samples.Receiver"').selects(proxied, PG, target)
    assert not Selection(destination="Billing.*").selects(proxied, PG, target)
    assert not Selection(destination="Samples.*").selects(proxied, PG)
