"""`sfbridge spark drain | reconcile | report`: the Spark edge's commands."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from bridge.config.model import BridgeConfig

EXIT_OK, EXIT_PROBLEMS, EXIT_CONFIG = 0, 1, 2


def add_arguments(spark: argparse.ArgumentParser) -> None:
    commands = spark.add_subparsers(dest="spark_command", required=True, metavar="SPARK_COMMAND")
    drain = commands.add_parser("drain", help="drain forwarding queues on Spark, then reconcile")
    drain.add_argument("--forwarder", help="only this forwarder (default: all)")
    drain.add_argument(
        "--partitions", type=int, help="tasks per queue (default: Spark's parallelism, max 64)"
    )
    drain.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    drain.add_argument("--report", help="write the reconciliation as JSON to this file")
    drain.add_argument("--dry-run", action="store_true", help="print the plan, move nothing")
    reconcile = commands.add_parser(
        "reconcile", help="check from the databases that every message is in exactly one place"
    )
    reconcile.add_argument("--since", help="ledger entries since (ISO time, UTC)")
    reconcile.add_argument("--master", default="local[*]", help="Spark master")
    reconcile.add_argument("--report", help="write the reconciliation as JSON to this file")
    report = commands.add_parser("report", help="error queues and retry storage: JSON and HTML")
    report.add_argument("--master", default="local[*]", help="Spark master")
    report.add_argument(
        "--report", default="sfbridge-report", help="PATH for PATH.json and PATH.html"
    )


def run(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.spark.session import SparkUnavailable, spark_session

    command = args.spark_command
    if command == "drain":
        return _drain(config, args)
    try:
        spark = spark_session(args.master, f"sfbridge {command}")
    except SparkUnavailable as error:
        print(f"sfbridge: {error}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        if command == "reconcile":
            since = datetime.fromisoformat(args.since) if args.since else None
            return _reconcile(spark, config, since, args.report)
        from bridge.spark.report import build_report, iter_lines, write_report

        report = build_report(spark, config)
        for line in iter_lines(report):
            print(line)
        for path in write_report(report, args.report):
            print(f"wrote {path}")
        return EXIT_OK
    finally:
        spark.stop()


def _drain(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.spark.drain import partitions_for, plan_drain, run_drain
    from bridge.spark.session import SparkUnavailable, spark_session

    forwarders = [config.forwarder(args.forwarder)] if args.forwarder else config.forwarders
    if args.dry_run:
        plans = plan_drain(config, forwarders, partitions_for(args.partitions, 2))
        _print_plans(plans)
        return EXIT_OK
    started = time.monotonic()
    try:
        spark = spark_session(args.master, "sfbridge drain")
    except SparkUnavailable as error:
        print(f"sfbridge: {error}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        print(f"Spark session started in {time.monotonic() - started:.1f} s ({args.master})")
        partitions = partitions_for(args.partitions, spark.sparkContext.defaultParallelism)
        plans = plan_drain(config, forwarders, partitions)
        _print_plans(plans)
        began = time.monotonic()
        # What this drain (and any daemon meanwhile) delivered is held against the queues; what
        # receiving endpoints consumed before it is not its business.
        drain_started = datetime.now(UTC).replace(tzinfo=None) - timedelta(seconds=5)
        tasks = run_drain(spark, config, config.source_path or args.config, plans, sys.stdout)
        took = time.monotonic() - began
        claimed = sum(task["claimed"] for task in tasks)
        print(
            f"drain finished in {took:.1f} s: the tasks claimed {claimed} message(s) "
            f"({claimed / took if took else 0:,.0f} msg/s); reconciling from the databases"
        )
        return _reconcile(spark, config, drain_started, args.report)
    finally:
        spark.stop()


def _print_plans(plans: list[Any]) -> None:
    for plan in plans:
        if not plan.ranges:
            print(f"forwarder {plan.forwarder}: queue empty, nothing to drain")
            continue
        print(
            f"forwarder {plan.forwarder}: {plan.queued} queued, sequence {plan.first}..{plan.last}"
            f" in {len(plan.ranges)} partition(s)"
        )


def _reconcile(spark: Any, config: BridgeConfig, since: datetime | None, path: str | None) -> int:
    from bridge.spark.reconcile import reconcile, render_text

    result = reconcile(spark, config, since)
    print(render_text(result))
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2, default=str)
        print(f"wrote {os.path.abspath(path)}")
    return EXIT_OK if not result["discrepancies"] else EXIT_PROBLEMS
