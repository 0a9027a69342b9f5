"""Healing the bridge's own tables when the data path finds one missing.

A forwarder's tables in its forwarding database (retry storage, counters, pauses, event types,
...) are created where they are missing (unless `install.at_runtime` is false) and the work
tried once more (`TableHealer`); a destination database's dedup ledger likewise
(`heal_ledger`). What cannot be healed becomes advice for a person, carried by the error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from bridge.addressing import TableAddress
from bridge.config.model import BridgeConfig, ForwarderConfig
from bridge.connections import Connections
from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.exceptions import (
    BridgeTableMissing,
    DatabaseError,
    DatabaseUnavailable,
    PermissionDenied,
    TableNotFound,
)
from bridge.storage.dotted_names import dotted_names
from bridge.storage.grants import lacking_right
from bridge.storage.ledger import (
    RUNTIME_DDL_OFF_ADVICE,
    cannot_create_advice,
    ensure_ledger,
    ledger_grant_advice,
)
from bridge.storage.tables import (
    create_tables,
    forwarder_table_steps,
    log_created,
    upgrade_retry_table,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

# A table that could not be created is logged at most this often (seconds) per worker.
UNHEALED_LOG_INTERVAL = 600.0


class TableHealer:
    """Creates one forwarder's missing tables in its forwarding database."""

    def __init__(
        self,
        config: BridgeConfig,
        forwarder: ForwarderConfig,
        connections: Connections,
        dialect: Dialect,
    ) -> None:
        self._config = config
        self._forwarder = forwarder
        self._connections = connections
        self._dialect = dialect
        self._retry_table_checked = False
        self._next_unhealed_log = 0.0

    def healing(self, attempt: Callable[[], T]) -> T:
        """`attempt()`; when it finds one of the forwarder's tables missing, create what is
        missing and try once more. Raises BridgeTableMissing (with advice) when not allowed."""
        try:
            return attempt()
        except BridgeTableMissing as missing:
            if not missing.healable:
                raise
            created = self.heal(missing)
        try:
            return attempt()
        except BridgeTableMissing as again:
            if created or not again.healable:
                raise
            # Nothing was missing when looked for (another worker had just created it), yet
            # the table is still not found: a name that differs only in case, say.
            raise again.with_advice(
                "the bridge found nothing to create: check the table's name and case with "
                "'sfbridge check'"
            ) from None

    def heal(self, missing: BridgeTableMissing) -> bool:
        """Create the forwarder's missing tables; False when none was missing any more
        (another worker created them). Raises BridgeTableMissing saying why they are not
        created (runtime creation off, no permission)."""
        database = self._forwarder.database
        if not self._config.install.at_runtime:
            raise missing.with_advice(RUNTIME_DDL_OFF_ADVICE) from None
        connection = self._connections.get(database)
        # Not the table an unquoted dot reads as, with its schema, while the endpoints' table
        # of the whole name is there: the forwarder fails alone, saying how to quote it.
        for trap in dotted_names(self._config, database, connection):
            if trap.forwarder == self._forwarder.name:
                raise missing.with_advice(f"not creating it: {trap}") from None
        steps = forwarder_table_steps(self._config, self._forwarder)
        try:
            created = create_tables(connection, self._dialect, steps, only_missing=True)
        except PermissionDenied as error:
            lacking = lacking_right(
                connection, self._dialect, [s.table.schema for s in steps if s.table]
            )
            raise missing.with_advice(cannot_create_advice(error.detail, lacking)) from None
        log_created(self._forwarder.name, database, created)
        self._retry_table_checked = False
        return bool(created)

    def heal_after_batch(self, missing: list[BridgeTableMissing]) -> None:
        """Heal what a finished batch found missing; a failure is logged now and then, since
        only what `status` shows is missing and the batch itself is done."""
        if not missing:
            return
        try:
            self.heal(missing[0])
        except DatabaseError as error:
            now = time.monotonic()
            if now >= self._next_unhealed_log:
                log.warning("forwarder '%s': %s", self._forwarder.name, error)
                self._next_unhealed_log = now + UNHEALED_LOG_INTERVAL

    def upgrade_retry_table(self, connection: Connection, retry_table: TableAddress) -> None:
        """Retry storage made by an earlier sfbridge lacks `destination_database`: add it,
        once per worker (and again after a heal)."""
        if self._retry_table_checked:
            return
        try:
            if upgrade_retry_table(
                connection,
                self._dialect,
                retry_table,
                allowed=self._config.install.at_runtime,
            ):
                log.warning(
                    "forwarder '%s': added column destination_database to retry storage",
                    self._forwarder.name,
                )
        except TableNotFound:
            connection.rollback()  # no retry storage yet: the claim heals it
        self._retry_table_checked = True


def heal_ledger(
    connections: Connections,
    config: BridgeConfig,
    database: str,
    missing: BridgeTableMissing,
    *,
    allowed: bool,
) -> str | None:
    """Create the missing dedup ledger of `database`; None when done, else why it cannot be
    (for people). Raises DatabaseUnavailable when the database goes away meanwhile."""
    if not allowed:
        return missing.with_advice(RUNTIME_DDL_OFF_ADVICE).detail
    log.warning("database '%s': %s; creating it", database, missing.detail)
    try:
        connection = connections.get(database)
        ensure_ledger(connection, config, database, create=True)
        return None
    except PermissionDenied as error:
        advice = ledger_grant_advice(config, connections, database, error)
        connections.discard(database)
        return missing.with_advice(advice).detail
    except DatabaseUnavailable:
        connections.discard(database)
        raise
    except DatabaseError as error:
        connections.discard(database)
        return f"{missing.detail}; creating it failed: {error.detail}"
