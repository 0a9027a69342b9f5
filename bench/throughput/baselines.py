"""The two baselines every daemon row is compared with, measured in the same run.

- ceiling: every row moved between two queue tables of the source database by the server
  alone (PostgreSQL: one `WITH .. DELETE .. RETURNING .. INSERT .. SELECT` statement; SQLite:
  `INSERT .. SELECT` + `DELETE` in one transaction). No bridge can beat it.
- naive relay: the store-and-forward sample's shape, per message one source transaction
  (claim one row) and one destination transaction (insert it), the destination committed first.
"""

from __future__ import annotations

import time
from contextlib import closing

from throughput.databases import CEILING, QUEUE, RECEIVER, BenchDatabase


def time_ceiling(source: BenchDatabase, messages: int) -> float:
    """Seconds to move the whole queue into the ceiling table. Raises RuntimeError when it
    did not move `messages` rows."""
    start = time.perf_counter()
    moved = source.move_all(QUEUE, CEILING)
    elapsed = time.perf_counter() - start
    if moved != messages:
        raise RuntimeError(f"the ceiling moved {moved} rows, not {messages}")
    return elapsed


def time_naive_relay(source: BenchDatabase, destination: BenchDatabase) -> tuple[float, int]:
    """(seconds, messages moved) relaying one message per transaction pair until the source
    queue is empty."""
    moved = 0
    with closing(source.relay()) as claim, closing(destination.relay()) as deliver:
        start = time.perf_counter()
        while (row := claim.claim_one(QUEUE)) is not None:
            deliver.insert_one(RECEIVER, *row)
            deliver.commit()
            claim.commit()
            moved += 1
        claim.commit()
        return time.perf_counter() - start, moved
