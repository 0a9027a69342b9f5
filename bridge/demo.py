"""`sfbridge demo`: NServiceBus's store-and-forward sample, replayed on SQLite files.

No server and no config needed. A sender database with its forwarding queue, a receiver
database with the Receiver endpoint's queue, the real daemon in background threads. The
receiver database is taken away while messages are sent; they wait in retry storage, are
retried on a timer, and arrive exactly once when it comes back.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
import types
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from bridge.config.model import (
    BridgeConfig,
    DatabaseConfig,
    ForwarderConfig,
    RetryConfig,
    RouteConfig,
)
from bridge.connections import connect
from bridge.daemon import Daemon
from bridge.dialects import dialect_for
from bridge.headers import MESSAGE_ID_HEADER, parse_headers
from bridge.install import run_install
from bridge.send import send_test_messages
from bridge.tables import forwarder_tables

RECEIVER_QUEUE = "Samples.StoreAndForward.Receiver"
FORWARDING_QUEUE = "Samples.StoreAndForward.Sender.Forward"
RETRY_DELAY = 2.0
PHASE_TIMEOUT = 30.0

CONFIG_TEMPLATE = """\
# Written by `sfbridge demo`. Try: sfbridge -c {config} status
databases:
  sender:   {{dialect: sqlite, path: "{sender}"}}
  receiver: {{dialect: sqlite, path: "{receiver}"}}
forwarders:
  - name: sender
    database: sender
    queue: {queue}
    peek_interval: 200ms
routes:
  - {{match: "Samples.StoreAndForward.Receiver*", database: receiver}}
  - {{match: "*", database: sender}}
retries: {{delay: {delay}s, max_attempts: 100}}
"""


def demo_config(folder: Path) -> BridgeConfig:
    """Two SQLite databases, one forwarder, routes like the sample's connection callback."""
    databases = {
        "sender": DatabaseConfig("sender", "sqlite", path=str(folder / "sender.db")),
        "receiver": DatabaseConfig("receiver", "sqlite", path=str(folder / "receiver.db")),
    }
    return BridgeConfig(
        databases=types.MappingProxyType(databases),
        forwarders=(ForwarderConfig("sender", "sender", FORWARDING_QUEUE, peek_interval=0.2),),
        routes=(
            RouteConfig("Samples.StoreAndForward.Receiver*", "receiver"),
            RouteConfig("*", "sender"),
        ),
        retries=RetryConfig(delay=RETRY_DELAY, max_attempts=100),
    )


