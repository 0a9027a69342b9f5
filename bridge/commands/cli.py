"""The `sfbridge` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from collections.abc import Sequence

from bridge import __version__
from bridge.config import BridgeConfig, load_config, parse_duration
from bridge.config.environment import ENVIRONMENT_FILE
from bridge.exceptions import (
    ConfigError,
    DatabaseError,
    ExitCode,
    UnsetVariable,
    UnsetVariables,
)
from bridge.secrets import inert

log = logging.getLogger("sfbridge")


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
        # An empty SFBRIDGE_CONFIG (a unit file's `Environment=SFBRIDGE_CONFIG=`) means unset.
        default=os.environ.get("SFBRIDGE_CONFIG") or DEFAULT_CONFIG,
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
    install.add_argument(
        "--print-grants",
        action="store_true",
        help="print, per database, the statements that create a dedicated login with the least "
        "the bridge needs (the DBA creates the tables with --print-sql)",
    )
    install.add_argument(
        "--login", help="with --print-grants: the login's name (default: the connection's Uid)"
    )
    install.add_argument(
        "--login-creates-tables",
        action="store_true",
        help="with --print-grants: let the login create (and own) the bridge's tables instead",
    )
    commands.add_parser("run", help="run the daemon in the foreground (SIGTERM/SIGINT to stop)")
    commands.add_parser("check", help="check config, connectivity, table shapes and indexes")
    status = commands.add_parser(
        "status", help="queued, waiting for retry, in error, per forwarder"
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument(
        "--audit",
        action="store_true",
        help="only the audit log: the last 50 operator commands (who, when, what, how many)",
    )

    send = commands.add_parser("send", help="put test messages into a forwarding queue")
    send.add_argument(
        "destination",
        nargs="?",
        help="destination queue address (the routing header); leave it out for a proxy "
        "forwarder to send as an unchanged endpoint does",
    )
    send.add_argument("--forwarder", help="forwarder whose queue to write (default: the first)")
    send.add_argument("--count", type=int, default=1, help="how many messages (default 1)")
    send.add_argument("--body", default='{"test": true}', help="message body text (UTF-8)")
    send.add_argument("--type", default="SFBridge.TestMessage", help="EnclosedMessageTypes value")
    send.add_argument(
        "--header", action="append", default=[], metavar="NAME=VALUE", help="extra header"
    )
    send.add_argument("--ttbr", help="time to be received, e.g. 30s (sets Expires)")

    for verb, what in (
        ("pause", "stop a forwarder claiming, or hold its messages for one destination database"),
        ("resume", "undo 'pause'"),
    ):
        command = commands.add_parser(verb, help=what)
        command.add_argument("forwarder", help="the forwarder's name")
        command.add_argument(
            "--destination",
            metavar="DB",
            help="only its deliveries to this database (a name under 'databases')",
        )
        if verb == "pause":
            command.add_argument("--reason", help="shown by status, e.g. 'receiver upgrade'")

    _add_errors_command(commands)

    retries = commands.add_parser(
        "retries",
        help="list the messages waiting in retry storage, make them due now, or fail them to "
        "the error queue",
    )
    from bridge.commands.retries import add_arguments as add_retries_arguments

    add_retries_arguments(retries)

    route = commands.add_parser(
        "route",
        help="where a message with this destination (or event type) would go, or why it would "
        "go to the error queue; reads no database but subscription tables",
    )
    from bridge.commands.route import add_arguments as add_route_arguments

    add_route_arguments(route)

    spark = commands.add_parser(
        "spark", help="bulk work on Apache Spark: drain, reconcile, report (needs PySpark)"
    )
    from bridge.commands.spark import add_arguments

    add_arguments(spark)

    demo = commands.add_parser("demo", help="replay the store-and-forward sample on SQLite files")
    demo.add_argument("--dir", help="folder for the demo databases (default: a new temp folder)")
    demo.add_argument("--messages", type=int, default=5, help="messages to send (default 5)")
    _accept_config_after_the_command(parser)
    return parser


def _add_errors_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from bridge.commands.failed_messages import REASONS

    errors = commands.add_parser(
        "errors", help="list, show, replay or purge the messages in the error queues"
    )
    verbs = errors.add_subparsers(dest="errors_command", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="one line per failed message")
    show = verbs.add_parser("show", help="one message's headers and a preview of its body")
    show.add_argument(
        "id", help="the message's Id or its NServiceBus.MessageId, as 'errors list' shows them"
    )
    replay = verbs.add_parser(
        "replay",
        help="move failed messages back into their forwarding queue (NServiceBus.FailedQ), "
        "without the failure headers, so they are routed again",
    )
    purge = verbs.add_parser("purge", help="delete failed messages (asks first)")
    for verb in (listing, replay, purge):
        verb.add_argument(
            "--forwarder",
            metavar="F",
            help="only messages that failed in this forwarder's queue",
        )
        verb.add_argument(
            "--reason", metavar="R", help=f"only this failure reason: {', '.join(REASONS)}"
        )
        verb.add_argument(
            "--destination",
            metavar="GLOB",
            help="only messages whose destination table name (or whole address, or event type) "
            "matches, e.g. 'Samples.*' (case-sensitive, as routes are)",
        )
        verb.add_argument(
            "--since",
            metavar="T",
            help="only messages that failed since T: a duration back from now (2h, 30m, 1d12h) "
            "or an ISO time (2026-11-23T12:00:00Z; UTC unless it gives an offset)",
        )
        verb.add_argument(
            "--id",
            action="append",
            default=[],
            metavar="ID",
            help="only this message, by its Id or its NServiceBus.MessageId (repeat for more); "
            "an id not found changes nothing",
        )
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    replay.add_argument(
        "--dry-run", action="store_true", help="print what would move; move nothing"
    )
    purge.add_argument("--yes", action="store_true", help="do not ask (needed without a terminal)")


def _accept_config_after_the_command(parser: argparse.ArgumentParser) -> None:
    """`sfbridge status -c FILE` works like `sfbridge -c FILE status`, for every subcommand.

    The option is added to each subcommand's parser with no default of its own, so it only
    overrides the top-level value when it is given there.
    """
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subcommand in action.choices.values():
                subcommand.add_argument(
                    "-c", "--config", default=argparse.SUPPRESS, help="configuration file"
                )
                _accept_config_after_the_command(subcommand)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from bridge.daemon.observability import setup_logging

    setup_logging("INFO", verbose=args.verbose)
    try:
        if args.command == "demo":
            from bridge.commands.demo import run_demo

            return run_demo(folder=args.dir, message_count=args.messages)
        if args.command == "spark" and not os.path.exists(args.config):
            from bridge.spark.session import submitted_file

            args.config = submitted_file(args.config) or args.config
        config = _load(args.config)
        setup_logging(config.logging.level, verbose=args.verbose)
        return COMMANDS[args.command](config, args)
    except ConfigError as error:
        if _is_missing_file(error):
            print(
                f"sfbridge: configuration file {args.config} not found; point at one with "
                "-c FILE (before or after the command) or SFBRIDGE_CONFIG=FILE "
                f"(default {DEFAULT_CONFIG}); `sfbridge demo` needs none",
                file=sys.stderr,
            )
            return ExitCode.USAGE
        print(f"sfbridge: invalid configuration {args.config}:\n{error}", file=sys.stderr)
        return ExitCode.USAGE
    except UnsetVariables as error:
        print(
            f"sfbridge {args.command}: {_NEEDS_EVERY_DATABASE[args.command]}; not set:",
            file=sys.stderr,
        )
        for path, names in error.unset:
            print(f"  {path}: {', '.join(names)}", file=sys.stderr)
        print(f"  {error.advice}", file=sys.stderr)
        return ExitCode.USAGE
    except UnsetVariable as error:
        print(
            f"sfbridge {_verb(args)}: database '{error.database}': {error.problem}", file=sys.stderr
        )
        print(f"  {error.advice}", file=sys.stderr)
        return ExitCode.USAGE
    except DatabaseError as error:
        if args.verbose:
            log.exception("database error")
        print(inert(f"sfbridge: {error}"), file=sys.stderr)
        return ExitCode.UNAVAILABLE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`sfbridge errors list | head`): not a failure of ours. Point
        # stdout at /dev/null so that flushing it at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.OK


# Verbs that open every database they work with at once, so that they refuse to start
# (`BridgeConfig.require_environment`) rather than stop halfway for a variable that is not
# set; every other verb opens a database when it comes to it, and needs its variables then.
_NEEDS_EVERY_DATABASE = {
    "run": "the daemon opens every database when it starts, so it needs every variable the "
    "configuration names",
    "install": "install opens every database it creates tables in, and touches none until "
    "their variables are set",
    "spark": "Spark jobs do the daemon's work in bulk and need every database's variables",
}


def _verb(args: argparse.Namespace) -> str:
    """The command as typed, e.g. `errors replay`."""
    words = [args.command]
    words += [getattr(args, f"{args.command}_command", None) or ""]
    return " ".join(word for word in words if word)


def _is_missing_file(error: ConfigError) -> bool:
    return len(error.problems) == 1 and error.problems[0].message == (
        "configuration file not found"
    )


def _load(path: str) -> BridgeConfig:
    config, warnings = load_config(path)
    for warning in warnings:
        log.warning("config: %s", warning)
    return config


def _spark(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.commands.spark import run

    config.require_environment("spark", config.databases)
    return run(config, args)


def _install(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.commands.install import install_plan, render_plan, run_install

    if args.print_sql:
        print(render_plan(config, install_plan(config)))
        return ExitCode.OK
    if args.print_grants:
        from bridge.commands.least_privilege import render_grants

        print(render_grants(config, args.login, login_creates_tables=args.login_creates_tables))
        return ExitCode.OK
    config.require_environment("install", {step.database for step in install_plan(config)})
    for step in run_install(config):
        print(f"ok  database '{step.database}': {step.description}")
    return ExitCode.OK


def _run(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.daemon.observability import setup_sentry
    from bridge.daemon.runtime import Daemon
    from bridge.forwarding.spine import tune_garbage_collection

    config.require_environment("run")
    setup_sentry(config.sentry)
    tune_garbage_collection()
    daemon = Daemon(config, reload_config=lambda: _reload(args.config))
    daemon.install_signal_handlers()
    code = daemon.run()
    if daemon.abandoned or _threads_left():
        _leave_now(code)
    return code


def _reload(path: str) -> BridgeConfig:
    """The configuration the daemon reloads on SIGHUP; refused (the old one kept) when it
    names a variable that is not set: the daemon's environment is the one it started with."""
    config = _load(path)
    try:
        config.require_environment("run")
    except UnsetVariables as error:
        advice = (
            "a running daemon keeps the environment it started with: add them to "
            f"{ENVIRONMENT_FILE} and restart it (systemctl restart sfbridge)"
        )
        raise UnsetVariables(error.verb, error.unset, advice) from None
    return config


