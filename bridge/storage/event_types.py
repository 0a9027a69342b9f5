"""The event types table: per forwarder and event type seen, its topics and subscribers, as
`sfbridge status` and `check` show them."""

from __future__ import annotations

import json
import logging
from typing import Any

from bridge.addressing import TableAddress
from bridge.connections import savepoint
from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.exceptions import BridgeTableMissing, DatabaseError
from bridge.messages import utcnow
from bridge.storage.tables import owned_table

log = logging.getLogger(__name__)


def record_event_type(
    connection: Connection,
    dialect: Dialect,
    table: TableAddress,
    forwarder: str,
    key: str,
    seen: dict[str, Any],
) -> BridgeTableMissing | None:
    """Record `seen` for `key` inside the open transaction; returns the table when it is
    missing. What status shows must never hold up delivery: a value the table cannot hold or
    a missing table only costs this row, in a savepoint."""
    try:
        with (
            savepoint(connection, dialect, undo_on=(DatabaseError, ValueError)),
            owned_table("event types", dialect.grammar.render(table)),
        ):
            connection.execute(
                dialect.sql("event_type_seen", event_types=table),
                (
                    forwarder,
                    key,
                    dialect.encode_timestamp(utcnow()),
                    json.dumps(seen, ensure_ascii=False),
                ),
            )
    except BridgeTableMissing as missing:
        return missing
    except (DatabaseError, ValueError) as error:
        log.warning("event type %.200s not recorded for status: %s", key, error)
    return None
