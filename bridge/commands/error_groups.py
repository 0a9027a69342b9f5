"""An error queue grouped in its database (`sfbridge errors summary`) and its first rows
(`sfbridge errors list`), without reading every row into the tools.

`count_groups` asks the dialect's `error_queue_groups` once per error queue: the rows counted
per `NServiceBus.FailedQ` and the values of the headers the grouping reads, with the times of
failure that tell a group's first and last. The rows the database cannot read as the tools do
(headers that are not a JSON object of string or null values: poison, or `null`, or empty) come
back by sequence value, and are read and described here one by one, as
`read_failed_messages` would, so the groups are those `failure_groups.summarize` makes of
every row (a poison row: reason `poison`, `(none)` in the other groupings). Where one
Headers value is not JSON at all and the dialect's statement fails on it (PostgreSQL's cast to
jsonb), `error_queue_groups_checked` is asked instead, which checks each row first (see
bridge/dialects/postgresql/error_groups.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from bridge.commands.error_queues import BATCH_SIZE, ErrorQueue
from bridge.commands.failed_messages import EXCEPTION_TYPE_HEADER, FailedMessage, describe
from bridge.commands.failure_groups import Counted
from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.exceptions import MalformedValue, TableNotFound, ValueNotConvertible
from bridge.headers import (
    DESTINATION_HEADER,
    ENCLOSED_TYPES_HEADER,
    EVENT_TYPE_HEADER,
    FAILED_QUEUE_HEADER,
    FAILURE_REASON_HEADER,
)

# The headers each grouping reads (`failure_groups.group_value`): the statement takes two.
GROUPING_HEADERS = {
    "reason": (FAILURE_REASON_HEADER, FAILURE_REASON_HEADER),
    "destination": (DESTINATION_HEADER, EVENT_TYPE_HEADER),
    "exception": (EXCEPTION_TYPE_HEADER, EXCEPTION_TYPE_HEADER),
    "type": (ENCLOSED_TYPES_HEADER, ENCLOSED_TYPES_HEADER),
}


@dataclass(frozen=True)
class QueueGroups:
    """One error queue as the database grouped it: what it counted, and the messages it
    could not read, described by the tools."""

    counted: list[Counted]
    unreadable: list[FailedMessage]

    @property
    def total(self) -> int:
        return sum(each.count for each in self.counted) + len(self.unreadable)


def count_groups(
    connection: Connection, dialect: Dialect, queue: ErrorQueue, by: str
) -> QueueGroups | None:
    """`queue` grouped `by` one of `GROUPING_HEADERS`, in one read transaction; None when
    the table does not exist. Raises the DatabaseError family."""
    first, second = GROUPING_HEADERS[by]
    try:
        connection.begin_read()
        try:
            rows = connection.query_named(
                dialect.sql("error_queue_groups", queue=queue.address), (first, second)
            )
        except (MalformedValue, ValueNotConvertible):
            connection.rollback()
            connection.begin_read()
            rows = connection.query_named(
                dialect.sql("error_queue_groups_checked", queue=queue.address), (first, second)
            )
        counted: list[Counted] = []
        unreadable_seqs: list[int] = []
        for row in rows:
            if not row["readable"]:
                unreadable_seqs += [int(str(seq)) for seq in _json_list(row["unreadable"])]
                continue
            counted.append(_counted(queue, row, first, second))
        unreadable = _read_rows(connection, dialect, queue, sorted(unreadable_seqs))
    except TableNotFound:
        return None
    finally:
        connection.rollback()
    return QueueGroups(counted, unreadable)


def _counted(queue: ErrorQueue, row: dict[str, object], first: str, second: str) -> Counted:
    failed_queue = _text(row["failed_queue"])
    headers = {first: _text(row["value"]), FAILED_QUEUE_HEADER: failed_queue}
    if second != first:
        headers[second] = _text(row["other_value"])
    forwarder, why_not = queue.owners.owner_of(failed_queue)
    stand_in = FailedMessage("", 0, headers, forwarder=forwarder, not_replayable=why_not)
    times = [_text(row["first_failure"]), _text(row["last_failure"])]
    times += [str(text) for text in _json_list(row["other_times"]) if text is not None]
    return Counted(
        stand_in, int(str(row["messages"])), tuple(text for text in times if text is not None)
    )


def _read_rows(
    connection: Connection, dialect: Dialect, queue: ErrorQueue, seqs: list[int]
) -> list[FailedMessage]:
    """The rows with sequence values `seqs`, described (a row gone meanwhile is left out)."""
    messages = []
    for start in range(0, len(seqs), BATCH_SIZE):
        batch = seqs[start : start + BATCH_SIZE]
        rows = connection.query_named(
            dialect.sql("error_queue_read_many", rows=len(batch), queue=queue.address), batch
        )
        for row in sorted(rows, key=lambda row: int(row["seq"])):
            messages.append(describe(row["id"], int(row["seq"]), row["headers"], queue.owners))
    return messages


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _json_list(value: object) -> list[object]:
    """A JSON array the database built (None: no rows)."""
    if value is None:
        return []
    parsed = json.loads(str(value))
    return parsed if isinstance(parsed, list) else []