class Account:
    """Prints the demo's story with elapsed times."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:5.1f}s] {text}", flush=True)

    def step(self, title: str) -> None:
        print(f"\n== {title}", flush=True)


def run_demo(folder: str | None = None, message_count: int = 5) -> int:
    """Run the demo; returns 0 when every message arrived exactly once, 1 otherwise."""
    logging.getLogger("bridge").setLevel(logging.CRITICAL)  # the account below tells the story
    base = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="sfbridge-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    for leftover in base.glob("*.db*"):
        leftover.unlink()
    config = demo_config(base)
    config_path = base / "sfbridge.yaml"
    config_path.write_text(
        CONFIG_TEMPLATE.format(
            config=config_path,
            sender=base / "sender.db",
            receiver=base / "receiver.db",
            queue=FORWARDING_QUEUE,
            delay=int(RETRY_DELAY),
        )
    )
    account = Account()
    print(f"sfbridge demo: store-and-forward between two SQLite databases in {base}")

    account.step("1. Install")
    run_install(config)
    _create_receiver_queue(config)
    account.say(f"sender.db: forwarding queue {FORWARDING_QUEUE!r}, error queue, retry storage")
    account.say(
        f"receiver.db: the Receiver endpoint's queue {RECEIVER_QUEUE!r} and the dedup ledger"
    )

    daemon = Daemon(config)
    daemon.start()
    sent: list[str] = []
    try:
        account.step("2. Receiver database up: messages flow straight through")
        sent += _send(config, 2)
        account.say(f"sent {len(sent)} OrderSubmitted message(s) to the local forwarding queue")
        _wait_for(lambda: len(_received_ids(config)) >= 2, "first messages to arrive")
        account.say(f"receiver has {len(_received_ids(config))} message(s)")

        account.step("3. Receiver database taken away")
        receiver = Path(str(config.databases["receiver"].path))
        offline = receiver.with_name("receiver.db.offline")
        receiver.rename(offline)
        account.say(f"moved {receiver.name} to {offline.name}")
        more = _send(config, message_count)
        sent += more
        account.say(f"sent {len(more)} more message(s): sending still works, nothing is lost")
        _show_retries(config, account, until_attempt=3)

        account.step("4. Receiver database restored")
        offline.rename(receiver)
        account.say(f"moved {offline.name} back to {receiver.name}")
        _wait_for(lambda: len(_received_ids(config)) >= len(sent), "retries to deliver")
        account.say(f"receiver has {len(_received_ids(config))} message(s); retry storage is empty")

        account.step("5. A crash between the two commits, replayed")
        replayed = _replay_copy_of_first_message(config)
        _wait_for(lambda: _queued(config) == 0, "the replayed copy to be forwarded")
        time.sleep(0.3)
        account.say(
            f"put a second copy of message {replayed[:8]}... into the forwarding queue (what a "
            "crash after the receiver commit leaves behind); the dedup ledger recognised it"
        )
    except TimeoutError as error:
        account.say(f"FAILED: {error}")
        return 1
    finally:
        daemon.stop()

    account.step("Result")
    received = Counter(_received_ids(config))
    exactly_once = all(received[message_id] == 1 for message_id in sent) and len(received) == len(
        sent
    )
    totals = daemon.totals()
    account.say(
        f"{len(sent)} sent, {sum(received.values())} received, "
        f"{'every message exactly once' if exactly_once else 'MISMATCH'}; "
        f"retries scheduled {totals['retries-scheduled']}, "
        f"duplicates skipped {totals['duplicates-skipped']}"
    )
    print(f"\nLook around:  {_own_command()} -c {config_path} status")
    print(
        f"              sqlite3 {base / 'receiver.db'} 'SELECT Headers FROM \"{RECEIVER_QUEUE}\"'"
    )
    return 0 if exactly_once and totals["duplicates-skipped"] >= 1 else 1


def _own_command() -> str:
    """How this process was started, so the hint works from a venv that is not on PATH."""
    invoked = Path(sys.argv[0])
    if invoked.name == "sfbridge" and invoked.is_file():
        return str(invoked) if invoked.parent != Path(".") else "sfbridge"
    return f"{sys.executable} -m bridge"


def _create_receiver_queue(config: BridgeConfig) -> None:
    # What the Receiver endpoint's installers would do on its first start.
    receiver = config.databases["receiver"]
    dialect = dialect_for(receiver.dialect)
    queue = dialect.grammar.resolve(dialect.grammar.parse(RECEIVER_QUEUE), None, None)
    connection = connect(receiver, create=True)
    try:
        connection.begin()
        for statement in dialect.sql("create_queue", queue=queue).split(";\n"):
            connection.execute(statement)
        connection.commit()
    finally:
        connection.close()


def _send(config: BridgeConfig, count: int) -> list[str]:
    return send_test_messages(
        config,
        config.forwarders[0],
        destination=RECEIVER_QUEUE,
        count=count,
        body=b'{"OrderId":"' + os.urandom(4).hex().encode() + b'","Value":42}',
        message_type="Shared.OrderSubmitted, Shared",
        extra_headers={},
        time_to_be_received=None,
    )


def _received_ids(config: BridgeConfig) -> list[str]:
    receiver = config.databases["receiver"]
    if not Path(str(receiver.path)).exists():
        return []
    dialect = dialect_for(receiver.dialect)
    queue = dialect.grammar.resolve(dialect.grammar.parse(RECEIVER_QUEUE), None, None)
    connection = connect(receiver)
    try:
        rows = connection.query(f"SELECT Headers FROM {dialect.grammar.qualified_name(queue)}")
    finally:
        connection.close()
    return [str(parse_headers(row[0]).get(MESSAGE_ID_HEADER)) for row in rows]


def _queued(config: BridgeConfig) -> int:
    forwarder = config.forwarders[0]
    dialect = dialect_for("sqlite")
    connection = connect(config.databases[forwarder.database])
    try:
        count = connection.query(
            dialect.sql("queue_count", queue=forwarder_tables(config, forwarder).queue)
        )[0][0]
        return int(count)
    finally:
        connection.close()


def _show_retries(config: BridgeConfig, account: Account, until_attempt: int) -> None:
    """Print each retry attempt as it happens, until `until_attempt` attempts were made."""
    forwarder = config.forwarders[0]
    dialect = dialect_for("sqlite")
    retry_table = forwarder_tables(config, forwarder).retry
    seen: set[tuple[int, str]] = set()
    deadline = time.monotonic() + PHASE_TIMEOUT
    while time.monotonic() < deadline:
        connection = connect(config.databases[forwarder.database])
        try:
            rows = connection.query(
                f"SELECT attempts, count(*), min(next_attempt_at), max(last_error) FROM "
                f"{dialect.grammar.qualified_name(retry_table)} GROUP BY attempts"
            )
        finally:
            connection.close()
        for attempts, count, due, error in rows:
            if (attempts, due[:19]) in seen:
                continue
            seen.add((attempts, due[:19]))
            due_at = datetime.fromisoformat(due).replace(tzinfo=UTC).astimezone()
            account.say(
                f"attempt {attempts} failed for {count} message(s): {error.split(': ', 1)[-1]}; "
                f"next attempt at {due_at:%H:%M:%S}"
            )
            if attempts >= until_attempt:
                return
        time.sleep(0.2)
    raise TimeoutError("retries did not show up in time")


def _replay_copy_of_first_message(config: BridgeConfig) -> str:
    """Insert a second copy of a delivered message, as an interrupted forward would leave it."""
    receiver = config.databases["receiver"]
    dialect = dialect_for("sqlite")
    queue = dialect.grammar.resolve(dialect.grammar.parse(RECEIVER_QUEUE), None, None)
    connection = connect(receiver)
    try:
        table = dialect.grammar.qualified_name(queue)
        headers_text = connection.query(f"SELECT Headers FROM {table} ORDER BY RowVersion LIMIT 1")[
            0
        ][0]
    finally:
        connection.close()
    headers = parse_headers(headers_text)
    message_id = str(headers[MESSAGE_ID_HEADER])
    forwarder = config.forwarders[0]
    source = connect(config.databases[forwarder.database])
    try:
        import json
        import uuid

        headers["$.store-and-forward.destination"] = RECEIVER_QUEUE
        source.begin()
        source.execute(
            dialect.sql("send", queue=forwarder_tables(config, forwarder).queue),
            (str(uuid.uuid4()), None, json.dumps(headers), b"{}"),
        )
        source.commit()
    finally:
        source.close()
    return message_id


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PHASE_TIMEOUT
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")
