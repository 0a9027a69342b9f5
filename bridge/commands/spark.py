"""`sfbridge spark drain | reconcile | report`: the Spark edge's commands."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from datetime import datetime, timedelta
from typing import Any

from bridge.config.durations import parse_duration
from bridge.config.model import BridgeConfig
from bridge.exceptions import ExitCode
from bridge.messages import utcnow
from bridge.secrets import inert, open_private

log = logging.getLogger(__name__)

DEFAULT_EXECUTOR_WAIT = "2m"


def add_arguments(spark: argparse.ArgumentParser) -> None:
    commands = spark.add_subparsers(dest="spark_command", required=True, metavar="SPARK_COMMAND")
    drain = commands.add_parser("drain", help="drain forwarding queues on Spark, then reconcile")
    drain.add_argument("--forwarder", help="only this forwarder (default: all)")
    drain.add_argument(
        "--partitions", type=int, help="tasks per queue (default: Spark's parallelism, max 64)"
    )
    drain.add_argument("--report", help="write the reconciliation as JSON to this file")
    drain.add_argument("--dry-run", action="store_true", help="print the plan, move nothing")
    reconcile = commands.add_parser(
        "reconcile", help="check from the databases that every message is in exactly one place"
    )
    reconcile.add_argument("--since", help="ledger entries since (ISO time, UTC)")
    reconcile.add_argument("--report", help="write the reconciliation as JSON to this file")
    report = commands.add_parser("report", help="error queues and retry storage: JSON and HTML")
    report.add_argument(
        "--report", default="sfbridge-report", help="PATH for PATH.json and PATH.html"
    )
    for command in (drain, reconcile, report):
        _add_spark_options(command)


def _add_spark_options(command: argparse.ArgumentParser) -> None:
    spark = command.add_argument_group("Spark")
    spark.add_argument(
        "--master", default="local[*]", help="local[N], spark://HOST:PORT, yarn, k8s://... "
        "(default local[*])"
    )  # fmt: skip
    spark.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE",
        help="a Spark setting, passed as it is (repeat for more)",
    )  # fmt: skip
    spark.add_argument(
        "--driver-memory", metavar="SIZE", help="the driver's JVM heap, e.g. 2g (default 1g)"
    )
    spark.add_argument(
        "--python-env", metavar="ARCHIVE",
        help="a packed Python environment with sfbridge (venv-pack, conda-pack) for the "
        "executors of a cluster",
    )  # fmt: skip
    spark.add_argument(
        "--wait-for-executors", metavar="DURATION", default=DEFAULT_EXECUTOR_WAIT,
        help="give up when a cluster has given no executor for this long (default 2m)",
    )  # fmt: skip


def run(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.spark.guard import SparkFailed, explain, is_spark_error, stop_session, watched
    from bridge.spark.session import SparkUnavailable, check_executors, spark_session
    from bridge.spark.shipped import ShippedConfig

    command = args.spark_command
    try:
        settings = _settings(args)
    except ValueError as error:
        print(f"sfbridge spark {command}: {error}", file=sys.stderr)
        return ExitCode.USAGE
    shipped = ShippedConfig.read(config.source_path or args.config)
    if command == "drain" and args.dry_run:
        from bridge.spark.drain import partitions_for, plan_drain

        _print_plans(
            plan_drain(config, _forwarders(config, args), partitions_for(args.partitions, 2))
        )
        return ExitCode.OK
    started = time.monotonic()
    try:
        spark = spark_session(settings, f"sfbridge {command}")
    except SparkUnavailable as error:
        print(f"sfbridge: {error}", file=sys.stderr)
        return ExitCode.USAGE
    except Exception as error:
        if not is_spark_error(error):
            raise
        log.debug("Spark did not start", exc_info=True)
        message, code = explain(str(error), settings, None, None)
        print(f"sfbridge spark {command}: Spark did not start: {message}", file=sys.stderr)
        return code
    try:
        print(f"Spark session started in {time.monotonic() - started:.1f} s ({settings.master})")
        with watched(spark, settings):
            check_executors(spark, settings)
            if command == "drain":
                return _drain(spark, config, shipped, args)
            if command == "reconcile":
                since = datetime.fromisoformat(args.since) if args.since else None
                return _reconcile(spark, config, shipped, since, args.report)
            return _report(spark, config, shipped, args.report)
    except SparkFailed as failure:
        log.debug("Spark failed", exc_info=True)
        print(f"sfbridge spark {command}: {failure}", file=sys.stderr)
        return failure.exit_code
    finally:
        stop_session(spark)


def _settings(args: argparse.Namespace) -> Any:
    from bridge.spark.session import SparkSettings, parse_conf

    try:
        wait = parse_duration(args.wait_for_executors)
    except ValueError as error:
        raise ValueError(f"--wait-for-executors: {error}") from None
    return SparkSettings(
        master=args.master,
        conf=parse_conf(args.conf),
        driver_memory=args.driver_memory,
        python_env=args.python_env,
        executor_wait=wait,
    )


def _forwarders(config: BridgeConfig, args: argparse.Namespace) -> list[Any]:
    return [config.forwarder(args.forwarder)] if args.forwarder else list(config.forwarders)


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
    return _reconcile(spark, config, shipped, drain_started, args.report)


def _print_plans(plans: list[Any]) -> None:
    for plan in plans:
        if not plan.ranges:
            print(f"forwarder {plan.forwarder}: queue empty, nothing to drain")
            continue
        print(
            f"forwarder {plan.forwarder}: {plan.queued} queued, sequence {plan.first}..{plan.last}"
            f" in {len(plan.ranges)} partition(s)"
        )


def _reconcile(
    spark: Any, config: BridgeConfig, shipped: Any, since: datetime | None, path: str | None
) -> int:
    from bridge.spark.reconcile import reconcile, render_text

    result = reconcile(spark, config, shipped, since)
    # Message ids and destinations come from messages: each line inert on a terminal.
    for line in render_text(result).splitlines():
        print(inert(line))
    if path:
        with open_private(path) as handle:  # message ids: for the bridge's user only
            json.dump(result, handle, indent=2, default=str)
        print(f"wrote {os.path.abspath(path)}")
    return ExitCode.OK if not result["discrepancies"] else ExitCode.FAILED


def _report(spark: Any, config: BridgeConfig, shipped: Any, path: str) -> int:
    from bridge.spark.report import build_report, iter_lines, write_report

    report = build_report(spark, config, shipped)
    for line in iter_lines(report):
        print(inert(line))
    for written in write_report(report, path):
        print(f"wrote {written}")
    return ExitCode.OK
