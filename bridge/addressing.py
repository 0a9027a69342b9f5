"""Queue addresses in each dialect's grammar (nsb-wire §5, seed 002). Pure: no I/O.

An address is the text NServiceBus endpoints put on the wire to name a queue table. Each
transport has its own grammar, and the bridge must read and write those strings exactly as the
transports do, or messages end up in the wrong table (or in no table at all).

- PostgreSQL: `"schema"."table"`; the address is also the SQL qualified name.
- SQL Server: `table@[schema]@[catalog]`; the table part is raw, the others bracket-quoted.
- SQLite: the bare table name (SQLite has no schemas); SQL Server form is accepted on input.

Every grammar validates in `parse`, `resolve`, `render` and `qualified_name`, so an address built
by hand cannot slip past the rules that a parsed one has to obey.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "GRAMMARS",
    "POSTGRESQL",
    "SQLITE",
    "SQLSERVER",
    "AddressError",
    "AddressGrammar",
    "PostgreSqlGrammar",
    "QueueAddress",
    "SqlServerGrammar",
    "SqliteGrammar",
    "grammar_for",
]


class AddressError(ValueError):
    """An address string that cannot be parsed in the given grammar."""


@dataclass(frozen=True)
class QueueAddress:
    """A queue table. `schema` / `catalog` are None when the address did not name them."""

    table: str
    schema: str | None = None
    catalog: str | None = None


class AddressGrammar(Protocol):
    dialect: str

    def parse(self, text: str) -> QueueAddress: ...

    def resolve(
        self, address: QueueAddress, default_schema: str | None, default_catalog: str | None
    ) -> QueueAddress: ...

    def render(self, address: QueueAddress) -> str: ...

    def qualified_name(self, address: QueueAddress) -> str: ...

    def quote_identifier(self, name: str) -> str: ...


def _check_table(table: str, address: object) -> None:
    # A blank table name is always a configuration mistake; letting it through would only
    # surface later as a confusing database error far away from the address that caused it.
    if not table.strip():
        raise AddressError(f"empty table name in address {address!r}")
    _check_characters(table, "table", address)


# A lone UTF-16 surrogate: .NET strings may hold one, and JSON carries it as `\ud800`, but
# UTF-8 cannot encode it, so no database can store it in a name.
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _check_characters(name: str, what: str, address: object) -> None:
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


# --------------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------------

# NAMEDATALEN is 64, so identifiers hold 63 bytes; the transport reserves room for the suffixes
# it appends to derived objects (indexes, sequences) and refuses longer table names outright.
PG_MAX_TABLE_BYTES = 55
# PostgreSQL truncates longer identifiers without complaint, which would silently route
# messages to a different schema, so reject instead.
PG_MAX_IDENTIFIER_BYTES = 63
PG_DEFAULT_SCHEMA = "public"


class PostgreSqlGrammar:
    """`"schema"."table"`, split on the first dot outside double quotes."""

    dialect: str = "postgresql"

    def parse(self, text: str) -> QueueAddress:
        dot = self._first_unquoted_dot(text)
        if dot is None:
            table = self._unquote(text, text, "table")
            schema = None
        else:
            schema = self._unquote(text[:dot], text, "schema")
            table = self._unquote(text[dot + 1 :], text, "table")
            if not schema:
                # `.t` or `"".t` names a schema explicitly yet gives none; guessing `public`
                # could deliver to the wrong queue, so the sender has to fix the address.
                raise AddressError(f"empty schema name before '.' in address {text!r}")
        address = QueueAddress(table, schema)
        self._validate(address, text)
        return address

    def resolve(
        self, address: QueueAddress, default_schema: str | None, default_catalog: str | None
    ) -> QueueAddress:
        # PostgreSQL cannot query across databases, so a catalog never has a meaning here.
        resolved = QueueAddress(
            address.table, address.schema or default_schema or PG_DEFAULT_SCHEMA
        )
        self._validate(resolved, address)
        return resolved

    def render(self, address: QueueAddress) -> str:
        return self.qualified_name(address)

    def qualified_name(self, address: QueueAddress) -> str:
        self._validate(address, address)
        schema = address.schema or PG_DEFAULT_SCHEMA
        return f"{self.quote_identifier(schema)}.{self.quote_identifier(address.table)}"

    def quote_identifier(self, name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    def _validate(self, address: QueueAddress, source: object) -> None:
        _check_table(address.table, source)
        size = len(address.table.encode("utf-8"))
        if size > PG_MAX_TABLE_BYTES:
            raise AddressError(
                f"table name {address.table!r} is {size} bytes in UTF-8; the PostgreSQL "
                f"transport allows at most {PG_MAX_TABLE_BYTES} (address {source!r})"
            )
        if address.schema:
            _check_characters(address.schema, "schema", source)
            size = len(address.schema.encode("utf-8"))
            if size > PG_MAX_IDENTIFIER_BYTES:
                raise AddressError(
                    f"schema name {address.schema!r} is {size} bytes in UTF-8; PostgreSQL "
                    f"identifiers hold at most {PG_MAX_IDENTIFIER_BYTES} (address {source!r})"
                )

    @staticmethod
    def _first_unquoted_dot(text: str) -> int | None:
        # Toggling on every quote is enough: an escaped `""` flips the state twice with nothing
        # in between, so it can never hide or expose a dot. The scan runs to the end even after
        # a dot is found so that a dangling quote anywhere is reported as what it is.
        in_quotes = False
        dot: int | None = None
        for index, char in enumerate(text):
            if char == '"':
                in_quotes = not in_quotes
            elif char == "." and not in_quotes and dot is None:
                dot = index
        if in_quotes:
            raise AddressError(f"unbalanced double quotes in address {text!r}")
        return dot

    @staticmethod
    def _unquote(part: str, text: str, what: str) -> str:
        if not part.startswith('"'):
            if '"' in part:
                raise AddressError(
                    f"unquoted {what} name {part!r} contains a double quote in address {text!r};"
                    f' quote the whole name and write " as ""'
                )
            return part
        chars: list[str] = []
        index = 1
        while index < len(part):
            char = part[index]
            if char != '"':
                chars.append(char)
                index += 1
            elif part[index + 1 : index + 2] == '"':
                chars.append('"')
                index += 2
            elif index == len(part) - 1:
                return "".join(chars)
            else:
                raise AddressError(
                    f"unexpected text {part[index + 1 :]!r} after the closing double quote of "
                    f"{what} name in address {text!r}"
                )
        # Unreachable after the balance check in _first_unquoted_dot; kept so that _unquote
        # never returns a half-read name if that check changes.
        raise AddressError(f"unbalanced double quotes in {what} name in address {text!r}")


# --------------------------------------------------------------------------------------------
# SQL Server
# --------------------------------------------------------------------------------------------

SQLSERVER_DEFAULT_SCHEMA = "dbo"


class SqlServerGrammar:
    """`table@[schema]@[catalog]`; schema and catalog optional, bare or bracket-quoted."""

    dialect: str = "sqlserver"

    def parse(self, text: str) -> QueueAddress:
        table, at, rest = text.partition("@")
        _check_table(table, text)
        if not at:
            return QueueAddress(table)
        parts: list[str | None] = []
        position = 0
        while True:
            value, position = self._read_part(rest, position, text, len(parts))
            parts.append(value)
            if position == len(rest):
                break
            if len(parts) == 2:
                raise AddressError(
                    f"too many '@'-separated parts in address {text!r}; expected at most "
                    "table@schema@catalog"
                )
            # _read_part stops on the separator; step over it to the next part.
            position += 1
        schema = parts[0]
        catalog = parts[1] if len(parts) > 1 else None
        address = QueueAddress(table, schema, catalog)
        self._validate(address, text)
        return address

    def resolve(
        self, address: QueueAddress, default_schema: str | None, default_catalog: str | None
    ) -> QueueAddress:
        resolved = QueueAddress(
            address.table,
            address.schema or default_schema or SQLSERVER_DEFAULT_SCHEMA,
            address.catalog or default_catalog or None,
        )
        self._validate(resolved, address)
        return resolved

    def render(self, address: QueueAddress) -> str:
        self._validate(address, address)
        schema = self.quote_identifier(address.schema or SQLSERVER_DEFAULT_SCHEMA)
        if not address.catalog:
            return f"{address.table}@{schema}"
        return f"{address.table}@{schema}@{self.quote_identifier(address.catalog)}"

    def qualified_name(self, address: QueueAddress) -> str:
        self._validate(address, address)
        names = [address.schema or SQLSERVER_DEFAULT_SCHEMA, address.table]
        if address.catalog:
            names.insert(0, address.catalog)
        return ".".join(self.quote_identifier(name) for name in names)

    def quote_identifier(self, name: str) -> str:
        return "[" + name.replace("]", "]]") + "]"

    @staticmethod
    def _validate(address: QueueAddress, source: object) -> None:
        _check_table(address.table, source)
        if "@" in address.table:
            # The table part runs up to the first `@`, so such a name could never be read back.
            raise AddressError(
                f"table name {address.table!r} contains '@', which the SQL Server address "
                f"grammar cannot express (address {source!r})"
            )
        if address.schema:
            _check_characters(address.schema, "schema", source)
        if address.catalog:
            _check_characters(address.catalog, "catalog", source)

    @staticmethod
    def _read_part(rest: str, start: int, text: str, index: int) -> tuple[str | None, int]:
        """Read the schema (index 0) or catalog (index 1) part at `start`.

        Returns the unquoted name (None when empty) and the position of the `@` that ends it,
        or len(rest) when the part runs to the end.
        """
        what = ("schema", "catalog")[index]
        if not rest.startswith("[", start):
            end = rest.find("@", start)
            if end < 0:
                end = len(rest)
            return rest[start:end] or None, end
        chars: list[str] = []
        position = start + 1
        while position < len(rest):
            char = rest[position]
            if char != "]":
                chars.append(char)
                position += 1
            elif rest.startswith("]", position + 1):
                chars.append("]")
                position += 2
            else:
                position += 1
                if position < len(rest) and rest[position] != "@":
                    end = rest.find("@", position)
                    junk = rest[position:] if end < 0 else rest[position:end]
                    raise AddressError(
                        f"unexpected text {junk!r} after the closing ']' of the {what} in "
                        f"address {text!r}"
                    )
                return "".join(chars) or None, position
        raise AddressError(
            f"unterminated '[' in the {what} of address {text!r}; a ']' inside a bracketed "
            "name must be written as ']]'"
        )


# --------------------------------------------------------------------------------------------
# SQLite
# --------------------------------------------------------------------------------------------


class SqliteGrammar:
    """The bare table name; SQL Server addresses are accepted and reduced to their table."""

    dialect: str = "sqlite"

    def parse(self, text: str) -> QueueAddress:
        if "@" in text:
            # Lets a SQLite database stand in for a SQL Server one without rewriting addresses.
            table = SQLSERVER.parse(text).table
        else:
            table = text
            _check_table(table, text)
        return QueueAddress(table)

    def resolve(
        self, address: QueueAddress, default_schema: str | None, default_catalog: str | None
    ) -> QueueAddress:
        resolved = QueueAddress(address.table)
        self._validate(resolved, address)
        return resolved

    def render(self, address: QueueAddress) -> str:
        self._validate(address, address)
        return address.table

    def qualified_name(self, address: QueueAddress) -> str:
        self._validate(address, address)
        return self.quote_identifier(address.table)

    def quote_identifier(self, name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    @staticmethod
    def _validate(address: QueueAddress, source: object) -> None:
        _check_table(address.table, source)
        if "@" in address.table:
            # parse() treats any `@` as the start of SQL Server syntax, so it would not round-trip.
            raise AddressError(
                f"table name {address.table!r} contains '@', which the SQLite address grammar "
                f"reserves for SQL Server form (address {source!r})"
            )


POSTGRESQL = PostgreSqlGrammar()
SQLSERVER = SqlServerGrammar()
SQLITE = SqliteGrammar()

GRAMMARS: dict[str, AddressGrammar] = {
    grammar.dialect: grammar for grammar in (POSTGRESQL, SQLSERVER, SQLITE)
}


def grammar_for(dialect: str) -> AddressGrammar:
    """The grammar of `dialect` ("postgresql", "sqlserver" or "sqlite")."""
    try:
        return GRAMMARS[dialect]
    except KeyError:
        known = ", ".join(sorted(GRAMMARS))
        raise KeyError(f"unknown SQL dialect {dialect!r}; expected one of: {known}") from None
