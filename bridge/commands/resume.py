"""`sfbridge resume`: undo `sfbridge pause`."""

from __future__ import annotations

import argparse

from bridge.commands.configuration import load
from bridge.commands.pause import add_target_arguments, change_pause
from bridge.exceptions import ExitCode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)


def run(args: argparse.Namespace) -> int:
    config = load(args)
    print(change_pause(config, args.forwarder, args.destination, pause=False))
    return ExitCode.OK
