"""The seed sample's two endpoints, played on SQLite queue tables for `sfbridge demo`.

They do what NServiceBus endpoints do with the SQL transport and nothing more. The Sender
sends `OrderSubmitted` through its forwarding queue with the sample's store-and-forward header
(what its `ForwardBehavior` adds) and receives `OrderAccepted`. The Receiver receives
`OrderSubmitted` and replies with an ordinary send to the message's `NServiceBus.ReplyToAddress`,
in its own database, in the same transaction as the receive: it writes no store-and-forward
header and knows nothing of the Sender's database. In multi-instance mode that reply went
straight into the Sender's database; here it goes into the proxy queue named after the Sender.
"""

from __future__ import annotations

import json
import socket
import uuid
from datetime import UTC, datetime

from bridge.addressing import TableAddress
from bridge.config.model import DatabaseConfig
from bridge.connections import connect
from bridge.dialects import dialect_for
from bridge.drivers import Connection
from bridge.exceptions import DatabaseError
from bridge.headers import (
    DESTINATION_HEADER,
    MESSAGE_ID_HEADER,
    REPLY_TO_ADDRESS_HEADER,
    Headers,
    parse_headers,
    serialize_headers,
    wire_date,
)

__all__ = ["DemoEndpoint"]


class DemoEndpoint:
    """One endpoint: its input queue in its own database, and the transport's send and receive."""

    def __init__(self, name: str, database: DatabaseConfig) -> None:
        self.name = name
        self.database = database
        self.dialect = dialect_for(database.dialect)
        self.handled: list[Headers] = []

    def queue(self, address: str) -> TableAddress:
        grammar = self.dialect.grammar
        return grammar.resolve(grammar.parse(address), self.database.schema, None)

    def install(self) -> None:
        """What the endpoint's installers do on its first start: create its input queue."""
        connection = connect(self.database, create=True)
        try:
            connection.begin()
            for statement in self.dialect.sql("create_queue", queue=self.queue(self.name)).split(
                ";\n"
            ):
                connection.execute(statement)
            connection.commit()
        finally:
            connection.close()

    def headers(self, message_type: str, intent: str, **extra: str) -> Headers:
        message_id = str(uuid.uuid4())
        headers: Headers = {
            MESSAGE_ID_HEADER: message_id,
            "NServiceBus.MessageIntent": intent,
            "NServiceBus.CorrelationId": message_id,
            REPLY_TO_ADDRESS_HEADER: self.name,
            "NServiceBus.OriginatingEndpoint": self.name,
            "NServiceBus.OriginatingMachine": socket.gethostname(),
            "NServiceBus.ContentType": "application/json",
            "NServiceBus.EnclosedMessageTypes": message_type,
            "NServiceBus.TimeSent": wire_date(datetime.now(UTC)),
        }
        headers.update(extra)
        return headers

    def submit_orders(self, forwarding_queue: str, destination: str, count: int) -> list[str]:
        """The Sender: `count` OrderSubmitted, through the forwarding queue to `destination`."""
        ids = []
        connection = connect(self.database)
        try:
            connection.begin()
            for _ in range(count):
                headers = self.headers(
                    "Shared.OrderSubmitted, Shared", "Send", **{DESTINATION_HEADER: destination}
                )
                body = json.dumps({"OrderId": str(uuid.uuid4()), "Value": 42}).encode()
                self._send(connection, self.queue(forwarding_queue), headers, body)
                ids.append(str(headers[MESSAGE_ID_HEADER]))
            connection.commit()
        finally:
            connection.rollback()
            connection.close()
        return ids

    def handle_waiting(self, reply_type: str | None = None) -> list[Headers]:
        """Receive every waiting message, one transaction each; with `reply_type`, reply to each
        in that transaction. A reply that cannot be sent (its table is missing, the database is
        gone) rolls the receive back and stops, as the endpoint's recoverability would retry.
        Returns the headers of what was handled now (also kept in `handled`)."""
        handled: list[Headers] = []
        try:
            connection = connect(self.database)
        except DatabaseError:
            return handled
        try:
            while True:
                connection.begin()
                # One message at a time: a limit of 1 row (a 1-byte budget admits the first).
                rows = connection.query_named(
                    self.dialect.sql("receive_batch", queue=self.queue(self.name)), (1, 1)
                )
                if not rows:
                    connection.commit()
                    break
                headers = parse_headers(rows[0]["headers"])
                if reply_type is not None:
                    reply = self.headers(
                        reply_type,
                        "Reply",
                        **{"NServiceBus.CorrelationId": str(headers[MESSAGE_ID_HEADER])},
                    )
                    try:
                        address = str(headers[REPLY_TO_ADDRESS_HEADER])
                        self._send(connection, self.queue(address), reply, b"{}")
                    except DatabaseError:
                        connection.rollback()
                        break
                connection.commit()
                handled.append(headers)
        except DatabaseError:
            connection.rollback()
        finally:
            connection.close()
        self.handled.extend(handled)
        return handled

    def _send(
        self, connection: Connection, queue: TableAddress, headers: Headers, body: bytes
    ) -> None:
        connection.execute(
            self.dialect.sql("send", queue=queue),
            (
                self.dialect.encode_id(uuid.uuid4()),
                None,
                serialize_headers(headers),
                body,
            ),
        )
