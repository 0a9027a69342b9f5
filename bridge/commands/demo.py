"""`sfbridge demo`: NServiceBus's store-and-forward sample, replayed whole on SQLite files.

No server and no config needed. The Sender endpoint in sender.db sends `OrderSubmitted`
through its forwarding queue; the Receiver endpoint in receiver.db replies `OrderAccepted` with
an ordinary send into a proxy queue named after the Sender, which the bridge carries back. The
real daemon runs in background threads. The receiver database is taken away while orders are
sent; they wait in retry storage, are retried on a timer, and arrive exactly once when it comes
back, and so do the replies.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import types
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from bridge.commands.demo_endpoints import DemoEndpoint
from bridge.commands.install import run_install
from bridge.config.model import (
    BridgeConfig,
    DatabaseConfig,
    FixedDestination,
    ForwarderConfig,
    RetryConfig,
    RouteConfig,
)
from bridge.connections import connect
from bridge.dialects import dialect_for
from bridge.exceptions import ExitCode
from bridge.headers import MESSAGE_ID_HEADER, serialize_headers
from bridge.secrets import open_private
from bridge.storage.tables import forwarder_tables

SENDER_QUEUE = "Samples.StoreAndForward.Sender"
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
  # The Sender's forwarding queue: each message names its destination in a header.
  - name: sender
    database: sender
    queue: {forwarding}
    peek_interval: 200ms
  # A proxy queue named after the Sender, in the receiver database: the Receiver's replies.
  - name: replies
    database: receiver
    queue: {sender_queue}
    destination: {{database: sender}}
    peek_interval: 200ms
routes:
  - {{match: "Samples.StoreAndForward.Receiver*", database: receiver}}
  - {{match: "*", database: sender}}
retries: {{delay: {delay}s, max_attempts: 100}}
"""


