"""PostgreSQL addresses: `"schema"."table"`, split on the first dot outside double quotes
(https://docs.particular.net/transports/postgresql/addressing); the address is also the SQL
qualified name."""

from __future__ import annotations

from bridge.addressing import TableAddress, check_characters, check_table
from bridge.exceptions import AddressError

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
    # A quoted identifier is exact: "Billing" and "billing" are two schemas.
    names_ignore_case: bool = False

    def parse(self, text: str) -> TableAddress:
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
        address = TableAddress(table, schema)
        self._validate(address, text)
        return address

    def resolve(
        self, address: TableAddress, default_schema: str | None, default_catalog: str | None
    ) -> TableAddress:
        # PostgreSQL cannot query across databases, so a catalog never has a meaning here.
        resolved = TableAddress(
            address.table, address.schema or default_schema or PG_DEFAULT_SCHEMA
        )
        self._validate(resolved, address)
        return resolved

    def render(self, address: TableAddress) -> str:
        return self.qualified_name(address)

    def qualified_name(self, address: TableAddress) -> str:
        self._validate(address, address)
        schema = address.schema or PG_DEFAULT_SCHEMA
        return f"{self.quote_identifier(schema)}.{self.quote_identifier(address.table)}"

    def quote_identifier(self, name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    def _validate(self, address: TableAddress, source: object) -> None:
        check_table(address.table, source)
        size = len(address.table.encode("utf-8"))
        if size > PG_MAX_TABLE_BYTES:
            raise AddressError(
                f"table name {address.table!r} is {size} bytes in UTF-8; the PostgreSQL "
                f"transport allows at most {PG_MAX_TABLE_BYTES} (address {source!r})"
            )
        if address.schema:
            check_characters(address.schema, "schema", source)
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


GRAMMAR = PostgreSqlGrammar()
