"""The building blocks of the configuration schema: `Key`, `Section` and `REQUIRED`.

`bridge.config.schema` describes the file with them; the walker checks a document against that
description and the reference renderer documents it.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = ["REQUIRED", "Key", "KeyType", "Section", "SectionShape"]


class _Required:
    """Type of the `REQUIRED` sentinel: the key has no default and must be given."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Final = _Required()

KeyType = Literal[
    "string",
    "integer",
    "boolean",
    "duration",
    "choice",
    "address",
    "topic",
    "mapping",
    "listen",
    "size",
    "names",
]
SectionShape = Literal["mapping", "named", "list", "multimap"]


@dataclass(frozen=True)
class Key:
    """One configuration key: how it is checked, converted and documented.

    `default` is the converted value used when the key is absent or null (`REQUIRED`: the key
    must be given). `dialects` restricts a database key to databases of those dialects: there
    it is required if `default is REQUIRED`, elsewhere it is an error to give it
    (`dialect_hint` says what to do instead). `minimum` is inclusive unless
    `exclusive_minimum`; `warn_outside` gives an inclusive range outside which a valid value
    draws a warning, `warn_hint` says why that matters. A string must fully match `pattern`,
    else `pattern_message` is reported (with the value, unless `secret`). `expand_env` enables
    `${VAR}` expansion; `secret` forbids echoing the value in messages; `empty_is_none` turns
    an empty string into None instead of an error; `numbers_as_text` takes a whole number
    written without quotes as its text (`processes: 2` beside `processes: auto`).

    A `mapping` key holds a nested mapping of its own `fields` (keys checked like a section's,
    with paths such as `forwarders[0].destination.queue`), built into `model`.
    """

    name: str
    type: KeyType
    description: str
    example: object
    default: object = REQUIRED
    choices: tuple[str, ...] = ()
    unavailable: tuple[str, ...] = ()
    case_insensitive: bool = False
    minimum: float | None = None
    exclusive_minimum: bool = False
    maximum: float | None = None
    warn_outside: tuple[float, float] | None = None
    warn_hint: str = ""
    pattern: str | None = None
    pattern_message: str = ""
    expand_env: bool = False
    secret: bool = False
    empty_is_none: bool = False
    numbers_as_text: bool = False
    dialects: tuple[str, ...] = ()
    dialect_hint: str = ""
    fields: tuple[Key, ...] = ()
    # `builtins.type`: within this class, `type` is the field above.
    model: builtins.type[Any] | None = None

    @property
    def required(self) -> bool:
        """True when the key has no default (for dialect keys: on those dialects only)."""
        return self.default is REQUIRED


@dataclass(frozen=True)
class Section:
    """A top-level key of the file.

    `shape` is `mapping` (a fixed set of keys), `named` (a mapping of entry name -> entry, the
    name matching `name_pattern`), `list` (a list of entries) or `multimap` (a mapping of
    free-form entry name -> non-empty list of values; no `keys`: `name_key` checks and documents
    the names, `items` each value of the lists). `model` is the dataclass built from one entry
    (or from the mapping; for `multimap` the tuple built from one list). `entry` names one entry
    in messages.
    """

    name: str
    shape: SectionShape
    description: str
    keys: tuple[Key, ...]
    model: type[Any]
    required: bool = False
    min_items: int = 0
    entry: str = ""
    name_pattern: str | None = None
    name_key: Key | None = None
    items: Key | None = None

    def key(self, name: str) -> Key:
        """The key called `name`; raises KeyError when the section has none."""
        for key in self.keys:
            if key.name == name:
                return key
        raise KeyError(name)

    @property
    def key_names(self) -> tuple[str, ...]:
        return tuple(key.name for key in self.keys)
