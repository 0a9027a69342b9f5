"""How many pool workers each forwarding database gets, so that the daemon never holds more
connections to a database than its `max_connections`.

Who connects to a database X, at most at once:
- the pool workers of every forwarding database whose messages may go to X (its routes and
  proxy destinations), one connection each, and the pool of X itself, one connection per
  worker, two where a crossing out of X keeps transaction records (`at-least-once`,
  `two-phase`: `bridge.forwarding.transactions` commits them on a second connection);
- X's watcher (`bridge.daemon.watcher`) and heartbeat (`bridge.daemon.heartbeat`), one each,
  when X is a forwarding database;
- upkeep: the scheduled jobs run one at a time, each with at most one connection per
  database (`UPKEEP_CONNECTIONS`), and the metrics sampler holds one more while metrics are on.

A pool is as large as its forwarders' `concurrency` adds up to, made smaller one worker at a
time (the largest pool first) until every database's sum fits its `max_connections`.
"""

from __future__ import annotations

from collections import Counter

from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.dialects import dialect_for

UPKEEP_CONNECTIONS = 1
WATCHER_CONNECTIONS = 1
HEARTBEAT_CONNECTIONS = 1


def worker_count(config: BridgeConfig, forwarder: ForwarderConfig) -> int:
    """The most batches one forwarder has running at once: its `concurrency`, or one where
    the database serialises writers (SQLite), since a second would only wait for the
    first."""
    dialect = dialect_for(config.databases[forwarder.database].dialect)
    return 1 if dialect.single_writer else forwarder.concurrency


def reserved(config: BridgeConfig, database: str) -> int:
    """Connections to `database` that are not pool workers'."""
    forwarding = any(f.database == database for f in config.forwarders)
    metrics = 1 if config.metrics.listen is not None else 0
    own = WATCHER_CONNECTIONS + HEARTBEAT_CONNECTIONS
    return UPKEEP_CONNECTIONS + metrics + (own if forwarding else 0)


def pool_sizes(config: BridgeConfig) -> dict[str, int]:
    """Workers per forwarding database (at least one each)."""
    demand: Counter[str] = Counter()
    for forwarder in config.forwarders:
        demand[forwarder.database] += worker_count(config, forwarder)
    sizes = dict(demand)
    uses = _uses(config, sizes)
    for _ in range(sum(sizes.values())):
        over = [
            database
            for database, spec in config.databases.items()
            if _held(sizes, uses, database) > spec.max_connections - reserved(config, database)
        ]
        if not over:
            break
        shrinkable = [
            pool
            for pool in sizes
            if sizes[pool] > 1 and any((pool, database) in uses for database in over)
        ]
        if not shrinkable:
            break
        largest = max(shrinkable, key=lambda pool: sizes[pool])
        sizes[largest] -= 1
    return sizes


def _held(sizes: dict[str, int], uses: dict[tuple[str, str], int], database: str) -> int:
    return sum(size * uses.get((pool, database), 0) for pool, size in sizes.items())


def most_connections(config: BridgeConfig, database: str) -> int:
    """The most connections the daemon may hold to `database` with the pools `pool_sizes`
    gives (what `check` compares with the server's limit)."""
    sizes = pool_sizes(config)
    return _held(sizes, _uses(config, sizes), database) + reserved(config, database)


def _uses(config: BridgeConfig, pools: dict[str, int]) -> dict[tuple[str, str], int]:
    """(pool's database, database its workers connect to) -> connections per worker."""
    uses = {(database, database): 1 for database in pools}
    for source, destination, mode in config.crossings():
        uses[(source, destination)] = 1
        if mode != "ledger":
            uses[(source, source)] = 2
    return uses
