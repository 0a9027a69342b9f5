"""`sfbridge spark drain | reconcile | report`: the Spark edge's commands, one module each.

What they share is here: the Spark options, and `run_on_spark`, which loads the configuration,
starts a session, runs the job in it and stops it. PySpark is imported only once a job runs,
so the rest of the CLI works without it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from bridge.commands.configuration import load
from bridge.config.durations import parse_duration
from bridge.config.model import BridgeConfig
from bridge.exceptions import ExitCode, RequestError
from bridge.secrets import inert, open_private

log = logging.getLogger(__name__)

DEFAULT_EXECUTOR_WAIT = "2m"

# A job: given the session, the configuration and the file shipped to the executors.
Job = Callable[[Any, BridgeConfig, Any], int]


def add_spark_options(command: argparse.ArgumentParser) -> None:
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


def load_for_spark(args: argparse.Namespace) -> BridgeConfig:
    """The configuration, found where spark-submit's `--files` put it when `-c` names no file
    here. Raises ConfigError, and UnsetVariables: a job needs every database's variables."""
    if not os.path.exists(args.config):
        from bridge.spark.session import submitted_file

        args.config = submitted_file(args.config) or args.config
    config = load(args)
    config.require_environment("spark", config.databases)
    return config


def run_on_spark(args: argparse.Namespace, config: BridgeConfig, job: Job) -> int:
    """Start a session, run `job` in it, stop it; the job's exit code. Raises RequestError for
    settings that cannot be read, SparkUnavailable when PySpark or Java is missing, SparkFailed
    when Spark fails."""
    from bridge.spark.guard import SparkFailed, explain, is_spark_error, stop_session, watched
    from bridge.spark.session import check_executors, spark_session
    from bridge.spark.shipped import ShippedConfig

    settings = spark_settings(args)
    shipped = ShippedConfig.read(config.source_path or args.config)
    started = time.monotonic()
    try:
        spark = spark_session(settings, f"sfbridge {args.spark_command}")
    except Exception as error:
        if not is_spark_error(error):
            raise
        log.debug("Spark did not start", exc_info=True)
        message, code = explain(str(error), settings, None, None)
        raise SparkFailed(f"Spark did not start: {message}", code) from error
    try:
        print(f"Spark session started in {time.monotonic() - started:.1f} s ({settings.master})")
        with watched(spark, settings):
            check_executors(spark, settings)
            return job(spark, config, shipped)
    finally:
        stop_session(spark)


def spark_settings(args: argparse.Namespace) -> Any:
    """The Spark options as `SparkSettings`. Raises RequestError."""
    from bridge.spark.session import SparkSettings, parse_conf

    try:
        wait = parse_duration(args.wait_for_executors)
    except ValueError as error:
        raise RequestError(f"--wait-for-executors: {error}") from None
    try:
        conf = parse_conf(args.conf)
    except ValueError as error:
        raise RequestError(str(error)) from None
    return SparkSettings(
        master=args.master,
        conf=conf,
        driver_memory=args.driver_memory,
        python_env=args.python_env,
        executor_wait=wait,
    )


def reconcile_and_print(
    spark: Any, config: BridgeConfig, shipped: Any, since: datetime | None, path: str | None
) -> int:
    """Reconcile from the databases and print it (and write it as JSON to `path`);
    ExitCode.FAILED when a message is not in exactly one place."""
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
