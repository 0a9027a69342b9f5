"""One scenario (a source database, a destination database, a body size) and its rows.

Before every single run (not timed) the queues, retry storage and ledger are emptied and the
source queue is filled with N NServiceBus-shaped messages; after it, every sent message id must
be in the destination queue exactly once and the forwarding queue, error queue and retry storage
must be empty.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from throughput.baselines import time_ceiling, time_naive_relay
from throughput.daemon import ConfigRejected, sfbridge_command, time_daemon, write_config
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

RowKind = Literal["daemon", "naive", "ceiling"]
PREVIOUS_DEFAULTS = {"batch_size": 100, "concurrency": 2, "peek_interval": "1s"}


@dataclass(frozen=True)
class RowSpec:
    """One row of a scenario's table; daemon rows carry the keys their YAML adds."""

    key: str
    label: str
    kind: RowKind
    forwarder_keys: dict[str, Any] = field(default_factory=dict)
    postgresql_keys: dict[str, Any] = field(default_factory=dict)  # every PG database
    code: str | None = None  # a checkout whose `bridge` runs this row (None: this one)
    route_keys: dict[str, Any] = field(default_factory=dict)  # the route's (`transaction`)
    destination_keys: dict[str, Any] = field(default_factory=dict)  # the destination database's
    # A rate (msg/s) the row's steady rate is checked against, within `RATE_TOLERANCE`.
    expected_rate: float | None = None
    # `tracing.enabled`, exporting to a sink on loopback (`throughput.otlp_sink`); every
    # message's span must reach it.
    tracing: bool = False


# How far a row's steady rate may be from its `expected_rate` (a catch-up limit) and pass.
RATE_TOLERANCE = 0.10


@dataclass
class RowRuns:
    """Every run of one row: rates, CPU ms per message, peak RSS, checks; or why not run."""

    spec: RowSpec
    rates: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    # Daemon rows: READY -> first arrival (ms), and msg/s from the first arrival to the last.
    first_ms: list[float] = field(default_factory=list)
    steady_rates: list[float] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    not_run: str | None = None

    @property
    def msg_per_s(self) -> float | None:
        return statistics.median(self.rates) if self.rates else None

    @property
    def failures(self) -> list[str]:
        return [check for check in self.checks if check != "ok"]


def transaction_mode_rows(both_postgresql: bool) -> list[RowSpec]:
    """The defaults with each other transaction mode on the route (issue 13); two-phase only
    between PostgreSQL databases."""
    modes = ["two-phase", "at-least-once"] if both_postgresql else ["at-least-once"]
    return [
        RowSpec(
            f"transaction-{mode}",
            f"defaults, transaction: {mode}",
            "daemon",
            route_keys={"transaction": mode},
        )
        for mode in modes
    ]


def catch_up_row(rate: int) -> RowSpec:
    """The defaults with a catch-up limit of `rate` msg/s on the destination: the drain's
    steady rate must come within `RATE_TOLERANCE` of it (issue 34)."""
    return RowSpec(
        "catch-up",
        f"defaults, destination max_messages_per_second: {rate}",
        "daemon",
        destination_keys={"max_messages_per_second": rate},
        expected_rate=float(rate),
    )


def tracing_row() -> RowSpec:
    """The defaults with `tracing.enabled` (issue 36), the default sampler, OTLP/HTTP to a
    sink on loopback: against the defaults row of the same round, tracing's cost."""
    return RowSpec(
        "tracing", "defaults, tracing.enabled (OTLP to loopback)", "daemon", tracing=True
    )


def standard_rows(best: dict[str, Any], previous_code: str | None = None) -> list[RowSpec]:
    """previous, defaults, best (the `--best` overrides), naive relay, ceiling.

    With `previous_code` (a checkout of an earlier sfbridge, e.g. a git worktree), the
    previous row is that code at its own defaults, and the previous settings on this code get
    a row of their own; without it, the previous row is the previous settings on this code.
    """
    best_forwarder = {k: v for k, v in best.items() if k != "driver"}
    best_database = {"driver": best["driver"]} if "driver" in best else {}
    best_label = ", ".join(f"{k}={v}" for k, v in best.items()) or "no overrides"
    previous_settings = RowSpec(
        "previous" if previous_code is None else "previous-settings",
        "previous defaults (odbc, batch 100, concurrency 2, peek 1s)"
        if previous_code is None
        else "this code, previous settings (odbc, batch 100, conc. 2, peek 1s)",
        "daemon",
        PREVIOUS_DEFAULTS,
        {"driver": "odbc"},
    )
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
        previous_settings,
        RowSpec("defaults", "defaults (only databases, forwarder, routes)", "daemon"),
        RowSpec("best", f"best ({best_label})", "daemon", best_forwarder, best_database),
        RowSpec("naive", "naive relay (2 transactions per message)", "naive"),
        RowSpec("ceiling", "ceiling (one server-side move in the source)", "ceiling"),
    ]


