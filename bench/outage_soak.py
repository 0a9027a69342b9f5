"""A long outage of the receiver's database, end to end, with the real daemon and real servers.

The receiver runs in a private PostgreSQL cluster that this script starts, kills with
`pg_ctl -m immediate` (a crash, not a clean stop) and starts again after `--minutes`; the sender
is a fresh database on the PostgreSQL server of SFBRIDGE_TEST_PG (default: 127.0.0.1:5432 as
postgres). The daemon runs with the default retry policy (every 10 s, 100 attempts: about 16.5
minutes of patience) and `retries.during_outage` as given. Messages are sent before, during
and after the outage. At the end every message must be in the receiver exactly once, and
nothing in the error queue, retry storage or the forwarding queue.

    .venv/bin/python bench/outage_soak.py --minutes 30 --during-outage wait

Prints a progress line a minute; exit status 0 when everything arrived exactly once, 1 if not.
With `--during-outage count` and an outage longer than the patience, the error queue fills
instead: that is what `wait` is for.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyodbc

DEFAULT_PREFIX = "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=5432;Uid=postgres;"
FORWARD, RECEIVER, ERROR, RETRY = "soak_forward", "soak_receiver", "soak_error", "sfbridge_retry"
QUEUE_DDL = (
    'CREATE TABLE "public"."{}" (Id uuid NOT NULL PRIMARY KEY, Expires timestamp, '
    "Headers text NOT NULL, Body bytea, Seq serial NOT NULL UNIQUE)"
)
CONFIG = """\
databases:
  sender: {{dialect: postgresql, connection: "{sender}"}}
  receiver: {{dialect: postgresql, connection: "{receiver}", connect_timeout: 3s}}
forwarders:
  - {{name: soak, database: sender, queue: {forward}, error_queue: {error}, peek_interval: 200ms}}
routes:
  - {{match: "*", database: receiver}}
retries:
  during_outage: {during_outage}
"""


class Cluster:
    """A private PostgreSQL cluster on a free port, owned by this run."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="sfbridge-soak-"))
        self.folder.chmod(0o755)
        self.bin = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))[-1].parent
        self.run_as: list[str] = []
        if os.geteuid() == 0:
            self.run_as = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.folder, "postgres", "postgres")
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        subprocess.run(
            [*self.run_as, str(self.bin / "initdb"), "-D", str(self.folder / "data"), "-U",
             "postgres", "-A", "trust", "--no-sync", "-E", "UTF8", "--locale=C.UTF-8"],
            check=True, capture_output=True,
        )  # fmt: skip
        self.start()

    def _ctl(self, *args: str) -> None:
        command = [*self.run_as, str(self.bin / "pg_ctl"), "-D", str(self.folder / "data")]
        subprocess.run([*command, *args], check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        options = f"-h 127.0.0.1 -p {self.port} -k {self.folder} -c fsync=off"
        self._ctl("-l", str(self.folder / "log"), "-w", "-o", options, "start")

    def crash(self) -> None:
        self._ctl("-m", "immediate", "-w", "stop")

    def remove(self) -> None:
        try:
            self._ctl("-m", "fast", "-w", "stop")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.folder, ignore_errors=True)

    def connection_string(self, database: str) -> str:
        return (
            f"Driver={{PostgreSQL Unicode}};Server=127.0.0.1;Port={self.port};Uid=postgres;"
            f"Database={database};"
        )


def send(connection_string: str, count: int) -> set[str]:
    ids: set[str] = set()
    with pyodbc.connect(connection_string) as connection:
        for _ in range(count):
            message_id = str(uuid.uuid4())
            headers = {
                "NServiceBus.MessageId": message_id,
                "NServiceBus.MessageIntent": "Send",
                "$.store-and-forward.destination": RECEIVER,
            }
            connection.execute(
                f'INSERT INTO "public"."{FORWARD}" (id, expires, headers, body) '
                "VALUES (?, NULL, ?, ?)",
                uuid.uuid4(),
                json.dumps(headers),
                b"x" * 1024,
            )
            ids.add(message_id)
        connection.commit()
    return ids


def count(connection_string: str, table: str) -> int:
    try:
        with pyodbc.connect(connection_string, timeout=3) as connection:
            return int(connection.execute(f'SELECT count(*) FROM "public"."{table}"').fetchone()[0])
    except pyodbc.Error:
        return -1


def received_ids(connection_string: str) -> Counter[str]:
    with pyodbc.connect(connection_string) as connection:
        rows = connection.execute(f'SELECT headers FROM "public"."{RECEIVER}"').fetchall()
    return Counter(json.loads(row[0])["NServiceBus.MessageId"] for row in rows)


