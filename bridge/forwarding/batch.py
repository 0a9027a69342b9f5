"""One batch's state, handed explicitly from each step of the spine to the next.

`bridge.forwarding.spine` builds a `Batch` when it opens the source transaction; claim fills
`claimed`, classify `units` (and `missing_tables`, tables of the bridge found missing on the
way), deliver `results`, settle `report.counts`; commit ends it. Nothing about a batch is kept
on the objects that serve many batches.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from bridge.drivers import Connection
from bridge.exceptions import BridgeTableMissing
from bridge.forwarding.catch_up import Held
from bridge.forwarding.transactions import BatchTransactions
from bridge.messages import ClaimedMessage, DeliveryResult, Source, Unit
from bridge.storage.pauses import Pause


@dataclass
class BatchReport:
    """What one batch did; counts by fate (`bridge.forwarding.settle`)."""

    claimed: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    # The claim stopped at its row limit or its byte budget rather than at the end of what it
    # could take: there is probably more, so forward again without waiting.
    full: bool = False


@dataclass
class Batch:
    """The open source transaction and everything decided in it so far."""

    source: Source
    connection: Connection  # to the forwarding database, in the source transaction
    now: datetime  # naive UTC, as the queue tables store times
    transactions: BatchTransactions  # the source side of two-phase and at-least-once
    claimed: list[ClaimedMessage] = field(default_factory=list)
    claimed_at: float = 0.0  # time.monotonic() when the claim returned
    # The destination databases paused as read in this transaction after the claim: what
    # deliver holds back (`bridge.storage.pauses`).
    paused: dict[str, Pause] = field(default_factory=dict)
    units: list[Unit] = field(default_factory=list)
    results: list[DeliveryResult | None] = field(default_factory=list)
    held: Held = field(default_factory=Held)  # what catch-up limits held back (deliver)
    report: BatchReport = field(default_factory=BatchReport)
    # Delivered into the forwarding database's own queues: committed with the source.
    delivered_locally: int = 0
    # Tables of the bridge found missing where that must not fail the batch (the event types
    # table): healed after the commit.
    missing_tables: list[BridgeTableMissing] = field(default_factory=list)
    # Logs what settle found failing (`Settlement.tell`): called once the commit has made it
    # so, so that a batch rolled back tells of nothing it did not do.
    tell_failures: Callable[[], None] | None = None
