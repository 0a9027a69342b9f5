"""The `sfbridge` command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from bridge import __version__
from bridge.config import BridgeConfig, ConfigError, load_config, parse_duration
from bridge.drivers import DatabaseError

log = logging.getLogger("sfbridge")

EXIT_OK = 0
EXIT_PROBLEMS = 1  # `check` found problems, or some work failed
EXIT_CONFIG = 2  # the configuration or the command line is invalid
EXIT_UNAVAILABLE = 3  # a database needed for the command cannot be reached

DEFAULT_CONFIG = "/etc/sfbridge/sfbridge.yaml"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sfbridge",
        description="Store-and-forward bridge for NServiceBus SQL Server / PostgreSQL queues.",
    )
    parser.add_argument("--version", action="version", version=f"sfbridge {__version__}")
    parser.add_argument(
        "-c",
        "--config",
        default=os.environ.get("SFBRIDGE_CONFIG", DEFAULT_CONFIG),
        help=f"configuration file (default: $SFBRIDGE_CONFIG or {DEFAULT_CONFIG})",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, tracebacks")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    install = commands.add_parser(
        "install", help="create forwarding queues, error queues, retry storage and dedup ledgers"
    )
    install.add_argument(
        "--print-sql", action="store_true", help="print the DDL per database instead of running it"
    )
    commands.add_parser("run", help="run the daemon in the foreground (SIGTERM/SIGINT to stop)")
    commands.add_parser("check", help="check config, connectivity, table shapes and indexes")
    status = commands.add_parser(
        "status", help="queued, waiting for retry, in error, per forwarder"
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")

    send = commands.add_parser("send", help="put test messages into a forwarding queue")
    send.add_argument("destination", help="destination queue address (the routing header)")
    send.add_argument("--forwarder", help="forwarder whose queue to write (default: the first)")
    send.add_argument("--count", type=int, default=1, help="how many messages (default 1)")
    send.add_argument("--body", default='{"test": true}', help="message body text (UTF-8)")
    send.add_argument("--type", default="SFBridge.TestMessage", help="EnclosedMessageTypes value")
    send.add_argument(
        "--header", action="append", default=[], metavar="NAME=VALUE", help="extra header"
    )
    send.add_argument("--ttbr", help="time to be received, e.g. 30s (sets Expires)")

    spark = commands.add_parser(
        "spark", help="bulk work on Apache Spark: drain, reconcile, report (needs PySpark)"
    )
    from bridge.spark.command import add_arguments

    add_arguments(spark)

    demo = commands.add_parser("demo", help="replay the store-and-forward sample on SQLite files")
    demo.add_argument("--dir", help="folder for the demo databases (default: a new temp folder)")
    demo.add_argument("--messages", type=int, default=5, help="messages to send (default 5)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from bridge.observability import setup_logging

    setup_logging("INFO", verbose=args.verbose)
    try:
        if args.command == "demo":
            from bridge.demo import run_demo

            return run_demo(folder=args.dir, message_count=args.messages)
        config = _load(args.config)
        setup_logging(config.logging.level, verbose=args.verbose)
        return COMMANDS[args.command](config, args)
    except ConfigError as error:
        print(f"sfbridge: invalid configuration {args.config}:\n{error}", file=sys.stderr)
        return EXIT_CONFIG
    except DatabaseError as error:
        if args.verbose:
            log.exception("database error")
        print(f"sfbridge: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except KeyboardInterrupt:
        return 130


def _load(path: str) -> BridgeConfig:
    config, warnings = load_config(path)
    for warning in warnings:
        log.warning("config: %s", warning)
    return config


def _spark(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.spark.command import run

    return run(config, args)


def _install(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.install import install_plan, render_plan, run_install

    if args.print_sql:
        print(render_plan(config, install_plan(config)))
        return EXIT_OK
    for step in run_install(config):
        print(f"ok  database '{step.database}': {step.description}")
    return EXIT_OK


def _run(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.daemon import Daemon
    from bridge.observability import setup_sentry

    setup_sentry(config.sentry)
    daemon = Daemon(config, reload_config=lambda: _load(args.config))
    daemon.install_signal_handlers()
    return daemon.run()


def _check(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.check import run_checks

    print(f"ok       configuration {args.config}: valid")
    findings = run_checks(config)
    for finding in findings:
        print(finding)
    problems = sum(1 for finding in findings if not finding.ok)
    print(f"{problems} problem(s) found" if problems else "no problems found")
    return EXIT_PROBLEMS if problems else EXIT_OK


def _status(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.status import collect_status, render_json, render_text

    status = collect_status(config)
    print(render_json(status) if args.json else render_text(status))
    unavailable = any("error" in forwarder for forwarder in status["forwarders"])
    return EXIT_UNAVAILABLE if unavailable else EXIT_OK


def _send(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.send import send_test_messages

    names = [forwarder.name for forwarder in config.forwarders]
    name = args.forwarder or names[0]
    if name not in names:
        print(
            f"sfbridge send: no forwarder named {name!r} (forwarders: {', '.join(names)})",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    extra: dict[str, str] = {}
    for item in args.header:
        key, separator, value = item.partition("=")
        if not separator or not key:
            print(f"sfbridge send: --header wants NAME=VALUE, got {item!r}", file=sys.stderr)
            return EXIT_CONFIG
        extra[key] = value
    try:
        ttbr = parse_duration(args.ttbr) if args.ttbr else None
    except ValueError as error:
        print(f"sfbridge send: --ttbr: {error}", file=sys.stderr)
        return EXIT_CONFIG
    if args.count < 1:
        print("sfbridge send: --count must be at least 1", file=sys.stderr)
        return EXIT_CONFIG
    ids = send_test_messages(
        config,
        config.forwarder(name),
        destination=args.destination,
        count=args.count,
        body=args.body.encode(),
        message_type=args.type,
        extra_headers=extra,
        time_to_be_received=ttbr,
    )
    print(f"sent {len(ids)} message(s) to {args.destination} through forwarder '{name}'")
    if len(ids) <= 10:
        for message_id in ids:
            print(f"  {message_id}")
    return EXIT_OK


COMMANDS = {
    "install": _install,
    "run": _run,
    "check": _check,
    "status": _status,
    "spark": _spark,
    "send": _send,
}