def demo_config(folder: Path) -> BridgeConfig:
    """Two SQLite databases; routes like the sample's connection callback, and a proxy."""
    databases = {
        "sender": DatabaseConfig("sender", "sqlite", path=str(folder / "sender.db")),
        "receiver": DatabaseConfig("receiver", "sqlite", path=str(folder / "receiver.db")),
    }
    return BridgeConfig(
        databases=types.MappingProxyType(databases),
        forwarders=(
            ForwarderConfig("sender", "sender", FORWARDING_QUEUE, peek_interval=0.2),
            ForwarderConfig(
                "replies",
                "receiver",
                SENDER_QUEUE,
                peek_interval=0.2,
                destination=FixedDestination("sender"),
            ),
        ),
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


class Sample:
    """The sample's two endpoints and what they did."""

    def __init__(self, config: BridgeConfig) -> None:
        self.sender = DemoEndpoint(SENDER_QUEUE, config.databases["sender"])
        self.receiver = DemoEndpoint(RECEIVER_QUEUE, config.databases["receiver"])
        self.receiver_running = True
        self.orders: list[str] = []

    def submit(self, count: int) -> list[str]:
        ids = self.sender.submit_orders(FORWARDING_QUEUE, RECEIVER_QUEUE, count)
        self.orders += ids
        return ids

    def run_endpoints(self) -> None:
        """One round of both endpoints' message pumps."""
        if self.receiver_running:
            self.receiver.handle_waiting(reply_type="Shared.OrderAccepted, Shared")
        self.sender.handle_waiting()

    def orders_received(self) -> Counter[str]:
        return Counter(str(h[MESSAGE_ID_HEADER]) for h in self.receiver.handled)

    def replies_received(self) -> Counter[str]:
        return Counter(str(h["NServiceBus.CorrelationId"]) for h in self.sender.handled)

    def all_answered(self) -> bool:
        self.run_endpoints()
        return set(self.replies_received()) >= set(self.orders)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", help="folder for the demo databases (default: a new temp folder)")
    parser.add_argument("--messages", type=int, default=5, help="messages to send (default 5)")


def run(args: argparse.Namespace) -> int:
    """The demo needs no configuration file: it writes its own."""
    return run_demo(folder=args.dir, message_count=args.messages)


def run_demo(folder: str | None = None, message_count: int = 5) -> int:
    """Run the demo; returns 0 when every order and every reply arrived exactly once."""
    logging.getLogger("bridge").setLevel(logging.CRITICAL)  # the account below tells the story
    base = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="sfbridge-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    for leftover in base.glob("*.db*"):
        leftover.unlink()
    config = demo_config(base)
    config_path = base / "sfbridge.yaml"
    with open_private(config_path) as handle:
        handle.write(
            CONFIG_TEMPLATE.format(
                config=config_path,
                sender=base / "sender.db",
                receiver=base / "receiver.db",
                forwarding=FORWARDING_QUEUE,
                sender_queue=SENDER_QUEUE,
                delay=int(RETRY_DELAY),
            )
        )
    account = Account()
    print(f"sfbridge demo: the store-and-forward sample between two SQLite databases in {base}")

    account.step("1. Install")
    sample = Sample(config)
    run_install(config)
    sample.sender.install()
    sample.receiver.install()
    account.say(
        f"sender.db: the Sender's queue {SENDER_QUEUE!r}; sfbridge's forwarding queue "
        f"{FORWARDING_QUEUE!r}, error queue, retry storage, dedup ledger"
    )
    account.say(
        f"receiver.db: the Receiver's queue {RECEIVER_QUEUE!r}; sfbridge's proxy queue "
        f"{SENDER_QUEUE!r} (named after the Sender, for the replies) and dedup ledger"
    )

    # Imported here: the daemon is a large import that no other verb of the CLI needs to parse.
    from bridge.daemon.runtime import Daemon

    daemon = Daemon(config)
    daemon.start()
    try:
        account.step("2. Receiver database up: orders go through, replies come back")
        sample.submit(2)
        account.say("Sender: sent 2 OrderSubmitted through its forwarding queue")
        _wait_for(sample.all_answered, "the first replies")
        account.say(
            f"Receiver: handled {sum(sample.orders_received().values())} order(s), replied "
            f"OrderAccepted to their ReplyToAddress {SENDER_QUEUE!r}: in receiver.db, the proxy"
        )
        account.say(f"Sender: {sum(sample.replies_received().values())} OrderAccepted arrived")

        account.step("3. Receiver stopped, its database taken away")
        sample.receiver_running = False
        receiver = Path(str(config.databases["receiver"].path))
        offline = receiver.with_name("receiver.db.offline")
        receiver.rename(offline)
        account.say(f"moved {receiver.name} to {offline.name}")
        more = sample.submit(message_count)
        account.say(f"Sender: sent {len(more)} more: sending still works, nothing is lost")
        _show_retries(config, account, looks=1)

        account.step("4. Receiver database restored, Receiver started")
        offline.rename(receiver)
        sample.receiver_running = True
        account.say(f"moved {offline.name} back to {receiver.name}")
        _wait_for(sample.all_answered, "every order to be answered")
        account.say(
            f"Receiver: {sum(sample.orders_received().values())} order(s) handled; Sender: "
            f"{sum(sample.replies_received().values())} OrderAccepted; retry storage is empty"
        )

        account.step("5. A crash between the two commits, replayed")
        replayed = _replay_copy_of_first_order(config, sample)
        _wait_for(lambda: _queued(config) == 0, "the replayed copy to be forwarded")
        time.sleep(0.5)
        sample.run_endpoints()
        account.say(
            f"put a second copy of order {replayed[:8]}... into the forwarding queue (what a "
            "crash after the receiver commit leaves behind); the dedup ledger recognised it"
        )
    except TimeoutError as error:
        account.say(f"FAILED: {error}")
        return ExitCode.FAILED
    finally:
        daemon.stop()
        daemon.heartbeat.stopped()

    account.step("Result")
    orders, replies = sample.orders_received(), sample.replies_received()
    once = all(orders[i] == 1 and replies[i] == 1 for i in sample.orders) and (
        len(orders) == len(replies) == len(sample.orders)
    )
    forward_headers = any(
        key.startswith("$.store-and-forward") for h in sample.sender.handled for key in h
    )
    totals = daemon.totals()
    account.say(
        f"{len(sample.orders)} orders sent, {sum(orders.values())} received, "
        f"{sum(replies.values())} replies: "
        f"{'every order and every reply exactly once' if once else 'MISMATCH'}; "
        f"retries scheduled {totals['retries-scheduled']}, "
        f"duplicates skipped {totals['duplicates-skipped']}; the replies were ordinary sends "
        f"and arrived {'WITH' if forward_headers else 'without'} store-and-forward headers"
    )
    print(f"\nLook around:  {_own_command()} -c {config_path} status")
    return 0 if once and not forward_headers and totals["duplicates-skipped"] >= 1 else 1


def _own_command() -> str:
    """How this process was started, so the hint works from a venv that is not on PATH."""
    invoked = Path(sys.argv[0])
    if invoked.name == "sfbridge" and invoked.is_file():
        return str(invoked) if invoked.parent != Path(".") else "sfbridge"
    return f"{sys.executable} -m bridge"


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


def _show_retries(config: BridgeConfig, account: Account, looks: int) -> None:
    """Print what waits in retry storage, until `looks` different next looks were seen. An
    outage spends no attempt (`retries.during_outage: wait`, the default): the messages
    wait where they are until a probe finds the database back."""
    forwarder = config.forwarders[0]
    dialect = dialect_for("sqlite")
    retry_table = forwarder_tables(config, forwarder).retry
    seen: set[str] = set()
    deadline = time.monotonic() + PHASE_TIMEOUT
    while time.monotonic() < deadline:
        connection = connect(config.databases[forwarder.database])
        try:
            rows = connection.query(
                f"SELECT count(*), max(attempts), min(next_attempt_at), max(last_error) FROM "
                f"{dialect.grammar.qualified_name(retry_table)}"
            )
        finally:
            connection.close()
        for count, attempts, due, error in rows:
            if not count or due[:19] in seen:
                continue
            seen.add(due[:19])
            due_at = datetime.fromisoformat(due).replace(tzinfo=UTC).astimezone()
            account.say(
                f"waiting: {count} message(s), {attempts} attempt(s) spent (an outage spends "
                f"none): {error.split(': ', 1)[-1]}; next look at {due_at:%H:%M:%S}"
            )
            if len(seen) >= looks:
                return
        time.sleep(0.2)
    raise TimeoutError("retries did not show up in time")


def _replay_copy_of_first_order(config: BridgeConfig, sample: Sample) -> str:
    """Insert a second copy of a delivered order, as an interrupted forward would leave it."""
    headers = dict(sample.receiver.handled[0])
    headers["$.store-and-forward.destination"] = RECEIVER_QUEUE
    forwarder = config.forwarders[0]
    dialect = dialect_for("sqlite")
    source = connect(config.databases[forwarder.database])
    try:
        source.begin()
        source.execute(
            dialect.sql("send", queue=forwarder_tables(config, forwarder).queue),
            (dialect.encode_id(uuid.uuid4()), None, serialize_headers(headers), b"{}"),
        )
        source.commit()
    finally:
        source.close()
    return str(headers[MESSAGE_ID_HEADER])


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PHASE_TIMEOUT
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")
