"""`sfbridge spark reconcile`: check from the databases that every message is in exactly one
place."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from bridge.commands.spark import (
    add_spark_options,
    load_for_spark,
    reconcile_and_print,
    run_on_spark,
)
from bridge.config.model import BridgeConfig
from bridge.exceptions import RequestError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", help="ledger entries since (ISO time, UTC)")
    parser.add_argument("--report", help="write the reconciliation as JSON to this file")
    add_spark_options(parser)


def run(args: argparse.Namespace) -> int:
    config = load_for_spark(args)
    try:
        since = datetime.fromisoformat(args.since) if args.since else None
    except ValueError:
        raise RequestError(
            f"--since wants an ISO time such as 2026-11-23T12:00:00 (UTC); got {args.since!r}"
        ) from None

    def reconcile(spark: Any, config: BridgeConfig, shipped: Any) -> int:
        return reconcile_and_print(spark, config, shipped, since, args.report)

    return run_on_spark(args, config, reconcile)
