"""How a delivery keeps one message's trouble from holding up the rest of its batch.

- `Isolation`: an item whose own failure is known (its table is missing, the server rejects a
  value) is taken out with its result, and the others are written again without it.
- `DeadlineSplit`: a batch whose write missed the statement deadline (`query_timeout`) is
  written again in halves, each in a destination transaction of its own, down to one message;
  a message that misses the deadline alone fails alone (`too_large_for_deadline`). A deadline
  that a smaller batch meets is the batch's size, not an outage of the database.
- `ChunkLimit`: what a split taught, so that the next batches to the same database are written
  in chunks that meet the deadline instead of missing it again first.

All pure: the deliveries (`bridge.forwarding.deliver`) run the rounds and catch what their
attempts raise.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence

from bridge.exceptions import QueryTimeout
from bridge.messages import Delivered, DeliveryResult, Duplicate, Failed, Item

# How long the chunk size a split taught holds before it doubles (and doubles again after as
# long, until it no longer limits anything): a batch that misses the deadline costs one
# `query_timeout` per halving, so a database that is slow for a while should not pay that on
# every batch; one that recovered gets its whole batches back within minutes.
CHUNK_LIMIT_HOLD_SECONDS = 60.0
# Chunk sizes at or above this are no limit (no batch is that large: `batch_size` <= 10,000).
NO_CHUNK_LIMIT = 10_000


class DeadlineMissed(Exception):
    """Writing the items (not ending the transaction) missed the statement deadline: the
    server cancelled the statement (PostgreSQL's `statement_timeout`) or the driver gave up on
    it (SQL Server's query timeout). The transaction was rolled back, so nothing of it is
    left; a smaller batch may meet the deadline. Raised by `RemoteDelivery._transaction`,
    caught by `RemoteDelivery._deliver_in_time`."""

    def __init__(self, error: QueryTimeout) -> None:
        super().__init__(str(error))
        self.error = error


class Isolation:
    """The attempts at writing some items, until one succeeds: an item whose own failure is
    known is taken out with its result (`failed`), and a failure that cannot be pinned on an
    item switches to one row per statement (`not_isolated`). Each round succeeds, settles at
    least one item or switches, so the rounds end. Each delivery runs the rounds itself,
    catching what its attempts raise."""

    def __init__(self, items: Sequence[Item]) -> None:
        self._items = items
        self._results: dict[int, DeliveryResult] = {}
        self._pending = list(range(len(items)))
        self._finished = not items
        self.one_by_one = False

    def pending(self) -> list[Item] | None:
        """The items the next attempt writes; None once every item has its result."""
        if self._finished:
            return None
        return [self._items[i] for i in self._pending]

    def succeeded(self, written: Mapping[int, DeliveryResult]) -> None:
        """The attempt wrote the pending items: their results, by offset among them."""
        for offset, result in written.items():
            self._results[self._pending[offset]] = result
        self._finished = True

    def not_isolated(self) -> None:
        """The attempt failed for an item it could not tell: one row per statement now."""
        if self.one_by_one:
            raise AssertionError("single-row writes always name the failing item")
        self.one_by_one = True

    def failed(self, offsets: Sequence[int], result: Failed) -> None:
        """The attempt failed for the pending items at `offsets`, which settle as `result`."""
        for offset in offsets:
            self._results[self._pending[offset]] = result
        self._pending = [p for i, p in enumerate(self._pending) if i not in offsets]
        self._finished = not self._pending

    def results(self) -> list[DeliveryResult]:
        """Every item's result, in order."""
        return [self._results[i] for i in range(len(self._items))]


class DeadlineSplit:
    """The chunks `count` items are written in, each in a destination transaction of its own,
    in order: all at once, or in chunks of at most `limit` (`ChunkLimit`); a chunk that missed
    the deadline is replaced by its halves (`missed`), and once one met it after a miss, the
    chunks left are cut to its size. Each round settles a chunk or halves one, so the rounds
    end, after at most 2 * `count` - 1 of them."""

    def __init__(self, count: int, limit: int | None = None) -> None:
        size = max(1, count if limit is None else limit)
        self._chunks = deque(_pieces([range(count)], size))
        self._results: list[DeliveryResult | None] = [None] * count
        self.misses = 0  # chunks that missed the deadline
        # The largest chunk that met the deadline after one missed it (0: none did).
        self.largest_met = 0

    def current(self) -> range | None:
        """The offsets of the items the next transaction writes; None once all have results."""
        return self._chunks[0] if self._chunks else None

    def settled(self, results: Sequence[DeliveryResult]) -> None:
        """The current chunk finished within the deadline (whatever became of each item):
        its items' results, in order."""
        chunk = self._chunks.popleft()
        self._results[chunk.start : chunk.stop] = results
        if self.misses and len(chunk) > self.largest_met and _any_written(results):
            self.largest_met = len(chunk)
            # The chunks still to write in pieces of this size: a larger one would likely miss
            # the deadline again first (one more wait of a whole deadline).
            self._chunks = deque(_pieces(self._chunks, self.largest_met))

    def missed(self) -> bool:
        """The current chunk missed the deadline. With more than one item it is replaced by
        its halves, the first half next, and True is returned; with one item, False: the
        caller settles it (`settled`), since no smaller write could meet the deadline."""
        self.misses += 1
        chunk = self._chunks[0]
        if len(chunk) == 1:
            return False
        self._chunks.popleft()
        middle = chunk.start + (len(chunk) + 1) // 2
        self._chunks.appendleft(range(middle, chunk.stop))
        self._chunks.appendleft(range(chunk.start, middle))
        return True

    def give_up(self, result: Failed) -> None:
        """Every item not written yet settles as `result` (the database went down meanwhile)."""
        while self._chunks:
            chunk = self._chunks.popleft()
            self._results[chunk.start : chunk.stop] = [result] * len(chunk)

    def results(self) -> list[DeliveryResult]:
        """Every item's result, in order; only once `current` is None."""
        assert not self._chunks, "results asked for before every chunk was settled"
        return self._results  # type: ignore[return-value]  # no None is left


def _any_written(results: Sequence[DeliveryResult]) -> bool:
    return any(isinstance(result, (Delivered, Duplicate)) for result in results)


def _pieces(chunks: Iterable[range], size: int) -> Iterator[range]:
    """`chunks` in order, each cut into pieces of at most `size`."""
    for chunk in chunks:
        for start in range(chunk.start, chunk.stop, size):
            yield range(start, min(start + size, chunk.stop))


class ChunkLimit:
    """The most items one destination transaction of one delivery takes: no limit until a
    batch had to be split to meet the deadline; then the largest chunk that met it, for
    `CHUNK_LIMIT_HOLD_SECONDS`, then twice that for as long, and so on until it no longer
    limits anything. `now` is a monotonic clock reading, passed in."""

    def __init__(self, hold: float = CHUNK_LIMIT_HOLD_SECONDS) -> None:
        self._hold = hold
        self._size: int | None = None
        self._since = 0.0

    def current(self, now: float) -> int | None:
        """The limit for the next batch; None (nearly always) for none."""
        if self._size is not None and now - self._since >= self._hold:
            self._size *= 2
            self._since = now
            if self._size >= NO_CHUNK_LIMIT:
                self._size = None
        return self._size

    def learn(self, split: DeadlineSplit, now: float) -> None:
        """What `split` found: a size that met the deadline after a larger one missed it.
        A message that missed it alone teaches nothing: it is that message's size."""
        if split.misses and split.largest_met:
            self._size = split.largest_met
            self._since = now


def too_large_for_deadline(
    item: Item, table: str, database: str, query_timeout: float, error: str
) -> str:
    """Why `item` failed: written alone into `table` of `database`, it missed the deadline
    (`error`, the server's or driver's words) while the database answers."""
    size = len(item.message.body or b"") + len(item.forward.headers_text)
    return (
        f"message of {describe_size(size)} is larger than query_timeout allows: writing it "
        f"alone into {table} took longer than the {query_timeout:g} s query_timeout of "
        f"database '{database}' ({error}), while the database answers; raise that "
        "query_timeout, or send smaller messages"
    )


def describe_size(size: int) -> str:
    """`size` bytes as a person reads them: `512 bytes`, `3.5 KiB`, `20.0 MiB`."""
    if size < 1024:
        return f"{size} bytes"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KiB"
    return f"{size / (1024 * 1024):.1f} MiB"
