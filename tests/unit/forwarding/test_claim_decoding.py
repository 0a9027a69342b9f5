"""Decoding claimed rows: a value that cannot be read fails its own row, never the batch.

The integration tests (`tests/integration/forwarding/test_unreadable_rows.py`) write such
rows into real PostgreSQL and SQLite databases; SQL Server cannot run here, so its part is
held here: the `*_raw` claims' UTF-16 text (with the unpaired surrogates .NET strings may
hold), and the driver's turning a conversion failure into ValueNotConvertible.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import pytest

from bridge.dialects import dialect_for
from bridge.drivers import Unreadable
from bridge.forwarding.claim import RETRY_COLUMNS, row_decoder
from bridge.forwarding.classify import classify
from bridge.messages import Poison, Reject

COLUMNS = ("id", "expired", "expires", "headers", "body", "seq", "claimed_size")
ROW_ID = uuid.uuid4()
HEADERS = '{"NServiceBus.MessageId":"m-1","$.store-and-forward.destination":"Samples.Receiver"}'


def good_row(**changes: Any) -> tuple[Any, ...]:
    values = {
        "id": ROW_ID,
        "expired": 0,
        "expires": datetime(2030, 1, 1),
        "headers": HEADERS,
        "body": b"body",
        "seq": 7,
        "claimed_size": 100,
    }
    values.update(changes)
    return tuple(values[name] for name in COLUMNS)


@pytest.mark.parametrize("dialect", ["postgresql", "sqlserver", "sqlite"])
def test_a_good_row_decodes_as_it_is(dialect: str) -> None:
    decode = row_decoder(dialect_for(dialect), COLUMNS)
    row = good_row(expires=None if dialect == "sqlite" else datetime(2030, 1, 1))
    message = decode(row)
    assert message.unreadable is None
    assert (message.row_id, message.headers_text, message.body, message.order) == (
        ROW_ID,
        HEADERS,
        b"body",
        7,
    )


DRIVER = "cannot be read by the database driver"


@pytest.mark.parametrize(
    ("column", "value", "reason"),
    [
        ("id", Unreadable(b"\x01", "bad uuid"), f"Id {DRIVER} (bad uuid)"),
        ("id", None, "Id is NULL, which the transport never writes (the error queue gets a new"),
        ("id", "not-a-uuid", "Id holds 'not-a-uuid', which is not valid"),
        ("expires", Unreadable(b"\x7f", "too large"), f"Expires {DRIVER} (too large)"),
        ("headers", Unreadable(b'{"a":"caf\xe9"}', "not UTF-8"), f"Headers {DRIVER} (not UTF-8)"),
        ("headers", None, "Headers is NULL, which the transport never writes"),
        ("body", Unreadable(b"\x00\x01", "no loader"), f"Body {DRIVER} (no loader)"),
        ("seq", None, "the sequence column is NULL"),
    ],
)  # fmt: skip
def test_each_unreadable_value_names_its_column(column: str, value: Any, reason: str) -> None:
    message = row_decoder(dialect_for("postgresql"), COLUMNS)(good_row(**{column: value}))
    assert message.unreadable is not None
    assert reason in message.unreadable
    # What could be read is kept for the error queue.
    if column != "body":
        assert message.body == b"body"
    else:
        assert message.body == b"\x00\x01"  # the raw bytes, kept as they came
    if column != "id":
        assert message.row_id == ROW_ID
    else:
        assert isinstance(message.row_id, uuid.UUID) and message.row_id != ROW_ID


def test_unreadable_headers_keep_what_can_be_read_and_go_to_the_error_queue_with_a_reason() -> None:
    raw = b'{"NServiceBus.MessageId":"m-1","Bad.caf\xe9":"x"}'
    row = good_row(headers=Unreadable(raw, "not valid UTF-8"))
    message = row_decoder(dialect_for("sqlite"), COLUMNS)(row)
    assert message.headers_text == '{"NServiceBus.MessageId":"m-1","Bad.caf\ufffd":"x"}'
    decision = classify(message, router=None, outgoing=None)  # type: ignore[arg-type]
    assert isinstance(decision, Reject)
    assert decision.reason_code == "unreadable-row"
    assert "Headers cannot be read" in decision.reason


def test_unreadable_headers_that_do_not_parse_are_poison_moved_as_they_are() -> None:
    row = good_row(headers=Unreadable(b"\xff\xfe garbage", "not valid UTF-8"))
    message = row_decoder(dialect_for("sqlite"), COLUMNS)(row)
    decision = classify(message, router=None, outgoing=None)  # type: ignore[arg-type]
    assert isinstance(decision, Poison)
    assert "Headers cannot be read" in decision.reason


def test_a_timestamp_out_of_dotnet_years_is_named_with_its_value() -> None:
    columns = (*COLUMNS, "expires_out_of_range")
    row = (*good_row(expires=None), "infinity")
    message = row_decoder(dialect_for("postgresql"), columns)(row)
    assert message.unreadable is not None
    assert "Expires holds 'infinity', outside the years 1 to 9999" in message.unreadable
    assert message.expires is None
    assert not message.expired


def test_a_timestamp_in_range_takes_the_fast_path() -> None:
    columns = (*COLUMNS, "expires_out_of_range")
    row = (*good_row(expires=datetime(9999, 12, 31, 23, 59, 59, 999999)), None)
    message = row_decoder(dialect_for("postgresql"), columns)(row)
    assert message.unreadable is None
    assert message.expires == datetime(9999, 12, 31, 23, 59, 59, 999999)


# -- SQL Server's raw claims: UTF-16 as stored ------------------------------------------------


def test_sqlserver_raw_text_keeps_unpaired_surrogates_as_dotnet_wrote_them() -> None:
    text = '{"NServiceBus.MessageId":"m-1","Odd":"\ud800 alone"}'
    raw = text.encode("utf-16-le", "surrogatepass")
    message = row_decoder(dialect_for("sqlserver"), COLUMNS, raw_text=True)(good_row(headers=raw))
    assert message.unreadable is None
    assert message.headers_text == text


def test_sqlserver_raw_text_of_odd_length_is_unreadable_and_named() -> None:
    raw = HEADERS.encode("utf-16-le") + b"\x00"
    message = row_decoder(dialect_for("sqlserver"), COLUMNS, raw_text=True)(good_row(headers=raw))
    assert message.unreadable is not None
    assert "Headers holds" in message.unreadable and "not valid UTF-16-LE" in message.unreadable


def test_retry_rows_decode_their_bookkeeping_and_name_what_is_wrong() -> None:
    columns = RETRY_COLUMNS
    values = {
        **dict(zip(COLUMNS, good_row(), strict=True)),
        "attempts": "three",
        "first_failure_at": datetime(2026, 1, 1),
        "last_error": Unreadable(b"\xff", "not valid UTF-8"),
    }
    row = tuple(values[name] for name in columns)
    message = row_decoder(dialect_for("sqlite"), columns)(row)
    assert message.unreadable is not None
    assert "attempts holds 'three'" in message.unreadable
    assert "last_error cannot be read" in message.unreadable


@pytest.mark.parametrize("name", ["receive_batch", "receive_range", "retry_claim_due"])
def test_sqlserver_raw_claims_differ_from_the_claims_only_in_their_text_columns(name: str) -> None:
    statements = dialect_for("sqlserver").statements
    claim, raw = statements[name], statements[f"{name}_raw"]
    assert raw != claim
    text_columns = ("Headers", "headers", "last_error")
    undone = raw
    for column in text_columns:
        undone = undone.replace(
            f"CAST(deleted.{column} AS varbinary(max)) AS {column.lower()},", f"deleted.{column},"
        )
    assert undone == claim


@pytest.mark.parametrize("name", ["receive_batch", "receive_range", "retry_claim_due"])
def test_postgresql_raw_claims_read_text_as_stored_bytes(name: str) -> None:
    statements = dialect_for("postgresql").statements
    assert "convert_to(q.headers" not in statements[name]
    assert "getdatabaseencoding()" in statements[f"{name}_raw"]
    assert statements[f"{name}_raw"].replace("convert_to(", "").count("AS headers") >= 1


# -- the ODBC driver: a value it cannot convert ----------------------------------------------


class _FailingCursor:
    description = (("id",), ("headers",))

    def execute(self, sql: str, *params: Any) -> _FailingCursor:
        return self

    def fetchall(self) -> list[Any]:
        raise UnicodeDecodeError("utf-16-le", b"\x00\xd8", 0, 2, "illegal UTF-16 surrogate")

    def nextset(self) -> bool:
        return False


def test_an_odbc_value_that_cannot_be_converted_raises_value_not_convertible() -> None:
    from bridge.drivers import ValueNotConvertible
    from bridge.drivers.odbc import OdbcConnection

    connection = object.__new__(OdbcConnection)
    connection.database = "receiver"
    connection._drain = False  # type: ignore[attr-defined]
    connection._native_errors = None  # type: ignore[attr-defined]
    connection._pyodbc_error = RuntimeError  # type: ignore[attr-defined]
    connection._cursor_for = lambda sql: _FailingCursor()  # type: ignore[method-assign]
    with pytest.raises(ValueNotConvertible, match="illegal UTF-16 surrogate"):
        connection.query_columns("SELECT ...")
