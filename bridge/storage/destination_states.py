"""Destination databases and forwarders as the daemon last saw them, kept where `sfbridge
status` can read them.

The daemon's outage tracker and forwarder health live in its memory; `status` runs in another
process. So the daemon writes each destination's state (up, unreachable or not ready, since
when, last error, next probe) into a small table in every forwarding database, and each
forwarder's (failing or not, since when, how many batches, last error) into another beside it,
whenever a state changes and at least every `HEARTBEAT_SECONDS`, so `status` can also tell how
fresh the picture is.
"""

from __future__ import annotations

from typing import Any

from bridge.dialects import Dialect
from bridge.drivers import Connection


def read_states(connection: Connection, dialect: Dialect, table: Any) -> list[dict[str, Any]]:
    """The rows of the destination states table, as dicts with naive-UTC datetimes."""
    rows = connection.query(dialect.sql("destination_states_read", destination_states=table))
    return [
        {
            "database": row[0],
            "state": row[1],
            "since": dialect.decode_timestamp(row[2]),
            "last_error": row[3],
            "next_probe_at": dialect.decode_timestamp(row[4]),
            "updated_at": dialect.decode_timestamp(row[5]),
            "reported_by": row[6],
        }
        for row in rows
    ]


def read_forwarder_states(
    connection: Connection, dialect: Dialect, table: Any
) -> list[dict[str, Any]]:
    """The rows of the forwarder states table, as dicts with naive-UTC datetimes."""
    rows = connection.query(dialect.sql("forwarder_states_read", forwarder_states=table))
    return [
        {
            "forwarder": row[0],
            "reported_by": row[1],
            "state": row[2],
            "since": dialect.decode_timestamp(row[3]),
            "failures": int(row[4]),
            "last_error": row[5],
            "updated_at": dialect.decode_timestamp(row[6]),
        }
        for row in rows
    ]