class Scenario:
    """A source and a destination database with the bridge's tables installed by `sfbridge
    install` and the destination queue created as its transport does."""

    def __init__(
        self,
        name: str,
        source: BenchDatabase,
        destination: BenchDatabase,
        workdir: Path,
        driver_key: bool,
        progress: Callable[[str], None],
    ) -> None:
        self.name, self.source, self.destination = name, source, destination
        self.workdir, self.driver_key, self.progress = workdir, driver_key, progress
        self.environment = {**source.environment(), **destination.environment()}
        self.kinds = {source.kind, destination.kind}
        self._sink: Any = None  # the tracing row's OTLP sink, started for its first run
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
        destination.create_queue(RECEIVER)
        source.create_queue(CEILING)

    def daemon_config(
        self,
        forwarder_keys: dict[str, Any],
        postgresql_keys: dict[str, Any],
        route_keys: dict[str, Any] | None = None,
        destination_keys: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The YAML a user writes, plus exactly the keys the row asks for."""
        databases = {"source": self.source.config_entry(), "dest": self.destination.config_entry()}
        for entry in databases.values():
            if entry["dialect"] == "postgresql":
                entry.update(postgresql_keys)
        databases["dest"].update(destination_keys or {})
        forwarder = {"name": "bench", "database": "source", "queue": QUEUE, **forwarder_keys}
        return {
            "databases": databases,
            "forwarders": [forwarder],
            "routes": [{"match": "*", "database": "dest", **(route_keys or {})}],
        }

    def prepare(self, messages: int, body: bytes) -> set[str]:
        """Not timed: empty every table, fill the source queue."""
        self.source.clear([QUEUE, ERROR_QUEUE, RETRY_TABLE, CEILING])
        self.destination.clear([RECEIVER, LEDGER_TABLE])
        batch = new_messages(messages)
        self.source.fill(QUEUE, batch, body)
        return {message_id for message_id, _ in batch}

    def exactly_once(self, ids: set[str], ceiling: bool = False) -> str:
        """'ok', or what is wrong: ids missing, duplicated or unexpected in the target queue,
        messages left in the forwarding queue, error queue or retry storage."""
        target = self.source if ceiling else self.destination
        got = target.message_ids(CEILING if ceiling else RECEIVER)
        problems = []
        missing, extra = len(ids - set(got)), len(set(got) - ids)
        duplicates = len(got) - len(set(got))
        for count, what in ((missing, "missing"), (duplicates, "duplicated"), (extra, "unknown")):
            if count:
                problems.append(f"{count} ids {what}")
        for table in (QUEUE, ERROR_QUEUE, RETRY_TABLE):
            if left := self.source.count(table):
                problems.append(f"{left} rows left in {table}")
        return "ok" if not problems else "FAILED: " + ", ".join(problems)

    def arrived(self) -> int:
        """Messages in the destination queue(s) now, or 0 while the forwarding queue still
        holds a row (also one deleted by a batch not yet committed).

        Why not always count: counting a queue of fresh rows costs the server about 1 ms per
        1,000 rows (each row's visibility is looked up), and polled every 20 ms that took
        most of a core from the daemon being timed, which the ceiling never paid. The
        forwarding queue's head is one index probe; the bridge commits a destination before
        it deletes the source rows, so only the last few polls count the destination."""
        if self.source.has_rows(QUEUE):
            return 0
        return self.destination.count(RECEIVER)

    def first_arrived(self) -> int:
        """Messages in the destination queue now, looked for by one probe of its head (a
        count only once something is there): the first batch's arrival."""
        return self.destination.count(RECEIVER) if self.destination.has_rows(RECEIVER) else 0

    def run_row(self, row: RowRuns, messages: int, body: bytes) -> None:
        """One run of one row, appended to `row` (or `row.not_run` set)."""
        spec = row.spec
        needs_driver_key = "driver" in spec.postgresql_keys and "PG" in self.kinds
        if spec.kind == "daemon" and needs_driver_key and not self.driver_key:
            row.not_run = "n/a (this sfbridge has no 'driver' key)"
            return
        if row.not_run:
            return
        ids = self.prepare(messages, body)
        if spec.kind == "ceiling":
            row.rates.append(messages / time_ceiling(self.source, messages))
            row.checks.append(self.exactly_once(ids, ceiling=True))
        elif spec.kind == "naive":
            seconds, moved = time_naive_relay(self.source, self.destination)
            row.rates.append(moved / seconds)
            row.checks.append(self.exactly_once(ids))
        else:
            self.run_daemon_row(row, ids, messages)

    def run_daemon_row(self, row: RowRuns, ids: set[str], messages: int) -> None:
        spec = row.spec
        config = self.daemon_config(
            spec.forwarder_keys, spec.postgresql_keys, spec.route_keys, spec.destination_keys
        )
        environment = dict(self.environment)
        if spec.code is not None:
            environment["PYTHONPATH"] = spec.code
        if spec.tracing:
            config["tracing"] = {"enabled": True}
            environment["OTEL_EXPORTER_OTLP_ENDPOINT"] = self.sink().endpoint
            self.sink().take_count()
        path = write_config(self.workdir / f"{spec.key}.yaml", config)
        poll = 0.02 if len(ids) > 1000 else 0.05
        try:
            run = time_daemon(
                path,
                environment,
                self.workdir / f"{spec.key}.log",
                messages,
                self.arrived,
                lambda text: self.progress(f"{spec.key}: {text}"),
                poll_seconds=poll,
                cwd=spec.code,
                first_arrived=self.first_arrived,
            )
        except ConfigRejected as rejected:
            row.not_run = f"n/a (sfbridge rejects the config: {rejected})"
            return
        row.rates.append(run.messages / run.seconds)
        row.cpu_ms.append(1000 * run.cpu_seconds / max(run.messages, 1))
        row.rss_mb.append(run.peak_rss_mb)
        if run.first_seconds is not None and run.seconds > run.first_seconds:
            row.first_ms.append(1000 * run.first_seconds)
            row.steady_rates.append(
                (run.messages - run.first_count) / (run.seconds - run.first_seconds)
            )
        check = self.exactly_once(ids)
        if spec.expected_rate is not None and row.steady_rates:
            off = row.steady_rates[-1] / spec.expected_rate - 1
            if abs(off) > RATE_TOLERANCE:
                check = (
                    f"FAILED: steady rate {row.steady_rates[-1]:.0f} msg/s is {off:+.0%} off "
                    f"the limit {spec.expected_rate:.0f}; {check}"
                )
        if run.exit_code != 0:
            check = f"FAILED: exit code {run.exit_code} after SIGTERM; {check}"
        if spec.tracing and (spans := self.sink().take_count()) != messages:
            check = f"FAILED: {spans} spans reached the collector for {messages} messages; {check}"
        row.checks.append(check)

    def sink(self) -> Any:
        if self._sink is None:
            from throughput.otlp_sink import OtlpSink

            self._sink = OtlpSink()
        return self._sink


def run_scenario(
    scenario: Scenario, specs: Sequence[RowSpec], messages: int, body: bytes, repeat: int
) -> list[RowRuns]:
    """Every row `repeat` times, interleaved (1, 2, 3, .., 1, 2, 3, ..) so that a slow phase
    of the machine hits every row alike."""
    rows = [RowRuns(spec) for spec in specs]
    for round_number in range(1, repeat + 1):
        for row in rows:
            scenario.progress(f"round {round_number}/{repeat}: {row.spec.key} ...")
            start = time.perf_counter()
            scenario.run_row(row, messages, body)
            if row.not_run:
                scenario.progress(f"{row.spec.key}: {row.not_run}")
            else:
                scenario.progress(
                    f"{row.spec.key}: {row.rates[-1]:.0f} msg/s, {row.checks[-1]} "
                    f"({time.perf_counter() - start:.1f} s with filling)"
                )
    return rows


def stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
