"""Queue addresses in each dialect's grammar (nsb-wire §5, seed 002). Pure: no I/O.

PLACEHOLDER: the full implementation is being written; this file fixes the public API.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


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
