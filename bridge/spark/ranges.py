"""Splitting a queue's sequence column into the ranges Spark tasks drain. Pure."""

from __future__ import annotations


def split_range(first: int, last: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous, non-overlapping ranges (inclusive) covering first..last.

    Fewer when there are fewer values than parts; none when last < first (an empty queue).
    Rows added after the bounds were read (above `last`) are left to the next drain or the
    daemon.
    """
    if last < first or parts < 1:
        return []
    size = last - first + 1
    parts = min(parts, size)
    step, extra = divmod(size, parts)
    ranges = []
    start = first
    for index in range(parts):
        end = start + step - 1 + (1 if index < extra else 0)
        ranges.append((start, end))
        start = end + 1
    return ranges
