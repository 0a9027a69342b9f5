"""The `sfbridge` command line: one table of verbs, the top-level parser, and `main`.

Every verb is a module of `bridge.commands` with `add_arguments(parser)` and
`run(args) -> int`; a verb of two words (`errors list`) is a module of the first word's
package. Errors a person can act on are `SfbridgeError`s, reported here once for every verb.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from bridge import __version__
from bridge.commands import (
    check,
    demo,
    install,
    pause,
    resume,
    route,
    send,
    status,
    where,
)
from bridge.commands import run as daemon
from bridge.commands.daemons import forget as daemons_forget
from bridge.commands.errors import archive as errors_archive
from bridge.commands.errors import listing as errors_list
from bridge.commands.errors import purge as errors_purge
from bridge.commands.errors import replay as errors_replay
from bridge.commands.errors import restore as errors_restore
from bridge.commands.errors import show as errors_show
from bridge.commands.errors import summary as errors_summary
from bridge.commands.retries import fail as retries_fail
from bridge.commands.retries import listing as retries_list
from bridge.commands.retries import now as retries_now
from bridge.commands.spark import drain as spark_drain
from bridge.commands.spark import reconcile as spark_reconcile
from bridge.commands.spark import report as spark_report
from bridge.config.load import DEFAULT_CONFIG
from bridge.daemon.observability import setup_logging
from bridge.exceptions import ExitCode, SfbridgeError
from bridge.secrets import for_terminal

log = logging.getLogger("sfbridge")


class VerbModule(Protocol):
    """What a verb's module has."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


@dataclass(frozen=True)
class Verb:
    """One command: its words as typed, its module, and its line in `sfbridge --help`."""

    name: str
    module: VerbModule
    help: str


# The verbs that take a second word, with their help line.
GROUPS = {
    "daemons": "forget the entries of daemons that no longer run",
    "errors": "list, summarize, show, replay, archive or purge the messages in the error queues",
    "retries": "list the messages waiting in retry storage, make them due now, or fail them to "
    "the error queue",
    "spark": "bulk work on Apache Spark: drain, reconcile, report (needs PySpark)",
}

VERBS = (
    Verb(
        "install",
        install,
        "create forwarding queues, error queues, retry storage and dedup ledgers",
    ),
    Verb("run", daemon, "run the daemon in the foreground (SIGTERM/SIGINT to stop)"),
    Verb("check", check, "check config, connectivity, table shapes and indexes"),
    Verb("status", status, "queued, waiting for retry, in error, per forwarder"),
    Verb("send", send, "put test messages into a forwarding queue"),
    Verb(
        "pause",
        pause,
        "stop a forwarder claiming, or hold its messages for one destination database",
    ),
    Verb("resume", resume, "undo 'pause'"),
    Verb(
        "where",
        where,
        "where one message is now (queued, retry storage, delivered, error queue, archived) "
        "and what happened to it",
    ),
    Verb("errors list", errors_list, "one line per failed message"),
    Verb(
        "errors summary",
        errors_summary,
        "failed messages in groups (by reason, destination, exception or message type), "
        "with counts and first and last failure",
    ),
    Verb("errors show", errors_show, "one message's headers and a preview of its body"),
    Verb(
        "errors replay",
        errors_replay,
        "move failed messages back into their forwarding queue (NServiceBus.FailedQ), "
        "without the failure headers, so they are routed again",
    ),
    Verb(
        "errors archive",
        errors_archive,
        "move failed messages into the error archive, restorable for error_archive.retention "
        "(asks first)",
    ),
    Verb(
        "errors restore", errors_restore, "put archived failed messages back into their error queue"
    ),
    Verb("errors purge", errors_purge, "delete failed messages (asks first)"),
    Verb("retries list", retries_list, "one line per message waiting in retry storage"),
    Verb(
        "retries now",
        retries_now,
        "make messages due at once: a running daemon tries them within a second",
    ),
    Verb(
        "retries fail",
        retries_fail,
        "give up on messages: move them to their forwarder's error queue "
        "(reason failed-by-operator)",
    ),
    Verb(
        "daemons forget",
        daemons_forget,
        "remove daemons that stopped or went missing from what 'status' shows (audited)",
    ),
    Verb(
        "route",
        route,
        "where a message with this destination (or event type) would go, or why it would "
        "go to the error queue; reads no database but subscription tables",
    ),
    Verb("spark drain", spark_drain, "drain forwarding queues on Spark, then reconcile"),
    Verb(
        "spark reconcile",
        spark_reconcile,
        "check from the databases that every message is in exactly one place",
    ),
    Verb("spark report", spark_report, "error queues and retry storage: JSON and HTML"),
    Verb("demo", demo, "replay the store-and-forward sample on SQLite files"),
)


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
    groups: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    for verb in VERBS:
        *group, word = verb.name.split()
        where = commands
        if group:
            if group[0] not in groups:
                group_parser = commands.add_parser(group[0], help=GROUPS[group[0]])
                groups[group[0]] = group_parser.add_subparsers(
                    dest=f"{group[0]}_command", required=True, metavar="VERB"
                )
            where = groups[group[0]]
        command = where.add_parser(word, help=verb.help)
        verb.module.add_arguments(command)
        command.set_defaults(run=verb.module.run, verb=verb.name)
    _accept_config_after_the_command(parser)
    return parser


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
    setup_logging("INFO", verbose=args.verbose)
    try:
        code: int = args.run(args)
        return code
    except SfbridgeError as error:
        if args.verbose:
            log.exception("%s failed", args.verb)
        # Masked and inert: the text may quote a connection string or message data.
        for line in error.report(args.verb):
            print(for_terminal(line), file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`sfbridge errors list | head`): not a failure of ours. Point
        # stdout at /dev/null so that flushing it at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.OK
