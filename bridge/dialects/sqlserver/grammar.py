"""SQL Server queue addresses: `table@[schema]@[catalog]`, as the transport writes them.

The transport takes the table part raw, up to the first `@`; schema and catalog are bare or
bracket-quoted (`]` doubled inside brackets). The bridge reads one thing more: a table part
written wholly in brackets, `[Samples.Receiver]`, is that quoted name, as SQL Server reads it
in a statement. People write headers that way by hand; the transport would look for a table
whose name holds the brackets, which no endpoint's name does. A table whose name does begin
with `[` and end with `]` is written bracket-quoted, so that it reads back as itself.
"""

from __future__ import annotations

import re

from bridge.addressing import TableAddress, check_characters, check_table
from bridge.exceptions import AddressError

# --------------------------------------------------------------------------------------------
# Queue addresses
# --------------------------------------------------------------------------------------------

SQLSERVER_DEFAULT_SCHEMA = "dbo"

# The inside of a bracket-quoted name: anything but a lone `]`.
_BRACKETED_BODY = re.compile(r"(?:[^\]]|\]\])*")


def _unbracketed(text: str) -> str | None:
    """The name `text` quotes when it is wholly one bracket-quoted name, else None."""
    if len(text) < 2 or text[0] != "[" or text[-1] != "]":
        return None
    body = text[1:-1]
    return body.replace("]]", "]") if _BRACKETED_BODY.fullmatch(body) else None


class SqlServerGrammar:
    """`table@[schema]@[catalog]`; schema and catalog optional, bare or bracket-quoted."""

    dialect: str = "sqlserver"
    # Identifiers compare without case under SQL Server's default collations.
    names_ignore_case: bool = True

    def parse(self, text: str) -> TableAddress:
        table, at, rest = text.partition("@")
        unquoted = _unbracketed(table)
        if unquoted is not None:
            table = unquoted  # `[]` is then an empty name, refused below
        check_table(table, text)
        if not at:
            return TableAddress(table)
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
        address = TableAddress(table, schema, catalog)
        self._validate(address, text)
        return address

    def resolve(
        self, address: TableAddress, default_schema: str | None, default_catalog: str | None
    ) -> TableAddress:
        resolved = TableAddress(
            address.table,
            address.schema or default_schema or SQLSERVER_DEFAULT_SCHEMA,
            address.catalog or default_catalog or None,
        )
        self._validate(resolved, address)
        return resolved

    def render(self, address: TableAddress) -> str:
        self._validate(address, address)
        schema = self.quote_identifier(address.schema or SQLSERVER_DEFAULT_SCHEMA)
        table = address.table
        if _unbracketed(table) is not None:
            table = self.quote_identifier(table)  # raw, it would read back without brackets
        if not address.catalog:
            return f"{table}@{schema}"
        return f"{table}@{schema}@{self.quote_identifier(address.catalog)}"

    def qualified_name(self, address: TableAddress) -> str:
        self._validate(address, address)
        names = [address.schema or SQLSERVER_DEFAULT_SCHEMA, address.table]
        if address.catalog:
            names.insert(0, address.catalog)
        return ".".join(self.quote_identifier(name) for name in names)

    def quote_identifier(self, name: str) -> str:
        return "[" + name.replace("]", "]]") + "]"

    @staticmethod
    def _validate(address: TableAddress, source: object) -> None:
        check_table(address.table, source)
        if "@" in address.table:
            # The table part runs up to the first `@`, so such a name could never be read back.
            raise AddressError(
                f"table name {address.table!r} contains '@', which the SQL Server address "
                f"grammar cannot express (address {source!r})"
            )
        if address.schema:
            check_characters(address.schema, "schema", source)
        if address.catalog:
            check_characters(address.catalog, "catalog", source)

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


GRAMMAR = SqlServerGrammar()
