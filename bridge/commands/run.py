"""`sfbridge run`: the daemon in the foreground, until SIGTERM or SIGINT (SIGHUP reloads)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading

from bridge.commands.configuration import load, load_path
from bridge.config import BridgeConfig
from bridge.config.environment import ENVIRONMENT_FILE
from bridge.daemon.observability import flush_sentry, setup_sentry
from bridge.exceptions import UnsetVariables


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`run` takes no options of its own."""


def run(args: argparse.Namespace) -> int:
    """Run the daemon; its exit code. Raises UnsetVariables before it starts when the
    configuration names a variable that is not set, MetricsStartError when it cannot serve its
    metrics."""
    # Imported here, not above: every `sfbridge` command builds the parser from this module,
    # and the daemon is the largest import of all (0.4 s a command).
    from bridge.daemon.runtime import Daemon
    from bridge.forwarding.spine import tune_garbage_collection

    config = load(args)
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
    config = load_path(path)
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
    flush_sentry()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
