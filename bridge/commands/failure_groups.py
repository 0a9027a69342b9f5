"""Failed messages in groups (`sfbridge errors summary`, `--group`). Pure.

A group is named `BY:VALUE`, the way `errors summary` prints it: `reason:unroutable`,
`exception:System.TimeoutException`, `destination:Samples.Billing`, `type:Shared.OrderSubmitted`
(the first of `NServiceBus.EnclosedMessageTypes`, without its assembly). A message without the
value is in the group `BY:(none)`. `--group` takes that name back and selects the group's
messages, so what a summary shows can be replayed, archived or purged as one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from bridge.commands.failed_messages import EXCEPTION_TYPE_HEADER, FailedMessage
from bridge.exceptions import RequestError
from bridge.headers import ENCLOSED_TYPES_HEADER, TIME_OF_FAILURE_HEADER, parse_wire_date

# The length of a wire date as NServiceBus and the bridge write it (`2026-11-27 09:30:12:123456
# Z`): such texts sort as their times do, so a group compares them as text and parses two.
_WIRE_DATE_LENGTH = 28

GROUP_BY = ("reason", "destination", "exception", "type")
NONE = "(none)"


def group_value(by: str, message: FailedMessage, destination: str | None) -> str:
    """The value `message` is grouped under when grouping by `by`; `destination` is where it
    was going (`ErrorQueue.destination_of`, which knows proxies)."""
    if by == "reason":
        value = message.reason
    elif by == "destination":
        value = destination
    elif by == "exception":
        value = message.header(EXCEPTION_TYPE_HEADER)
    elif by == "type":
        value = message_type(message.header(ENCLOSED_TYPES_HEADER))
    else:
        raise ValueError(f"no grouping {by!r}")
    value = None if value is None else " ".join(value.split())
    return value or NONE


def message_type(enclosed: str | None) -> str | None:
    """The first type of `NServiceBus.EnclosedMessageTypes` without its assembly part:
    `Shared.OrderSubmitted, Shared, Version=1.0.0.0;Shared.IEvent, ...` gives
    `Shared.OrderSubmitted`."""
    if enclosed is None:
        return None
    first = enclosed.split(";", 1)[0]
    return first.split(",", 1)[0].strip() or None


def group_name(by: str, value: str) -> str:
    return f"{by}:{value}"


def parse_group(text: str) -> tuple[str, str]:
    """`--group BY:VALUE` as (by, value). Raises RequestError naming the groupings."""
    by, separator, value = text.partition(":")
    if not separator or by not in GROUP_BY or not value:
        raise RequestError(
            f"--group wants a group as 'sfbridge errors summary' names it, BY:VALUE with BY one "
            f"of {', '.join(GROUP_BY)} (e.g. reason:unroutable); got {text!r}"
        )
    return by, value


@dataclass(frozen=True)
class Counted:
    """Messages a database counted together: `count` of them, alike in all a grouping reads
    (`message`, a stand-in holding only those headers, and the forwarder that owns them), and
    the times of failure that tell their first and last (the least and greatest wire date,
    and every time of failure written otherwise)."""

    message: FailedMessage
    count: int
    times: tuple[str, ...]


@dataclass
class Group:
    """One group of a summary: its value, how many messages, the first and last failure
    (None when no message of it has a readable `NServiceBus.TimeOfFailure`), and how many of
    them `errors replay` can move."""

    by: str
    value: str
    count: int = 0
    replayable: int = 0
    # Times of failure seen: wire-date texts (which sort as times), and others parsed.
    _texts: list[str] = field(default_factory=list, repr=False)
    _times: list[datetime] = field(default_factory=list, repr=False)

    @property
    def name(self) -> str:
        return group_name(self.by, self.value)

    def add(self, message: FailedMessage) -> None:
        self.count += 1
        self.replayable += message.replayable
        text = message.header(TIME_OF_FAILURE_HEADER)
        if text is not None:
            self._see(text)

    def add_counted(self, counted: Counted) -> None:
        """Add messages the database counted together (`bridge.commands.error_groups`)."""
        self.count += counted.count
        self.replayable += counted.count * counted.message.replayable
        for text in counted.times:
            self._see(text)

    def _see(self, text: str) -> None:
        """Take a time of failure into account."""
        if len(text) == _WIRE_DATE_LENGTH and text.endswith(" Z") and len(self._texts) < 2:
            self._texts.append(text)
        elif len(text) == _WIRE_DATE_LENGTH and text.endswith(" Z"):
            # Keep only the least and the greatest: two texts, whatever the group's size.
            low, high = self._texts
            self._texts = [min(low, text), max(high, text)]
        elif (moment := parse_wire_date(text)) is not None:
            self._times.append(moment)

    def _moments(self) -> list[datetime]:
        return [m for m in map(parse_wire_date, self._texts) if m is not None] + self._times

    @property
    def first_failure(self) -> datetime | None:
        """The earliest readable `NServiceBus.TimeOfFailure`, None when none is readable."""
        return min(self._moments(), default=None)

    @property
    def last_failure(self) -> datetime | None:
        return max(self._moments(), default=None)


def summarize(
    by: str,
    entries: Iterable[tuple[FailedMessage | Counted, Callable[[FailedMessage], str | None]]],
) -> list[Group]:
    """The groups of `entries`, largest first, then by name: each a message (or messages the
    database counted, `Counted`) and what tells its destination (`ErrorQueue.destination_of`,
    asked only when grouping by destination)."""
    groups: dict[str, Group] = {}
    for entry, destination_of in entries:
        message = entry.message if isinstance(entry, Counted) else entry
        destination = destination_of(message) if by == "destination" else None
        value = group_value(by, message, destination)
        group = groups.setdefault(value, Group(by, value))
        if isinstance(entry, Counted):
            group.add_counted(entry)
        else:
            group.add(message)
    return sorted(groups.values(), key=lambda group: (-group.count, group.value))
