"""Cutting a table into ranges of about equal rows for Spark tasks, and sizing their pages. Pure.

A table is cut by its key (a queue's sequence column, retry storage's `seq`, the ledger's
(message id, destination)): the database gives the key of every n-th row, and each range runs
from one cut (exclusive) to the next (inclusive). Ranges are sized by rows, not by key values,
so a sparse sequence (a queue whose middle was drained) does not give one task everything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

# A reading task gets at most this many rows (one task's share: a few seconds of reading) and,
# when the table is small, at least MIN_ROWS_PER_TASK, so that a few rows are not scattered
# over many tasks whose start-up costs more than their reading.
ROWS_PER_TASK = 100_000
MIN_ROWS_PER_TASK = 5_000
MAX_TASKS = 2_000

# Pages a task reads: the rows of one query. Their size adapts to the rows' bytes, so that a
# page holds about PAGE_BYTES whether headers are 500 bytes or 5 MB.
FIRST_PAGE_ROWS = 1_000
MIN_PAGE_ROWS = 10
MAX_PAGE_ROWS = 10_000
PAGE_BYTES = 8 * 1024 * 1024

K = TypeVar("K")


def task_count(rows: int, parallelism: int) -> int:
    """How many tasks read `rows` rows: none for none; enough that none reads more than
    ROWS_PER_TASK; as many as Spark runs at once (`parallelism`) where each still gets
    MIN_ROWS_PER_TASK; at most MAX_TASKS."""
    if rows <= 0:
        return 0
    by_size = math.ceil(rows / ROWS_PER_TASK)
    by_cores = min(max(1, parallelism), math.ceil(rows / MIN_ROWS_PER_TASK))
    return max(1, min(MAX_TASKS, max(by_size, by_cores)))


def rows_per_range(rows: int, tasks: int) -> int:
    """Rows in each range when `rows` are cut into `tasks` ranges (the last may hold fewer)."""
    return max(1, math.ceil(rows / max(1, tasks)))


def seq_ranges(first: int, last: int, cuts: Sequence[int]) -> list[tuple[int, int]]:
    """Ranges (after, up to], exclusive then inclusive, covering first..last, cut after each
    value in `cuts` (the key of every n-th row). None when last < first (an empty table).

    Cuts outside first..last-1 (rows added or taken between the two reads) are ignored, so the
    ranges never overlap and always cover first..last.
    """
    if last < first:
        return []
    ranges = []
    after = first - 1
    for cut in sorted(set(cuts)):
        if first <= cut < last and cut > after:
            ranges.append((after, cut))
            after = cut
    ranges.append((after, last))
    return ranges


def key_ranges(start: K, last: K, cuts: Sequence[K]) -> list[tuple[K, K]]:
    """Ranges (after, up to] from `start` (below every key) to `last`, cut after each key in
    `cuts`, which must come in the database's own order (its collation, not Python's).

    A cut equal to `last` (the last row was an n-th row) adds no empty range. Should a cut lie
    beyond `last` (rows added between the reads), the range after it is empty in the database's
    order, never overlapping another.
    """
    ranges = []
    after = start
    for cut in cuts:
        if cut == last:
            break
        ranges.append((after, cut))
        after = cut
    ranges.append((after, last))
    return ranges


def next_page_rows(rows: int, page_bytes: int) -> int:
    """The size of the next page after one of `rows` rows and `page_bytes` bytes: about
    PAGE_BYTES worth of rows like these, within MIN_PAGE_ROWS..MAX_PAGE_ROWS."""
    if rows <= 0 or page_bytes <= 0:
        return MAX_PAGE_ROWS
    fitting = rows * PAGE_BYTES // page_bytes
    return max(MIN_PAGE_ROWS, min(MAX_PAGE_ROWS, fitting))
