"""The dotted-name trap: `queue: Samples.Sender.Forward` unquoted in the YAML is table
`Sender.Forward` in schema `Samples` (an unquoted dot separates schema and table, as in
NServiceBus's PostgreSQL addressing), while the endpoints' queue is usually the table
`"public"."Samples.Sender.Forward"`. The config is valid either way; only the database can tell
the mistake: the table it reads as is missing while the table of the whole name exists.

`check` reports it as a problem, `install` refuses to create the wrong table (and schema), and
the daemon warns at its start (`bridge.daemon.login_check`); `send` warns of the same reading
without a database (`bridge.addressing.whole_name_reading`, shared by all of them).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from bridge.addressing import TableAddress, whole_name_reading
from bridge.config.model import BridgeConfig
from bridge.dialects import Dialect, dialect_for
from bridge.drivers import Connection


@dataclass(frozen=True)
class DottedName:
    """A configured queue whose unquoted dot reads as a missing table in another schema,
    while a table of the whole name exists."""

    forwarder: str
    key: str  # the forwarder's key: queue or error_queue
    written: str  # as the config has it
    read_as: str  # the address it resolves to, which is missing
    meant: str  # the address of the whole name, which exists

    def __str__(self) -> str:
        return f"forwarder '{self.forwarder}': {self.key} {self.detail}"

    @property
    def detail(self) -> str:
        """What is wrong and the line to write, without whose key it is."""
        return (
            f"{self.written} is table {self.read_as} (an unquoted dot separates schema and "
            "table), which does not exist, while "
            f"{self.meant} does (the endpoints' queue?). Quote it in the YAML: "
            f"{self.key}: '{self.meant}' (or, if {self.read_as} is meant, quote that: "
            f"{self.key}: '{self.read_as}')"
        )


def dotted_names(config: BridgeConfig, database: str, connection: Connection) -> list[DottedName]:
    """Every dotted-name trap among the queues and error queues of the forwarders of
    `database`, as its tables are now. Raises the DatabaseError family."""
    return list(_dotted_names(config, database, connection))


def _dotted_names(
    config: BridgeConfig, database: str, connection: Connection
) -> Iterator[DottedName]:
    settings = config.databases[database]
    dialect = dialect_for(settings.dialect)
    grammar = dialect.grammar
    for forwarder in config.forwarders:
        if forwarder.database != database:
            continue
        for key, written in (("queue", forwarder.queue), ("error_queue", forwarder.error_queue)):
            whole = whole_name_reading(grammar, written)
            if whole is None:
                continue
            read_as = grammar.resolve(grammar.parse(written), settings.schema, None)
            meant = grammar.resolve(whole, settings.schema, None)
            if _exists(connection, dialect, read_as) or not _exists(connection, dialect, meant):
                continue
            yield DottedName(
                forwarder.name, key, written, grammar.render(read_as), grammar.render(meant)
            )


def _exists(connection: Connection, dialect: Dialect, address: TableAddress) -> bool:
    """Whether the table is there (with a column the login may see). Ends its transaction."""
    try:
        rows = connection.query(
            dialect.sql("table_columns", queue=address), (address.schema, address.table)
        )
    finally:
        connection.rollback()
    return bool(rows)
