"""A PostgreSQL pair: a forwarding database and a receiving one, with their config, the daemon
between them, sending into the forwarding queue and receiving from the receiver's queue.

Use the `pg_pair` / `pg_pair_factory` fixtures (tests/conftest.py) for fresh databases; the
functions here work on any connection strings (a private cluster's too).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support import (
    SAMPLES_RECEIVER,
    SENDER_FORWARD,
    DaemonProcess,
    nsb_message_headers,
    pg_connect,
    pg_count,
    pg_create_queue,
    pg_nsb_receive_all,
    pg_nsb_send,
    pg_rows,
    sfbridge,
    wait_until,
    write_config,
)

_UNSET: Any = object()


def pg_send(
    connection_string: str,
    queue: str,
    count: int,
    *,
    destination: str | None = SAMPLES_RECEIVER,
    body: bytes | None = b"x",
    **extra_headers: str | None,
) -> set[str]:
    """`count` NServiceBus messages for `destination` (None: no destination header) into
    `queue`, in one transaction, as the PostgreSQL transport sends; their message ids."""
    ids: set[str] = set()
    with pg_connect(connection_string) as connection:
        for _ in range(count):
            headers = nsb_message_headers(destination, **extra_headers)
            ids.add(str(headers["NServiceBus.MessageId"]))
            pg_nsb_send(connection, queue, headers, body)
        connection.commit()
    return ids


def message_ids(connection_string: str, queue: str) -> Counter[str]:
    """Receive every message of `queue` (as the transport does); their message ids, each with
    how often it was there."""
    return Counter(
        m["headers"]["NServiceBus.MessageId"] for m in pg_nsb_receive_all(connection_string, queue)
    )


def pg_pair_config(
    sender: str,
    receiver: str,
    *,
    forward: str = SENDER_FORWARD,
    name: str = "sender",
    forwarder: Mapping[str, Any] | None = None,
    receiver_database: Mapping[str, Any] | None = None,
    route: Mapping[str, Any] | None = None,
    retries: Mapping[str, Any] | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """The config of one forwarder `name` on `forward` in database `sender`, routing every
    message to database `receiver` (connection strings). The mappings are merged into the
    forwarder, the receiver's database entry, the route and `retries`; `sections` are further
    top-level keys."""
    return {
        "databases": {
            "sender": {"dialect": "postgresql", "connection": sender},
            "receiver": {
                "dialect": "postgresql",
                "connection": receiver,
                "connect_timeout": "2s",
                **(receiver_database or {}),
            },
        },
        "forwarders": [
            {
                "name": name,
                "database": "sender",
                "queue": forward,
                "peek_interval": "200ms",
                **(forwarder or {}),
            }
        ],
        "routes": [{"match": "*", "database": "receiver", **(route or {})}],
        "retries": {"delay": "1s", "max_attempts": 1000, **(retries or {})},
        **sections,
    }


@dataclass
class PgPair:
    """An installed pair: `config` (the file), `sender` and `receiver` (connection strings),
    the forwarding queue `forward` and the receiver's queue `queue` (qualified names)."""

    config: Path
    sender: str
    receiver: str
    forward: str = SENDER_FORWARD
    queue: str = SAMPLES_RECEIVER

    def send(
        self,
        count: int,
        *,
        destination: str | None = _UNSET,
        body: bytes | None = b"x",
        **extra_headers: str | None,
    ) -> set[str]:
        """`count` messages for the receiver's queue (or `destination`) into the forwarding
        queue; their message ids."""
        return pg_send(
            self.sender,
            self.forward,
            count,
            destination=self.queue if destination is _UNSET else destination,
            body=body,
            **extra_headers,
        )

    def received(self) -> Counter[str]:
        """Receive everything in the receiver's queue: message id -> how often."""
        return message_ids(self.receiver, self.queue)

    def delivered(self) -> int:
        """How many messages are in the receiver's queue (receives nothing)."""
        return pg_count(self.receiver, self.queue)

    def queued(self) -> int:
        """How many messages are in the forwarding queue."""
        return pg_count(self.sender, self.forward)

    def cli(self, *args: str, timeout: float = 60) -> Any:
        """`sfbridge -c CONFIG ARGS...` in a subprocess."""
        return sfbridge("-c", str(self.config), *args, timeout=timeout)

    def status(self) -> dict[str, Any]:
        """`sfbridge status --json`, parsed (exit 1 only says no daemon is running)."""
        result = self.cli("status", "--json")
        assert result.returncode in (0, 1), result.stdout + result.stderr
        return json.loads(result.stdout)  # type: ignore[no-any-return]

    def daemon(self, log: Path, env: Mapping[str, str] | None = None) -> DaemonProcess:
        """`sfbridge run` on this pair's config, in a subprocess logging to `log`."""
        return DaemonProcess(self.config, log, env)


def make_pg_pair(
    tmp_path: Path,
    sender: str,
    receiver: str,
    *,
    queue: str = SAMPLES_RECEIVER,
    create_queue: bool = True,
    installed: bool = False,
    **options: Any,
) -> PgPair:
    """Write the pair's config (`pg_pair_config(sender, receiver, **options)`) to
    tmp_path/sfbridge.yaml, run `sfbridge install` and create the receiver's `queue`
    (`installed`: the databases are copies of a pair that was, so only write the config)."""
    config = pg_pair_config(sender, receiver, **options)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = write_config(tmp_path / "sfbridge.yaml", config)
    if not installed:
        result = sfbridge("-c", str(path), "install")
        assert result.returncode == 0, result.stdout + result.stderr
        if create_queue:
            pg_create_queue(receiver, queue)
    forward = config["forwarders"][0]["queue"]
    return PgPair(config=path, sender=sender, receiver=receiver, forward=forward, queue=queue)


def hold_for(seconds: float, check: Callable[[], None], interval: float = 0.5) -> None:
    """Let `seconds` pass while something goes on (traffic, a fault), calling `check` every
    `interval` and once at the end: it asserts what must hold all along."""
    deadline = time.monotonic() + seconds
    while True:
        check()
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(interval, left))


def pg_table_reads(connection_string: str, table: str) -> int:
    """How many times PostgreSQL has scanned `table` (an unqualified name in schema public),
    sequential and index scans together, as its statistics say (they reach the view within
    about a second of the reading transaction's end)."""
    with pg_connect(connection_string) as connection:
        row = connection.execute(
            "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables "
            "WHERE schemaname = 'public' AND relname = ?",
            table,
        ).fetchone()
        connection.commit()
    return int(row[0]) if row else 0


def wait_for_reads(connection_string: str, table: str, further: int, timeout: float = 30) -> None:
    """Wait until `table` has been read `further` more times than now: the event that shows a
    daemon went round its loop again (and so had its chance to do what must not happen)."""
    start = pg_table_reads(connection_string, table)
    wait_until(
        lambda: pg_table_reads(connection_string, table) >= start + further,
        timeout,
        f"{further} further reads of {table}",
    )


def pg_rollbacks(connection_string: str) -> int:
    """How many transactions of the database have been rolled back, as PostgreSQL's
    statistics say (a probe of the bridge tries and rolls back)."""
    rows = pg_rows(
        connection_string,
        "SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()",
    )
    return int(rows[0][0])


def wait_for_rollbacks(connection_string: str, further: int, timeout: float = 30) -> None:
    """Wait until the database has seen `further` more rollbacks than now."""
    start = pg_rollbacks(connection_string)
    wait_until(
        lambda: pg_rollbacks(connection_string) >= start + further,
        timeout,
        f"{further} further rollbacks",
    )
