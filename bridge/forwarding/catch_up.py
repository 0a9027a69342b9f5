"""Catch-up limits: what the deliver step waits for before it writes into a database that has a
rate limit (`max_messages_per_second`) or a cap on batches in flight (`max_batches_in_flight`).

A destination back from a long outage would otherwise take the whole backlog at the speed of
every worker at once. The data path knows only `CatchUpLimits`; the daemon's implementation,
shared by its worker processes, is `bridge.daemon.catch_up`. A batch holds its places for all
the limited databases it writes into, taken in the order of their names (so two batches never
wait for each other's), for the whole of its delivery, and learns how long it waited.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from bridge.config.model import BridgeConfig
from bridge.messages import Forward, Unit

# Counter names (the counters table, `sfbridge status`) of what the limits held back.
HELD_MESSAGES = "catch_up_held"
HELD_MILLISECONDS = "catch_up_held_ms"


@dataclass(frozen=True)
class Held:
    """What the limits held back for one batch: per database, the messages that waited and
    the seconds they waited (only databases where the batch waited at all)."""

    messages: Mapping[str, int] = field(default_factory=dict)
    seconds: Mapping[str, float] = field(default_factory=dict)


class CatchUpLimits(Protocol):
    def hold(self, messages: Mapping[str, int]) -> AbstractContextManager[Held]:
        """Wait until a batch writing `messages` (per limited database) may go, hold its
        places in flight until the context ends; what waited is the context's value."""
        ...


class NoLimits:
    """No database has a limit: nothing waits."""

    @contextmanager
    def hold(self, messages: Mapping[str, int]) -> Iterator[Held]:
        yield Held()


def limited_databases(config: BridgeConfig) -> frozenset[str]:
    """The databases with a catch-up limit."""
    return frozenset(
        name
        for name, database in config.databases.items()
        if database.max_messages_per_second is not None
        or database.max_batches_in_flight is not None
    )


def limited_counts(
    units: Sequence[Unit], limited: Collection[str], skipped: Collection[str]
) -> dict[str, int]:
    """How many of the units go to each database of `limited`, leaving out `skipped` ones (the
    forwarding database itself, paused databases, those in trouble: nothing is written there)."""
    counts: dict[str, int] = {}
    for unit in units:
        if isinstance(unit.decision, Forward):
            database = unit.decision.destination.database
            if database in limited and database not in skipped:
                counts[database] = counts.get(database, 0) + 1
    return counts
