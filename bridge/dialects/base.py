"""What a dialect is: named SQL statements plus a few value-encoding hooks.

Statements are templates with `{queue}`, `{retry}`, `{ledger}` and `{counters}` standing for
quoted, qualified table names and `?` for parameters. Identifiers are the only thing ever
pasted into SQL, and only after quoting by the dialect's address grammar.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bridge.addressing import AddressGrammar, QueueAddress, grammar_for

# Every dialect defines exactly these statements (a unit test holds them to it).
STATEMENT_NAMES = frozenset(
    {
        "create_queue",
        "create_retry_table",
        "create_ledger_table",
        "create_counters_table",
        "peek",
        "receive_batch",
        "send",
        "dead_letter",
        "retry_store",
        "retry_claim_due",
        "retry_summary",
        "ledger_record",
        "ledger_record_many",
        "subscribers_many",
        "subscribers_row",
        "create_event_types_table",
        "event_type_seen",
        "event_types_read",
        "ledger_record_row",
        "send_many",
        "send_row",
        "ledger_cleanup",
        "counters_add",
        "counters_read",
        "queue_count",
        "queue_oldest_headers",
        "list_tables",
        "create_schema",
        "savepoint",
        "rollback_to_savepoint",
        "release_savepoint",
        "table_columns",
        "table_indexes",
    }
)

INDEX_SUFFIXES = ("expires", "due", "forwarded")

# The bridge's own tables live in each database's default schema under these names.
RETRY_TABLE = "sfbridge_retry"
LEDGER_TABLE = "sfbridge_ledger"
COUNTERS_TABLE = "sfbridge_counters"
EVENT_TYPES_TABLE = "sfbridge_event_types"


@dataclass(frozen=True)
class Dialect:
    """One database family.

    `queue_columns` is the queue table shape the dialect expects (lower-cased names), used by
    `check`, as are `queue_indexed_columns` (each must lead some index). `encode_*` /
    `decode_*` turn Python values into what the driver binds and back.
    """

    name: str
    statements: Mapping[str, str]
    queue_columns: frozenset[str]
    queue_indexed_columns: tuple[str, ...]
    # False where a connection is cheap to open and holding it would hide the database being
    # taken away (an open SQLite handle keeps writing into a file that was moved).
    keep_destination_connections: bool
    encode_id: Callable[[uuid.UUID], Any]
    decode_id: Callable[[Any], uuid.UUID]
    encode_timestamp: Callable[[datetime | None], Any]
    decode_timestamp: Callable[[Any], datetime | None]

    @property
    def grammar(self) -> AddressGrammar:
        return grammar_for(self.name)

    def sql(self, name: str, rows: int | None = None, **tables: QueueAddress) -> str:
        """The statement `name` with its table placeholders filled by quoted, qualified names.

        `rows` is for the multi-row `*_many` statements: their `{rows}` placeholder becomes
        that many copies of the matching `*_row` template.
        """
        template = self.statements[name]
        if rows is not None:
            row = self.statements[name.removesuffix("_many") + "_row"]
            template = template.replace("{rows}", ", ".join([row] * rows))
        names: dict[str, str] = {}
        for key, address in tables.items():
            names[key] = self.grammar.qualified_name(address)
            # Index names derive from the table name and are quoted like any identifier.
            for suffix in INDEX_SUFFIXES:
                names[f"{key}_index_{suffix}"] = self.grammar.quote_identifier(
                    f"{address.table}_{suffix}"
                )
        return template.format(**names)

    def create_schema_sql(self, schema: str | None) -> str | None:
        """`CREATE SCHEMA` for `schema`, or None where the dialect has no schemas."""
        template = self.statements["create_schema"]
        if not template or not schema:
            return None
        return template.format(schema=self.grammar.quote_identifier(schema))

    def bridge_table(self, table: str, schema: str | None) -> QueueAddress:
        """Address of one of the bridge's own tables, in a database with default `schema`."""
        return self.grammar.resolve(QueueAddress(table), schema, None)


def dialect_for(name: str) -> Dialect:
    """The Dialect for a configured dialect name. Raises KeyError for unknown names."""
    if name == "postgresql":
        from bridge.dialects.postgresql import POSTGRESQL

        return POSTGRESQL
    if name == "sqlite":
        from bridge.dialects.sqlite import SQLITE

        return SQLITE
    raise KeyError(f"no dialect named {name!r} (available: postgresql, sqlite)")
