"""`sfbridge retries now`: make waiting messages due at once; a running daemon tries them
within a second."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from bridge.commands.audit import record_command
from bridge.commands.configuration import load
from bridge.commands.retries import FoundWaiting, read_retry_stores
from bridge.commands.selection import add_selection_arguments, finish, selection_from
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.exceptions import DatabaseError, ExitCode
from bridge.storage.retries import make_due


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_selection_arguments(parser, failed=False)


def run(args: argparse.Namespace) -> int:
    config = load(args)
    selection = selection_from(config, args, datetime.now(UTC))
    connections = Connections(config.databases)
    problems: list[DatabaseError] = []
    try:
        found = read_retry_stores(config, selection, connections, problems)
        _now(config, found, selection.given, connections, problems)
    finally:
        connections.close()
    return finish("retries now", problems, ExitCode.OK)


def _now(
    config: BridgeConfig,
    found: list[FoundWaiting],
    given: str,
    connections: Connections,
    problems: list[DatabaseError],
) -> None:
    total = changed = 0
    for each in found:
        if not each.messages:
            continue
        total += len(each.messages)
        try:
            count = make_due(
                connections.get(each.place.database), each.dialect, each.place, each.messages
            )
        except DatabaseError as error:
            connections.discard(each.place.database)
            problems.append(error)
            continue
        changed += count
        record_command(config, connections, each.place.database, "retries now", given, count)
    if total == 0:
        print("no messages in retry storage match; nothing to do")
        return
    busy = total - changed
    also = (
        f"; {busy} were being tried by a daemon at that moment" if busy > 0 and not problems else ""
    )
    print(
        f"made {changed} message(s) due now{also}. A running daemon tries them at its next look "
        "(within a second); messages for a paused database, or one waiting out an outage, "
        "stay until it is back."
    )
