"""Queue addresses: what every dialect's address grammar shares. Pure: no I/O.

An address is the text NServiceBus endpoints put on the wire to name a queue table. Each
transport has its own grammar, and the bridge must read and write those strings exactly as the
transports do, or messages end up in the wrong table (or in no table at all). Each grammar
lives in its dialect's module (`bridge.dialects.<name>`, found through
`bridge.dialects.registry.grammar_for`):

- PostgreSQL: `"schema"."table"`; the address is also the SQL qualified name
  (https://docs.particular.net/transports/postgresql/addressing).
- SQL Server: `table@[schema]@[catalog]`; the table part is raw, the others bracket-quoted
  (https://docs.particular.net/transports/sql/addressing).
- SQLite: the bare table name (SQLite has no schemas); SQL Server form is accepted on input.

Every grammar validates in `parse`, `resolve`, `render` and `qualified_name`, so an address built
by hand cannot slip past the rules that a parsed one has to obey; `check_table` and
`check_characters` are the checks every grammar applies.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Protocol

from bridge.exceptions import AddressError

__all__ = [
    "AddressGrammar",
    "TableAddress",
    "check_characters",
    "check_table",
    "folded_name",
    "whole_name_reading",
]


@dataclass(frozen=True)
class TableAddress:
    """A queue table. `schema` / `catalog` are None when the address did not name them."""

    table: str
    schema: str | None = None
    catalog: str | None = None


class AddressGrammar(Protocol):
    """One dialect's queue address grammar; `dialect` is the dialect's name; `names_ignore_case`
    whether the database takes two names that differ only in case for one."""

    dialect: str
    names_ignore_case: bool

    def parse(self, text: str) -> TableAddress: ...

    def resolve(
        self, address: TableAddress, default_schema: str | None, default_catalog: str | None
    ) -> TableAddress: ...

    def render(self, address: TableAddress) -> str: ...

    def qualified_name(self, address: TableAddress) -> str: ...

    def quote_identifier(self, name: str) -> str: ...


def check_table(table: str, address: object) -> None:
    """Raise AddressError for a blank table name or one no database can store."""
    # A blank table name is always a configuration mistake; letting it through would only
    # surface later as a confusing database error far away from the address that caused it.
    if not table.strip():
        raise AddressError(f"empty table name in address {address!r}")
    check_characters(table, "table", address)


# A lone UTF-16 surrogate: .NET strings may hold one, and JSON carries it as `\ud800`, but
# UTF-8 cannot encode it, so no database can store it in a name.
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def check_characters(name: str, what: str, address: object) -> None:
    """Raise AddressError when the `what` ("table", "schema", ...) name `name` holds a
    character that no database can store in an identifier."""
    # No SQL engine accepts NUL in an identifier, and drivers tend to truncate at it silently.
    if "\x00" in name:
        raise AddressError(f"{what} name {name!r} contains a NUL character in address {address!r}")
    surrogate = _SURROGATE.search(name)
    if surrogate:
        # repr() escapes the surrogate, so the message itself can be logged and stored.
        raise AddressError(
            f"{what} name {name!r} contains an unpaired surrogate "
            f"(\\u{ord(surrogate.group()):04x}), which no database can store (address {address!r})"
        )


def folded_name(name: str) -> str:
    """`name` as a database may take it to be the same as another: compatibility forms
    folded (NFKC: full-width letters, ligatures), case folded, trailing spaces dropped (SQL
    Server ignores them when it compares names). For refusing the bridge's own tables, where
    taking two names for one is the safe mistake."""
    return unicodedata.normalize("NFKC", name).casefold().rstrip(" ")


def whole_name_reading(grammar: AddressGrammar, text: str) -> TableAddress | None:
    """For an address whose unquoted dot made its first part a schema (PostgreSQL reads
    `Samples.Receiver` as table `Receiver` in schema `Samples`, as NServiceBus's PostgreSQL
    addressing does), the table the person writing it usually meant: the whole text as one
    table name, in no schema (resolve it with the database's default). None when the text has
    no such dot (quoted, or a grammar where a dot is part of the name) or cannot be parsed.

    The one place `send` (before it sends), `check`, `install` and the daemon's start read
    the mistake (`bridge.storage.dotted_names` asks the database which of the two exists).
    """
    stripped = text.strip()
    if stripped.startswith(('"', "[")):
        return None
    try:
        parsed = grammar.parse(stripped)
    except AddressError:
        return None
    if parsed.schema is None:
        return None
    return TableAddress(stripped)
