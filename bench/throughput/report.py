"""The benchmark's results as readable tables (stdout) or one JSON document."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from throughput.scenarios import RowRuns


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def summarize_rows(rows: Sequence[RowRuns]) -> list[dict[str, Any]]:
    """Medians and ratios; each row against the ceiling and against "previous defaults"."""
    by_key = {row.spec.key: row for row in rows}
    ceiling = by_key["ceiling"].msg_per_s if "ceiling" in by_key else None
    previous = by_key["previous"].msg_per_s if "previous" in by_key else None
    ceiling_runs = by_key["ceiling"].rates if "ceiling" in by_key else []
    previous_runs = by_key["previous"].rates if "previous" in by_key else []
    return [
        {
            "key": row.spec.key,
            "label": row.spec.label,
            "not_run": row.not_run,
            "msg_per_s": row.msg_per_s,
            "msg_per_s_runs": [round(rate, 1) for rate in row.rates],
            "vs_ceiling": _ratio(row.msg_per_s, ceiling),
            "vs_previous": _ratio(row.msg_per_s, previous),
            # Each run against the baseline measured in the same round (rows are interleaved).
            "vs_ceiling_runs": _ratios(row.rates, ceiling_runs),
            "vs_previous_runs": _ratios(row.rates, previous_runs),
            # Daemon rows: READY -> first arrival, and the rate from there to the last arrival
            # against the ceiling of the same round (start-up left out).
            "first_arrival_ms": _median(row.first_ms),
            "steady_vs_ceiling": _median(_ratios(row.steady_rates, ceiling_runs)),
            "steady_vs_ceiling_runs": _ratios(row.steady_rates, ceiling_runs),
            "steady_msg_per_s": _median(row.steady_rates),
            "expected_msg_per_s": row.spec.expected_rate,
            "cpu_ms_per_msg": _median(row.cpu_ms),
            "peak_rss_mb": _median(row.rss_mb),
            "exactly_once": row.checks,
            "config": {**row.spec.forwarder_keys, **row.spec.postgresql_keys},
            **(_against_defaults(row, by_key["defaults"]) if tracing(row, by_key) else {}),
        }
        for row in rows
    ]


def tracing(row: RowRuns, by_key: dict[str, RowRuns]) -> bool:
    return row.spec.tracing and "defaults" in by_key


def _against_defaults(row: RowRuns, defaults: RowRuns) -> dict[str, Any]:
    """The tracing row against the defaults row (tracing off) of the same rounds."""
    return {
        "vs_defaults": _ratio(row.msg_per_s, defaults.msg_per_s),
        "vs_defaults_runs": _ratios(row.rates, defaults.rates),
        "defaults_cpu_ms": _median(defaults.cpu_ms),
    }


def _ratios(rates: Sequence[float], bases: Sequence[float]) -> list[float]:
    return [round(rate / base, 4) for rate, base in zip(rates, bases, strict=False) if base]


def _spread(values: Sequence[float]) -> str:
    """min-max of the single runs, when there are several."""
    return f"{min(values):.2f}-{max(values):.2f}" if len(values) > 1 else "-"


def _number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 100 else f"{value:.{digits}g}"


def print_scenario(scenario: dict[str, Any]) -> None:
    print(
        f"\n{scenario['name']}, {scenario['body']} bodies, {scenario['messages']} messages"
        f"{', median of ' + str(scenario['repeat']) if scenario['repeat'] > 1 else ''}"
    )
    print(
        f"  {'row':<58}{'msg/s':>8}{'x ceiling':>11}{'runs':>11}{'x previous':>12}{'runs':>11}"
        f"{'CPU ms/msg':>12}{'peak RSS MB':>13}{'first ms':>10}{'steady x ceiling':>18}"
        f"{'runs':>11}  exactly-once"
    )
    for row in scenario["rows"]:
        if row["not_run"]:
            print(f"  {row['label']:<58}{row['not_run']:>8}")
            continue
        checks = row["exactly_once"]
        passed = sum(check == "ok" for check in checks)
        verdict = "OK" if passed == len(checks) else f"FAILED {len(checks) - passed}/{len(checks)}"
        print(
            f"  {row['label']:<58}{_number(row['msg_per_s']):>8}"
            f"{_number(row['vs_ceiling']):>11}{_spread(row['vs_ceiling_runs']):>11}"
            f"{_number(row['vs_previous']):>12}{_spread(row['vs_previous_runs']):>11}"
            f"{_number(row['cpu_ms_per_msg']):>12}{_number(row['peak_rss_mb']):>13}"
            f"{_number(row.get('first_arrival_ms')):>10}{_number(row.get('steady_vs_ceiling')):>18}"
            f"{_spread(row.get('steady_vs_ceiling_runs') or []):>11}  {verdict}"
        )
        if row.get("expected_msg_per_s") and row.get("steady_msg_per_s"):
            steady, limit = row["steady_msg_per_s"], row["expected_msg_per_s"]
            print(
                f"      steady rate {steady:.0f} msg/s against the limit {limit:.0f} "
                f"({steady / limit - 1:+.1%}; within 10 % passes)"
            )
        if row.get("vs_defaults") is not None:
            print(
                f"      tracing on / off (the defaults row): {row['vs_defaults']:.3f} "
                f"(runs {_spread(row['vs_defaults_runs'])}; CPU ms/msg "
                f"{_number(row['cpu_ms_per_msg'])} against {_number(row['defaults_cpu_ms'])})"
            )
        for failure in sorted({check for check in checks if check != "ok"}):
            print(f"      {failure}")


def print_header(summary: dict[str, Any]) -> None:
    driver = "yes" if summary["driver_key"] else "no (ODBC is its only driver)"
    print(
        f"sfbridge forwarding benchmark: PostgreSQL {summary['postgresql']}, "
        f"{summary['cpus']} CPUs, sfbridge 'driver' key: {driver}"
    )


def print_latency(latency: dict[str, Any]) -> None:
    print(f"\nidle pickup latency, {latency['scenario']}, daemon at its defaults:")
    if latency.get("not_run"):
        print(f"  {latency['not_run']}")
        return
    print(
        f"  send commit -> arrival visible, {latency['messages']} single messages "
        f"{latency['gap']} apart: median {latency['median_ms']:.0f} ms, "
        f"p95 {latency['p95_ms']:.0f} ms, max {latency['max_ms']:.0f} ms  "
        f"(exactly-once {latency['exactly_once']})"
    )
    print(
        f"  idle CPU: {latency['idle_cpu_percent']:.1f} % of one core over "
        f"{latency['idle_seconds']:.0f} s; peak RSS {latency['peak_rss_mb']:.0f} MB"
    )
