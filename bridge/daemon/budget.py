"""How many pool workers each forwarding database gets, so that the daemon never holds more
connections to a database than its `max_connections`.

Who connects to a database X, at most at once:
- the pool workers of every forwarding database whose messages may go to X (its routes and
  proxy destinations), one connection each, and the pool of X itself, one connection per
  worker, two where a crossing out of X keeps transaction records (`at-least-once`,
  `two-phase`: `bridge.forwarding.transactions` commits them on a second connection);
- X's watcher (`bridge.daemon.watcher`) and heartbeat (`bridge.daemon.heartbeat`), one each,
  when X is a forwarding database, and the watcher's listener (`bridge.daemon.push`) one more
  where it listens for pushes;
- upkeep: the scheduled jobs run one at a time, each with at most one connection per
  database (`UPKEEP_CONNECTIONS`); while metrics are on, the metrics sampler holds one more to
  a forwarding database, and the destination checks of `/readyz` one more to a destination
  (`bridge.daemon.readiness`);
- with `servicecontrol`, its checks (one connection per database at a time) and, to
  ServiceControl's database, its heartbeat (`SERVICECONTROL_CONNECTIONS`).

A pool is as large as its forwarders' `concurrency` adds up to, made smaller one worker at a
time (the largest pool first) until every database's sum fits its `max_connections`. Worker
processes split the pools, not add to them: `shares` gives each process its part of every pool
and of every forwarder's `concurrency` (their boards are marked by the daemon's watchers).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.daemon.cpus import usable_cpus
from bridge.daemon.push import push_off_reason
from bridge.daemon.readiness import destination_databases
from bridge.dialects import dialect_for

UPKEEP_CONNECTIONS = 1
WATCHER_CONNECTIONS = 1
LISTENER_CONNECTIONS = 1
HEARTBEAT_CONNECTIONS = 1
SERVICECONTROL_CONNECTIONS = 1
# `daemon.processes: auto` starts no more processes than this: each costs an interpreter (tens
# of MiB), and the first two lift the most.
MAX_AUTO_PROCESSES = 4


def worker_count(config: BridgeConfig, forwarder: ForwarderConfig) -> int:
    """The most batches one forwarder has running at once: its `concurrency`, or one where
    the database serialises writers (SQLite), since a second would only wait for the
    first."""
    dialect = dialect_for(config.databases[forwarder.database].dialect)
    return 1 if dialect.single_writer else forwarder.concurrency


def reserved(config: BridgeConfig, database: str) -> int:
    """Connections to `database` that are not pool workers'."""
    forwarding = any(f.database == database for f in config.forwarders)
    spec = config.databases[database]
    checked = database in destination_databases(config)
    metrics = max(1, forwarding + checked) if config.metrics.listen is not None else 0
    listens = push_off_reason(spec, dialect_for(spec.dialect)) is None
    own = WATCHER_CONNECTIONS + HEARTBEAT_CONNECTIONS + (LISTENER_CONNECTIONS if listens else 0)
    servicecontrol = 0
    if config.servicecontrol is not None:
        servicecontrol = SERVICECONTROL_CONNECTIONS * (
            2 if config.servicecontrol.database == database else 1
        )
    return UPKEEP_CONNECTIONS + metrics + servicecontrol + (own if forwarding else 0)


def pool_sizes(config: BridgeConfig) -> dict[str, int]:
    """Workers per forwarding database (at least one each), in all worker processes."""
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


def process_count(config: BridgeConfig, cpus: int | None = None) -> int:
    """How many processes run the daemon's workers (`daemon.processes`): `auto` takes one per
    usable CPU (`bridge.daemon.cpus`), at most `MAX_AUTO_PROCESSES`; a number is taken as
    given. Never more than the largest pool has workers, which would leave a process with
    nothing to do."""
    most = max(pool_sizes(config).values(), default=1)
    wanted = config.daemon.processes
    if wanted == "auto":
        wanted = str(min(usable_cpus().usable if cpus is None else cpus, MAX_AUTO_PROCESSES))
    return max(1, min(int(wanted), most))


@dataclass(frozen=True)
class Share:
    """One worker process's part of the daemon's pools."""

    index: int  # 0: the daemon's own process
    count: int  # processes in all
    pools: dict[str, int] = field(default_factory=dict)  # database -> workers here
    caps: dict[str, int] = field(default_factory=dict)  # forwarder -> most batches at once here
    # database -> number of its first worker here: worker numbers (counter slots, thread
    # names) are unique across the processes, so two batches never update the same counters row.
    first_worker: dict[str, int] = field(default_factory=dict)
    # The folder of the catch-up limits' shared state (`bridge.daemon.catch_up`); None: no
    # database has one.
    catch_up_folder: str | None = None


def shares(config: BridgeConfig, processes: int) -> list[Share]:
    """Each process's part of every pool and of every forwarder's `concurrency`.

    A pool's workers are dealt out evenly; a forwarder's `concurrency` is dealt out among the
    processes that have workers of its database, each remainder starting where the last one
    ended, so that forwarders of `concurrency: 1` spread over the processes."""
    sizes = pool_sizes(config)
    parts = [Share(index, processes) for index in range(processes)]
    for database, size in sizes.items():
        pools = [_dealt(size, processes, index) for index in range(processes)]
        serving = [index for index, pool in enumerate(pools) if pool > 0]
        forwarders = [f for f in config.forwarders if f.database == database]
        caps: list[dict[str, int]] = [{} for _ in range(processes)]
        offset = 0  # where the next remainder starts: remainders never pile up on one process
        for forwarder in forwarders:
            cap = worker_count(config, forwarder)
            for place, index in enumerate(serving):
                dealt = _dealt(cap, len(serving), (place - offset) % len(serving))
                if dealt:
                    caps[index][forwarder.name] = dealt
            offset = (offset + cap) % len(serving)
        first = 0
        for index, share in enumerate(parts):
            workers = min(pools[index], sum(caps[index].values()))
            if workers == 0:
                continue
            share.pools[database] = workers
            share.caps.update(caps[index])
            share.first_worker[database] = first
            first += workers
    return parts


def _dealt(total: int, ways: int, place: int) -> int:
    """`total` dealt out `ways` ways: what the `place`-th gets."""
    return total // ways + (1 if place < total % ways else 0)


def _uses(config: BridgeConfig, pools: dict[str, int]) -> dict[tuple[str, str], int]:
    """(pool's database, database its workers connect to) -> connections per worker."""
    uses = {(database, database): 1 for database in pools}
    for source, destination, mode in config.crossings():
        uses[(source, destination)] = 1
        if mode != "ledger":
            uses[(source, source)] = 2
    return uses
