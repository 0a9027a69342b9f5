"""One source queue, ten destination databases: `--scenarios pg-10pg`.

Messages go to `bench_receiver_0` .. `bench_receiver_9` in turn, each queue in a database of
its own with its own route, so every batch holds units for all ten databases. Its rows: the
previous code (with `--previous-code` / `--previous-rev`), the defaults, and the ceiling (the
same single-statement move inside the source as in the other scenarios). Every run checks that
each destination queue holds exactly the messages sent to it, once, and that the forwarding
queue, error queue and retry storage are empty.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from throughput.daemon import sfbridge_command, write_config
from throughput.databases import (
    CEILING,
    ERROR_QUEUE,
    LEDGER_TABLE,
    QUEUE,
    RECEIVER,
    RETRY_TABLE,
    BenchDatabase,
    new_messages,
)
from throughput.scenarios import RowSpec, Scenario

DESTINATIONS = 10


def fan_out_rows(previous_code: str | None) -> list[RowSpec]:
    previous = (
        []
        if previous_code is None
        else [
            RowSpec(
                "previous",
                f"previous code ({Path(previous_code).name}, its defaults)",
                "daemon",
                code=previous_code,
            )
        ]
    )
    return [
        *previous,
        RowSpec("defaults", "defaults (only databases, forwarder, routes)", "daemon"),
        RowSpec("ceiling", "ceiling (one server-side move in the source)", "ceiling"),
    ]


class FanOutScenario(Scenario):
    """A source and `len(destinations)` PostgreSQL destinations, installed by `sfbridge
    install`, each destination with its own queue and route."""

    def __init__(
        self,
        name: str,
        source: BenchDatabase,
        destinations: Sequence[BenchDatabase],
        workdir: Path,
        driver_key: bool,
        progress: Callable[[str], None],
    ) -> None:
        self.name, self.source, self.destination = name, source, destinations[0]
        self.destinations = list(destinations)
        self.queues = [f"{RECEIVER}_{number}" for number in range(len(destinations))]
        self.workdir, self.driver_key, self.progress = workdir, driver_key, progress
        self.environment = dict(source.environment())
        for destination in destinations:
            self.environment.update(destination.environment())
        self.kinds = {source.kind, *(destination.kind for destination in destinations)}
        defaults = write_config(workdir / "install.yaml", self.daemon_config({}, {}))
        result = subprocess.run(
            sfbridge_command(defaults, "install"),
            capture_output=True,
            text=True,
            env={**os.environ, **self.environment},
            timeout=300,
        )
        if result.returncode != 0:
            raise RuntimeError(f"sfbridge install failed:\n{result.stdout}{result.stderr}")
        for destination, queue in zip(destinations, self.queues, strict=True):
            destination.create_queue(queue)
        source.create_queue(CEILING)
        self.sent: dict[str, set[str]] = {}

    def daemon_config(
        self,
        forwarder_keys: dict[str, Any],
        postgresql_keys: dict[str, Any],
        route_keys: dict[str, Any] | None = None,
        destination_keys: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        databases = {"source": self.source.config_entry()}
        routes = []
        for number, (destination, queue) in enumerate(
            zip(self.destinations, self.queues, strict=True)
        ):
            databases[f"dest{number}"] = {**destination.config_entry(), **(destination_keys or {})}
            routes.append({"match": queue, "database": f"dest{number}", **(route_keys or {})})
        for entry in databases.values():
            if entry["dialect"] == "postgresql":
                entry.update(postgresql_keys)
        forwarder = {"name": "bench", "database": "source", "queue": QUEUE, **forwarder_keys}
        return {"databases": databases, "forwarders": [forwarder], "routes": routes}

    def prepare(self, messages: int, body: bytes) -> set[str]:
        self.source.clear([QUEUE, ERROR_QUEUE, RETRY_TABLE, CEILING])
        for destination, queue in zip(self.destinations, self.queues, strict=True):
            destination.clear([queue, LEDGER_TABLE])
        batch = new_messages(messages, self.queues)
        self.source.fill(QUEUE, batch, body)
        self.sent = {queue: set() for queue in self.queues}
        for number, (message_id, _) in enumerate(batch):
            self.sent[self.queues[number % len(self.queues)]].add(message_id)
        return {message_id for message_id, _ in batch}

    def arrived(self) -> int:
        if self.source.has_rows(QUEUE):  # as `Scenario.arrived`
            return 0
        return sum(
            destination.count(queue)
            for destination, queue in zip(self.destinations, self.queues, strict=True)
        )

    def first_arrived(self) -> int:
        """As `Scenario.first_arrived`, over every destination queue (the fan-out has no
        single receiver queue)."""
        return sum(
            destination.count(queue) if destination.has_rows(queue) else 0
            for destination, queue in zip(self.destinations, self.queues, strict=True)
        )

    def exactly_once(self, ids: set[str], ceiling: bool = False) -> str:
        """'ok', or what is wrong: per destination queue, ids missing, duplicated or not sent
        there; messages left in the forwarding queue, error queue or retry storage."""
        problems = []
        if ceiling:
            problems += _differences(ids, self.source.message_ids(CEILING), CEILING)
        else:
            for destination, queue in zip(self.destinations, self.queues, strict=True):
                problems += _differences(self.sent[queue], destination.message_ids(queue), queue)
        for table in (QUEUE, ERROR_QUEUE, RETRY_TABLE):
            if left := self.source.count(table):
                problems.append(f"{left} rows left in {table}")
        return "ok" if not problems else "FAILED: " + ", ".join(problems)

    def run_row(self, row: Any, messages: int, body: bytes) -> None:
        if row.spec.kind == "naive":
            row.not_run = "n/a (one destination only)"
            return
        super().run_row(row, messages, body)


def _differences(expected: set[str], got: list[str], queue: str) -> list[str]:
    problems = []
    missing, extra = len(expected - set(got)), len(set(got) - expected)
    duplicates = len(got) - len(set(got))
    for count, what in ((missing, "missing"), (duplicates, "duplicated"), (extra, "unexpected")):
        if count:
            problems.append(f"{count} ids {what} in {queue}")
    return problems