def status(config: Path) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "bridge", "-c", str(config), "status", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    try:
        return json.loads(result.stdout)  # type: ignore[no-any-return]
    except json.JSONDecodeError:
        return {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="outage length")
    parser.add_argument("--during-outage", choices=("count", "wait"), default="wait")
    parser.add_argument("--per-minute", type=int, default=100, help="messages sent per minute")
    args = parser.parse_args()

    prefix = os.environ.get("SFBRIDGE_TEST_PG", DEFAULT_PREFIX)
    prefix = prefix if prefix.endswith(";") else prefix + ";"
    sender_name = f"sfsoak_{secrets.token_hex(4)}"
    admin = pyodbc.connect(prefix + "Database=postgres;", autocommit=True)
    admin.execute(f'CREATE DATABASE "{sender_name}"')
    cluster = Cluster()
    work = Path(tempfile.mkdtemp(prefix="sfbridge-soak-run-"))
    daemon: subprocess.Popen[bytes] | None = None
    try:
        sender = prefix + f"Database={sender_name};"
        receiver = cluster.connection_string("postgres")
        config = work / "sfbridge.yaml"
        config.write_text(
            CONFIG.format(
                sender=sender, receiver=receiver, forward=FORWARD, error=ERROR,
                during_outage=args.during_outage,
            )
        )  # fmt: skip
        bridge = [sys.executable, "-m", "bridge", "-c", str(config)]
        subprocess.run([*bridge, "install"], check=True, capture_output=True)
        with pyodbc.connect(receiver, autocommit=True) as connection:
            connection.execute(QUEUE_DDL.format(RECEIVER))
        log = (work / "daemon.log").open("w")
        daemon = subprocess.Popen([*bridge, "run"], stdout=log, stderr=subprocess.STDOUT)

        sent = send(sender, args.per_minute)
        deadline = time.monotonic() + 60
        while count(receiver, RECEIVER) < len(sent) and time.monotonic() < deadline:
            time.sleep(0.5)
        print(f"before the outage: {count(receiver, RECEIVER)}/{len(sent)} delivered", flush=True)

        cluster.crash()
        started = time.monotonic()
        print(f"receiver crashed; outage of {args.minutes:g} min begins", flush=True)
        minute = 0
        while time.monotonic() - started < args.minutes * 60:
            sent |= send(sender, args.per_minute)
            minute += 1
            time.sleep(max(0.0, started + minute * 60 - time.monotonic()))
            entry = next(
                (d for d in status(config).get("destinations", []) if d["database"] == "receiver"),
                {},
            )
            attempts = -1
            with pyodbc.connect(sender) as connection:
                attempts = connection.execute(f"SELECT max(attempts) FROM {RETRY}").fetchone()[0]
            print(
                f"minute {minute:3d}: sent {len(sent)}, waiting {entry.get('waiting')}, "
                f"receiver {entry.get('state')} since {entry.get('since')}, next probe "
                f"{entry.get('next_probe_at')}, error queue {count(sender, ERROR)}, most "
                f"attempts spent {attempts}",
                flush=True,
            )
        cluster.start()
        back = time.monotonic()
        print("receiver started again", flush=True)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            done = count(receiver, RECEIVER) >= len(sent) - count(sender, ERROR)
            if done and count(sender, RETRY) == 0 and count(sender, FORWARD) == 0:
                break
            time.sleep(1)
        drained = time.monotonic() - back
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(timeout=60)
        daemon = None

        received = received_ids(receiver)
        duplicates = sum(1 for n in received.values() if n > 1)
        missing = len(sent - set(received))
        in_error = count(sender, ERROR)
        print(
            f"after {args.minutes:g} min of outage ({args.during_outage}): sent {len(sent)}, "
            f"received {len(received)} distinct, missing {missing}, duplicated {duplicates}, "
            f"error queue {in_error}, retry storage {count(sender, RETRY)}, forwarding queue "
            f"{count(sender, FORWARD)}; backlog drained {drained:.1f} s after the restart; "
            f"daemon exit {code}"
        )
        print(f"daemon log: {work / 'daemon.log'}")
        ok = missing == 0 and duplicates == 0 and in_error == 0 and code == 0
        print("PASS: every message exactly once, nothing in the error queue" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        if daemon is not None:
            daemon.kill()
        cluster.remove()
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = ?", sender_name
        )
        admin.execute(f'DROP DATABASE IF EXISTS "{sender_name}"')
        admin.close()


if __name__ == "__main__":
    sys.exit(main())
