"""`sfbridge spark report`: error queues and retry storage, as JSON and HTML."""

from __future__ import annotations

import argparse
from typing import Any

from bridge.commands.spark import add_spark_options, load_for_spark, run_on_spark
from bridge.config.model import BridgeConfig
from bridge.exceptions import ExitCode
from bridge.secrets import inert


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--report", default="sfbridge-report", help="PATH for PATH.json and PATH.html"
    )
    add_spark_options(parser)


def run(args: argparse.Namespace) -> int:
    config = load_for_spark(args)

    def report(spark: Any, config: BridgeConfig, shipped: Any) -> int:
        from bridge.spark.report import build_report, iter_lines, write_report

        built = build_report(spark, config, shipped)
        for line in iter_lines(built):
            print(inert(line))
        for written in write_report(built, args.report):
            print(f"wrote {written}")
        return ExitCode.OK

    return run_on_spark(args, config, report)