def _threads_left() -> bool:
    """Whether a thread the interpreter would wait for at exit still runs (a scheduled job
    inside a call to a database that does not answer)."""
    return any(
        thread is not threading.main_thread() and not thread.daemon and thread.is_alive()
        for thread in threading.enumerate()
    )


def _leave_now(code: int) -> None:
    """Exit without waiting for threads still inside a database call: SIGTERM must not hang.
    Their transactions are rolled back by the servers when the connections go away with the
    process (and a destination commit made is in the dedup ledger)."""
    from bridge.daemon.observability import flush_sentry

    flush_sentry()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _check(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.commands.check import run_checks

    print(f"ok       configuration {args.config}: valid")
    findings = run_checks(config)
    for finding in findings:
        print(finding)
    problems = sum(1 for finding in findings if not finding.ok)
    print(f"{problems} problem(s) found" if problems else "no problems found")
    return ExitCode.FAILED if problems else ExitCode.OK


def _status(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.commands.status import collect_status, render_json, render_text

    if args.audit:
        from bridge.commands.audit import recent_commands
        from bridge.commands.status import render_audit
        from bridge.connections import Connections

        connections = Connections(config.databases)
        try:
            audit = recent_commands(config, connections, 50)
        finally:
            connections.close()
        if args.json:
            print(json.dumps({"audit": audit}, indent=2))
        else:
            print(
                "\n".join(inert(line) for line in render_audit(audit))
                or "no operator commands recorded"
            )
        return ExitCode.OK
    status = collect_status(config)
    print(render_json(status) if args.json else render_text(status))
    unavailable = any("error" in forwarder for forwarder in status["forwarders"])
    if unavailable:
        return ExitCode.UNAVAILABLE
    if status["auth_failed"]:
        return ExitCode.FAILED  # a refused login stays until a person fixes it
    # Nothing is forwarded while no daemon runs: a script or a check must not read it as fine.
    return ExitCode.OK if status["daemons_running"] else ExitCode.FAILED


def _send(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.commands.send import dotted_name_warning, send_test_messages

    names = [forwarder.name for forwarder in config.forwarders]
    name = args.forwarder or names[0]
    if name not in names:
        print(
            f"sfbridge send: no forwarder named {name!r} (forwarders: {', '.join(names)})",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    extra: dict[str, str] = {}
    for item in args.header:
        key, separator, value = item.partition("=")
        if not separator or not key:
            print(f"sfbridge send: --header wants NAME=VALUE, got {item!r}", file=sys.stderr)
            return ExitCode.USAGE
        extra[key] = value
    try:
        ttbr = parse_duration(args.ttbr) if args.ttbr else None
    except ValueError as error:
        print(f"sfbridge send: --ttbr: {error}", file=sys.stderr)
        return ExitCode.USAGE
    if args.count < 1:
        print("sfbridge send: --count must be at least 1", file=sys.stderr)
        return ExitCode.USAGE
    forwarder = config.forwarder(name)
    if args.destination is None and forwarder.destination is None:
        print(
            f"sfbridge send: forwarder '{name}' routes by the destination header: give the "
            "destination queue address (only a proxy forwarder takes messages without one)",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    if args.destination is not None:
        warning = dotted_name_warning(config, forwarder, args.destination)
        if warning:
            print(f"sfbridge send: warning: {warning}", file=sys.stderr)
    ids = send_test_messages(
        config,
        forwarder,
        destination=args.destination,
        count=args.count,
        body=args.body.encode(),
        message_type=args.type,
        extra_headers=extra,
        time_to_be_received=ttbr,
    )
    if args.destination is None:
        assert forwarder.destination is not None
        where = f"the proxy's destination in database '{forwarder.destination.database}'"
    else:
        where = args.destination
    print(inert(f"sent {len(ids)} message(s) to {where} through forwarder '{name}'"))
    if len(ids) <= 10:
        for message_id in ids:
            print(f"  {inert(message_id)}")
    return ExitCode.OK


def _pause_or_resume(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.commands.pause import change_pause
    from bridge.exceptions import PauseRequestError

    try:
        print(
            change_pause(
                config,
                args.forwarder,
                args.destination,
                pause=args.command == "pause",
                reason=getattr(args, "reason", None),
            )
        )
    except PauseRequestError as error:
        print(f"sfbridge {args.command}: {error}", file=sys.stderr)
        return ExitCode.USAGE
    return ExitCode.OK


def _errors(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.commands.errors import ErrorsRequestError, run_errors

    try:
        return run_errors(config, args)
    except ErrorsRequestError as error:
        print(inert(f"sfbridge errors {args.errors_command}: {error}"), file=sys.stderr)
        return ExitCode.USAGE


def _retries(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.commands.retries import ErrorsRequestError, run_retries

    try:
        return run_retries(config, args)
    except ErrorsRequestError as error:
        print(inert(f"sfbridge retries {args.retries_command}: {error}"), file=sys.stderr)
        return ExitCode.USAGE


def _route(config: BridgeConfig, args: argparse.Namespace) -> int:
    from bridge.commands.route import run_route

    return run_route(config, args)


COMMANDS = {
    "install": _install,
    "run": _run,
    "check": _check,
    "status": _status,
    "spark": _spark,
    "send": _send,
    "pause": _pause_or_resume,
    "resume": _pause_or_resume,
    "errors": _errors,
    "retries": _retries,
    "route": _route,
}
