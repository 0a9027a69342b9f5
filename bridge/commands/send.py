"""`sfbridge send`: put NServiceBus-shaped test messages into a forwarding queue."""

from __future__ import annotations

import argparse
import socket
import sys
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from bridge.addressing import whole_name_reading
from bridge.commands.configuration import load
from bridge.commands.selection import forwarder_named
from bridge.config.durations import parse_duration
from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.connections import connect
from bridge.dialects import dialect_for
from bridge.exceptions import ExitCode, RequestError
from bridge.forwarding.writes import QueueWriter
from bridge.headers import DESTINATION_HEADER, Headers, serialize_headers, wire_date
from bridge.secrets import inert
from bridge.storage.tables import forwarder_tables


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "destination",
        nargs="?",
        help="destination queue address (the routing header); leave it out for a proxy "
        "forwarder to send as an unchanged endpoint does",
    )
    parser.add_argument("--forwarder", help="forwarder whose queue to write (default: the first)")
    parser.add_argument("--count", type=int, default=1, help="how many messages (default 1)")
    parser.add_argument("--body", default='{"test": true}', help="message body text (UTF-8)")
    parser.add_argument("--type", default="SFBridge.TestMessage", help="EnclosedMessageTypes value")
    parser.add_argument(
        "--header", action="append", default=[], metavar="NAME=VALUE", help="extra header"
    )
    parser.add_argument("--ttbr", help="time to be received, e.g. 30s (sets Expires)")


def run(args: argparse.Namespace) -> int:
    """Send the messages and print their ids. Raises RequestError for options that cannot
    be used."""
    config = load(args)
    forwarder = forwarder_named(config, args.forwarder)
    extra: dict[str, str] = {}
    for item in args.header:
        key, separator, value = item.partition("=")
        if not separator or not key:
            raise RequestError(f"--header wants NAME=VALUE, got {item!r}")
        extra[key] = value
    try:
        ttbr = parse_duration(args.ttbr) if args.ttbr else None
    except ValueError as error:
        raise RequestError(f"--ttbr: {error}") from None
    if args.count < 1:
        raise RequestError("--count must be at least 1")
    if args.destination is None and forwarder.destination is None:
        raise RequestError(
            f"forwarder '{forwarder.name}' routes by the destination header: give the "
            "destination queue address (only a proxy forwarder takes messages without one)"
        )
    if args.destination is not None:
        warning = dotted_name_warning(config, forwarder, args.destination)
        if warning:
            print(f"sfbridge send: warning: {warning}", file=sys.stderr)
    ids = send_test_messages(
        config,
        forwarder,
        destination=args.destination,
        count=args.count,
        body=args.body.encode(),
        message_type=args.type,
        extra_headers=extra,
        time_to_be_received=ttbr,
    )
    if args.destination is None:
        assert forwarder.destination is not None
        where = f"the proxy's destination in database '{forwarder.destination.database}'"
    else:
        where = args.destination
    print(inert(f"sent {len(ids)} message(s) to {where} through forwarder '{forwarder.name}'"))
    if len(ids) <= 10:
        for message_id in ids:
            print(f"  {inert(message_id)}")
    return ExitCode.OK


def test_message_headers(
    destination: str | None, message_type: str, extra: Mapping[str, str], *, now: datetime
) -> Headers:
    """The headers an NServiceBus endpoint writes for a Send, plus the routing header (none
    for a proxy queue: `destination` None)."""
    message_id = str(uuid.uuid4())
    headers: Headers = {
        "NServiceBus.MessageId": message_id,
        "NServiceBus.MessageIntent": "Send",
        "NServiceBus.ConversationId": str(uuid.uuid4()),
        "NServiceBus.CorrelationId": message_id,
        "NServiceBus.OriginatingEndpoint": "sfbridge-send",
        "NServiceBus.OriginatingMachine": socket.gethostname(),
        "NServiceBus.ContentType": "application/json",
        "NServiceBus.EnclosedMessageTypes": message_type,
        "NServiceBus.TimeSent": wire_date(now),
        "NServiceBus.Version": "9.2.0",
    }
    if destination is not None:
        headers[DESTINATION_HEADER] = destination
    headers.update(extra)
    return headers


def dotted_name_warning(
    config: BridgeConfig, forwarder: ForwarderConfig, address: str
) -> str | None:
    """A warning when `address` has an unquoted dot that makes its first part a schema (in
    PostgreSQL `Samples.Receiver` is table `Receiver` in schema `Samples`), which is seldom what
    someone typing an endpoint's name means; None otherwise (or when it cannot be parsed: the
    daemon says why)."""
    grammar = dialect_for(config.databases[forwarder.database].dialect).grammar
    text = address.strip()
    whole = whole_name_reading(grammar, text)
    if whole is None:
        return None
    parsed = grammar.parse(text)
    assert parsed.schema is not None  # whole_name_reading says so
    quoted = grammar.quote_identifier(text)
    return (
        f"{address!r} names table {grammar.quote_identifier(parsed.table)} in schema "
        f"{grammar.quote_identifier(parsed.schema)} (an unquoted dot separates schema and "
        f"table); for the table {text} in the default schema, quote it: sfbridge send "
        f"'{quoted}'"
    )


def send_test_messages(
    config: BridgeConfig,
    forwarder: ForwarderConfig,
    *,
    destination: str | None,
    count: int,
    body: bytes,
    message_type: str,
    extra_headers: Mapping[str, str],
    time_to_be_received: float | None,
) -> list[str]:
    """Insert `count` messages in one transaction; returns their NServiceBus message ids."""
    database = config.databases[forwarder.database]
    dialect = dialect_for(database.dialect)
    queue = forwarder_tables(config, forwarder).queue
    connection = connect(database)
    ids: list[str] = []
    try:
        connection.begin()
        statement = QueueWriter().sql(connection, dialect, "send", queue)
        rows = []
        for _ in range(count):
            now = datetime.now(UTC)
            headers = test_message_headers(destination, message_type, extra_headers, now=now)
            expires = None
            if time_to_be_received is not None:
                expires = (now + timedelta(seconds=time_to_be_received)).replace(tzinfo=None)
            ids.append(str(headers["NServiceBus.MessageId"]))
            rows.append(
                (
                    dialect.encode_id(uuid.uuid4()),
                    dialect.encode_timestamp(expires),
                    serialize_headers(headers),
                    body,
                )
            )
        connection.executemany(statement, rows)
        connection.commit()
    finally:
        connection.rollback()
        connection.close()
    return ids
