"""The `sfbridge` command line: one table of verbs, the top-level parser, and `main`.

Every verb is a module of `bridge.commands` with `add_arguments(parser)` and
`run(args) -> int`; a verb of two words (`errors list`) is a module of the first word's
package. Errors a person can act on are `SfbridgeError`s, reported here once for every verb.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from bridge import __version__
from bridge.commands.verb_help import HelpfulParser, examples_epilog
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
    """One command: its words as typed, its module, its line in `sfbridge --help`, and its own
    `--help`: what it does (`description`), `examples` of it (commands, each with a `#`
    comment where it helps), and whether it reads the configuration (`-c`)."""

    name: str
    module_name: str
    help: str
    description: str
    examples: tuple[str, ...]
    needs_config: bool = True

    @property
    def module(self) -> VerbModule:
        # Imported when the verb is used, not for every command: a command pays only for its
        # own verb's imports (`sfbridge where` took 0.29 s of imports for all verbs, 0.19 s
        # for its own).
        module: VerbModule = importlib.import_module(self.module_name)
        return module


# The verbs that take a second word, with their help line.
GROUPS = {
    "daemons": "forget the entries of daemons that no longer run",
    "errors": "list, summarize, show, replay, archive or purge the messages in the error queues",
    "retries": "list the messages waiting in retry storage, make them due now, or fail them to "
    "the error queue",
    "spark": "bulk work on Apache Spark: drain, reconcile, report (needs PySpark)",
}

_FILTERS = (
    "Filters, all of which must hold: --forwarder NAME, --destination GLOB (an address, its "
    "table, or a destination database's name), --id ID (a row Id or an NServiceBus.MessageId)"
)

VERBS = (
    Verb(
        "install",
        "bridge.commands.install",
        "create forwarding queues, error queues, retry storage and dedup ledgers",
        "Create every table the bridge owns, in every configured database: forwarding and "
        "error queues, retry storage, counters, pauses, the audit log, dedup ledgers and, on "
        "PostgreSQL, the push triggers. Idempotent. The daemon also creates a missing one "
        "while it works, unless install.at_runtime is false. It refuses, creating nothing, "
        "when an unquoted dotted queue name would make a table in the wrong schema.",
        (
            "sfbridge -c /etc/sfbridge/sfbridge.yaml install",
            "sfbridge install --print-sql > bridge.sql    # the DDL, for a DBA to run",
            "sfbridge install --print-grants --login sfbridge",
        ),
    ),
    Verb(
        "run",
        "bridge.commands.run",
        "run the daemon in the foreground (SIGTERM/SIGINT to stop)",
        "Run the daemon in the foreground (systemd runs it as a Type=notify service). "
        "SIGHUP reloads the configuration, keeping the running one if the new one is "
        "invalid. SIGTERM or SIGINT stops it: in-flight batches finish (for at most 10 s) "
        "and it exits 0.",
        (
            "sfbridge -c /etc/sfbridge/sfbridge.yaml run",
            "systemctl reload sfbridge    # SIGHUP: reload the configuration",
            "systemctl stop sfbridge      # SIGTERM: finish in-flight batches, exit 0",
        ),
    ),
    Verb(
        "check",
        "bridge.commands.check",
        "check config, connectivity, table shapes and indexes",
        "Validate the configuration, connect to every database, check the tables' shapes and "
        "indexes, the login's rights and what a missing table needs. Exit 1 when it finds "
        "problems.",
        ("sfbridge -c /etc/sfbridge/sfbridge.yaml check",),
    ),
    Verb(
        "status",
        "bridge.commands.status",
        "queued, waiting for retry, in error, per forwarder",
        "The daemons, then per forwarder what is queued, waiting for retry and in error, "
        "pauses and counters; per destination database whether it is up. Exit 1 when no "
        "daemon is running, 3 when a forwarding database cannot be read.",
        ("sfbridge status", "sfbridge status --json", "sfbridge status --audit"),
    ),
    Verb(
        "send",
        "bridge.commands.send",
        "put test messages into a forwarding queue",
        "Put NServiceBus-shaped test messages into a forwarding queue, for the daemon to "
        "forward. In PostgreSQL an unquoted dot separates schema and table: quote a dotted "
        "table name.",
        (
            """sfbridge send '"public"."Samples.Receiver"' --count 10""",
            "sfbridge send --forwarder proxy    # no routing header, as an endpoint sends",
        ),
    ),
    Verb(
        "pause",
        "bridge.commands.pause",
        "stop a forwarder claiming, or hold its messages for one destination database",
        "Planned maintenance: a paused forwarder claims nothing; a paused destination "
        "database gets nothing, and its messages wait in retry storage without spending "
        "attempts. Kept in the forwarding database, so every daemon obeys it, across "
        "restarts, until 'sfbridge resume'.",
        (
            "sfbridge pause orders --destination receiver --reason 'receiver upgrade'",
            "sfbridge pause orders",
        ),
    ),
    Verb(
        "resume",
        "bridge.commands.resume",
        "undo 'pause'",
        "Undo 'sfbridge pause': the forwarder claims again, or the destination database's "
        "waiting messages go out, oldest first.",
        ("sfbridge resume orders --destination receiver", "sfbridge resume orders"),
    ),
    Verb(
        "where",
        "bridge.commands.where",
        "where one message is now (queued, retry storage, delivered, error queue, archived) "
        "and what happened to it",
        "Say where one message is now and what happened to it: still queued in a forwarding "
        "queue, waiting in retry storage (attempts, next attempt, last error), delivered (the "
        "dedup ledger: which database and queue, when), failed in an error queue (reason, "
        "time) or archived. A published event shows each subscriber's copy. Indexed lookups "
        "answer at once; forwarding queues are searched by row Id, and by MessageId only with "
        "--scan (which reads the whole queue).",
        (
            "sfbridge where 5b2f0c3e-8d6a-4f7e-9a4b-0c1d2e3f4a5b",
            "sfbridge where 5b2f0c3e-8d6a-4f7e-9a4b-0c1d2e3f4a5b --scan --json",
        ),
    ),
    Verb(
        "errors list",
        "bridge.commands.errors.listing",
        "one line per failed message",
        "One line per message in the forwarders' error queues: its Id, NServiceBus.MessageId, "
        f"when and why it failed. {_FILTERS}, --reason, --since.",
        (
            "sfbridge errors list --forwarder orders --since 2h",
            "sfbridge errors list --reason unroutable --json",
        ),
    ),
    Verb(
        "errors summary",
        "bridge.commands.errors.summary",
        "failed messages in groups (by reason, destination, exception or message type), "
        "with counts and first and last failure",
        "Count the failed messages of every error queue in groups, largest first, with the "
        "first and the last failure of each. A group's name (BY:VALUE) selects it in 'errors "
        "list', 'replay', 'archive' and 'purge' with --group.",
        (
            "sfbridge errors summary --by exception",
            "sfbridge errors summary --by reason --since 1d --json",
        ),
    ),
    Verb(
        "errors show",
        "bridge.commands.errors.show",
        "one message's headers and a preview of its body",
        "One failed message: its headers and a preview of its body.",
        ("sfbridge errors show 4c1a0a3e-2f0d-4a47-9a43-6b0f1b2f7c11",),
    ),
    Verb(
        "errors replay",
        "bridge.commands.errors.replay",
        "move failed messages back into their forwarding queue (NServiceBus.FailedQ), "
        "without the failure headers, so they are routed again",
        "Move failed messages back into the forwarding queue they failed in "
        "(NServiceBus.FailedQ), without the failure headers, so the daemon routes them again: "
        f"each exactly once, in batches of one transaction. {_FILTERS}, --reason, --since.",
        (
            "sfbridge errors replay --reason unroutable --dry-run    # what would move",
            "sfbridge errors replay --reason unroutable",
            "sfbridge errors replay --id 5b2f0c3e-8d6a-4f7e-9a4b-0c1d2e3f4a5b --to Samples.Billing",
        ),
    ),
    Verb(
        "errors archive",
        "bridge.commands.errors.archive",
        "move failed messages into the error archive, restorable for error_archive.retention "
        "(asks first)",
        "Move failed messages out of the error queue into the error archive "
        "(sfbridge_error_archive in the same database), as they are: out of the way of "
        "ServicePulse and 'errors list', found by 'sfbridge where', restorable with 'errors "
        "restore' until older than error_archive.retention (default 30 days), when the daemon "
        "deletes them. Asks first, as 'purge' does.",
        (
            "sfbridge errors archive --group exception:System.TimeoutException --dry-run",
            "sfbridge errors archive --group exception:System.TimeoutException --yes",
        ),
    ),
    Verb(
        "errors restore",
        "bridge.commands.errors.restore",
        "put archived failed messages back into their error queue",
        "Put archived failed messages ('errors archive') back into the error queue each was "
        "archived from, as it was. Selects as 'errors list' does (--id, --group, --reason, "
        "...); without a selection, every archived message.",
        (
            "sfbridge errors restore --id 5b2f0c3e-8d6a-4f7e-9a4b-0c1d2e3f4a5b",
            "sfbridge errors restore --group reason:unroutable --dry-run",
        ),
    ),
    Verb(
        "errors purge",
        "bridge.commands.errors.purge",
        "delete failed messages (asks first)",
        f"Delete failed messages for good; asks first. {_FILTERS}, --reason, --since.",
        ("sfbridge errors purge --forwarder orders --reason unroutable --since 2h",),
    ),
    Verb(
        "retries list",
        "bridge.commands.retries.listing",
        "one line per message waiting in retry storage",
        "One line per message waiting in retry storage: destination, attempts, next attempt "
        f"and last error. {_FILTERS}.",
        ("sfbridge retries list --destination receiver", "sfbridge retries list --json"),
    ),
    Verb(
        "retries now",
        "bridge.commands.retries.now",
        "make messages due at once: a running daemon tries them within a second",
        "Make waiting messages due at once, after fixing what they failed on: a running daemon "
        f"tries them within about a second. {_FILTERS}.",
        ("sfbridge retries now --destination receiver",),
    ),
    Verb(
        "retries fail",
        "bridge.commands.retries.fail",
        "give up on messages: move them to their forwarder's error queue "
        "(reason failed-by-operator)",
        "Give up on waiting messages: move them to their forwarder's error queue with the "
        f"failure headers and the reason failed-by-operator. {_FILTERS}.",
        ("""sfbridge retries fail --destination '"public"."Samples.Receiver"'""",),
    ),
    Verb(
        "daemons forget",
        "bridge.commands.daemons.forget",
        "remove daemons that stopped or went missing from what 'status' shows (audited)",
        "Remove the entries of daemons that no longer run from the daemons table, so that "
        "'status' stops showing them; never a running daemon's. Each change is in "
        "the audit log.",
        (
            "sfbridge daemons forget --id db-host-1:4242    # as 'status' names it",
            "sfbridge daemons forget --stale    # not heard from for over 24 h",
        ),
    ),
    Verb(
        "route",
        "bridge.commands.route",
        "where a message with this destination (or event type) would go, or why it would "
        "go to the error queue; reads no database but subscription tables",
        "Where a message with this destination header (or each copy of this published event) "
        "would go, decided as the daemon decides it, or why it would go to the error queue. "
        "Reads no database but subscription tables. Exit 1 when it would go to the error "
        "queue.",
        (
            """sfbridge route '"public"."Samples.Receiver"'""",
            "sfbridge route --event-type 'Shared.OrderAccepted, Shared'",
        ),
    ),
    Verb(
        "spark drain",
        "bridge.commands.spark.drain",
        "drain forwarding queues on Spark, then reconcile",
        "Drain forwarding queues on Apache Spark (a backlog too large for the daemon), then "
        "reconcile: every message in exactly one place.",
        (
            "sfbridge spark drain --dry-run",
            "sfbridge spark drain --master 'local[4]' --report drain.json",
        ),
    ),
    Verb(
        "spark reconcile",
        "bridge.commands.spark.reconcile",
        "check from the databases that every message is in exactly one place",
        "Check from the databases, on Apache Spark, that every message claimed is in exactly "
        "one place: delivered, in retry storage or in an error queue.",
        ("sfbridge spark reconcile --report reconcile.json",),
    ),
    Verb(
        "spark report",
        "bridge.commands.spark.report",
        "error queues and retry storage: JSON and HTML",
        "The error queues and retry storage summed up on Apache Spark, as JSON and HTML.",
        ("sfbridge spark report --report /tmp/bridge-report    # .json and .html",),
    ),
    Verb(
        "demo",
        "bridge.commands.demo",
        "replay the store-and-forward sample on SQLite files",
        "Replay the store-and-forward sample, replies through a proxy included, on SQLite "
        "files it writes with its own configuration: no server and no config needed.",
        ("sfbridge demo", "sfbridge demo --dir /tmp/sfbridge-demo --messages 20"),
        needs_config=False,
    ),
)


def build_parser(only: str | None = None) -> HelpfulParser:
    """The whole command line; with `only` (a verb's name) every verb is there for help and
    suggestions, but only that one's options are added (and its module imported)."""
    parser = HelpfulParser(
        prog="sfbridge",
        description="Store-and-forward bridge for NServiceBus SQL Server / PostgreSQL queues.",
        epilog="'sfbridge COMMAND --help' says what a command does, with examples.",
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
    groups: dict[str, argparse._SubParsersAction[HelpfulParser]] = {}
    for verb in VERBS:
        *group, word = verb.name.split()
        where = commands
        if group:
            if group[0] not in groups:
                group_parser = commands.add_parser(
                    group[0], help=GROUPS[group[0]], description=GROUPS[group[0]].capitalize()
                )
                _add_config_option(group_parser)
                groups[group[0]] = group_parser.add_subparsers(
                    dest=f"{group[0]}_command", required=True, metavar="VERB"
                )
            where = groups[group[0]]
        command = where.add_parser(
            word,
            help=verb.help,
            description=verb.description,
            epilog=examples_epilog(verb.examples),
        )
        if verb.needs_config:
            # `sfbridge status -c FILE` works like `sfbridge -c FILE status`.
            _add_config_option(command)
        if only is None or verb.name == only:
            verb.module.add_arguments(command)
            command.set_defaults(run=verb.module.run)
        command.set_defaults(verb=verb.name)
        parser.verb_parsers[verb.name] = command
    return parser


def _add_config_option(parser: argparse.ArgumentParser) -> None:
    """`-c` after the command: with no default of its own, so it only overrides the
    top-level value when it is given there."""
    parser.add_argument("-c", "--config", default=argparse.SUPPRESS, help="configuration file")


def named_verb(argv: Sequence[str]) -> str | None:
    """The verb `argv` names by its first words after the top-level options, if any."""
    words: list[str] = []
    skip_next = False
    for argument in argv:
        if skip_next:
            skip_next = False
        elif argument in ("-c", "--config"):
            skip_next = True
        elif not argument.startswith("-"):
            words.append(argument)
            if len(words) == 2:
                break
        elif words:
            break
    for verb in VERBS:
        if verb.name.split() == words[: len(verb.name.split())]:
            return verb.name
    return None


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """`argv` parsed, importing only the verb it names; the whole table where no verb is read
    ahead (`--help`, a mistyped verb, short options run together as in `-vc FILE`)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    return build_parser(only=named_verb(arguments)).parse_args(arguments)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
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
