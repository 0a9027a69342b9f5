"""`sfbridge retries list / now / fail`: retry storage in the operator's hands.

`list` shows the messages waiting for another attempt; `now` makes them due at once, so a
running daemon tries them at its next look (within a second); `fail` gives up on them, moving
them to their forwarder's error queue with the failure headers and the reason
`failed-by-operator`, where `sfbridge errors` (or ServicePulse) takes over. Each verb is a
module here; they select with the options of `bridge.commands.selection`, as `errors` does. The
reads and writes are in `bridge.storage.retries`; each write locks as the daemon's claim does,
so the commands are safe beside running daemons.
"""

from __future__ import annotations

from bridge.commands.selection import Found, Selection, read_each
from bridge.config.model import BridgeConfig
from bridge.connections import Connections
from bridge.dialects import Dialect
from bridge.exceptions import DatabaseError
from bridge.storage.retries import RetryStore, WaitingMessage, read_waiting, retry_stores

FoundWaiting = Found[RetryStore, WaitingMessage]


def read_retry_stores(
    config: BridgeConfig,
    selection: Selection,
    connections: Connections,
    problems: list[DatabaseError],
) -> list[FoundWaiting]:
    """Every retry storage `selection` may reach, with the messages it selects."""
    stores = [
        store
        for store in retry_stores(config)
        if selection.forwarder is None or selection.forwarder in store.forwarders
    ]

    def selects(store: RetryStore, dialect: Dialect, message: WaitingMessage) -> bool:
        return selection.selects_waiting(message, dialect.grammar)

    return read_each(
        config,
        stores,
        connections,
        problems,
        read_waiting,
        lambda store, dialect: store.describe(dialect),
        selects,
    )
