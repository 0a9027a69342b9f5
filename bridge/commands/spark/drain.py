"""`sfbridge spark drain`: drain forwarding queues on Spark, then reconcile."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta
from typing import Any

from bridge.commands.selection import forwarder_named
from bridge.commands.spark import (
    add_spark_options,
    load_for_spark,
    reconcile_and_print,
    run_on_spark,
    spark_settings,
)
from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.exceptions import ExitCode
from bridge.messages import utcnow


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--forwarder", help="only this forwarder (default: all)")
    parser.add_argument(
        "--partitions", type=int, help="tasks per queue (default: Spark's parallelism, max 64)"
    )
    parser.add_argument("--report", help="write the reconciliation as JSON to this file")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, move nothing")
    add_spark_options(parser)


def run(args: argparse.Namespace) -> int:
    config = load_for_spark(args)
    forwarders = _forwarders(config, args)
    if args.dry_run:
        from bridge.spark.drain import partitions_for, plan_drain

        spark_settings(args)  # refused as without --dry-run
        _print_plans(plan_drain(config, forwarders, partitions_for(args.partitions, 2)))
        return ExitCode.OK

    def drain(spark: Any, config: BridgeConfig, shipped: Any) -> int:
        return _drain(spark, config, shipped, args)

    return run_on_spark(args, config, drain)


def _forwarders(config: BridgeConfig, args: argparse.Namespace) -> list[ForwarderConfig]:
    """The forwarder `--forwarder` names (RequestError when there is none), else all."""
    return [forwarder_named(config, args.forwarder)] if args.forwarder else list(config.forwarders)


def _drain(spark: Any, config: BridgeConfig, shipped: Any, args: argparse.Namespace) -> int:
    from bridge.spark.drain import partitions_for, plan_drain, run_drain

    partitions = partitions_for(args.partitions, spark.sparkContext.defaultParallelism)
    plans = plan_drain(config, _forwarders(config, args), partitions)
    _print_plans(plans)
    began = time.monotonic()
    # What this drain (and any daemon meanwhile) delivered is held against the queues; what
    # receiving endpoints consumed before it is not its business.
    drain_started = utcnow() - timedelta(seconds=5)
    tasks = run_drain(spark, config, shipped, plans, sys.stdout)
    took = time.monotonic() - began
    claimed = sum(task["claimed"] for task in tasks)
    print(
        f"drain finished in {took:.1f} s: the tasks claimed {claimed} message(s) "
        f"({claimed / took if took else 0:,.0f} msg/s); reconciling from the databases"
    )
    return reconcile_and_print(spark, config, shipped, drain_started, args.report)


def _print_plans(plans: list[Any]) -> None:
    for plan in plans:
        if not plan.ranges:
            print(f"forwarder {plan.forwarder}: queue empty, nothing to drain")
            continue
        print(
            f"forwarder {plan.forwarder}: {plan.queued} queued, sequence {plan.first}..{plan.last}"
            f" in {len(plan.ranges)} partition(s)"
        )
