"""The generic walk of a parsed YAML document against `SCHEMA`.

It never stops at the first mistake: every section, entry and key is visited, and every problem
(wrong types, unknown keys with a nearest-match suggestion, missing keys, values out of range)
goes to the `ProblemLog`. What passed is kept in a `Document` for the checks that span several
keys and for building the configuration.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge.config.keys import Key, Section
from bridge.config.messages import describe_value, join_path, suggestion
from bridge.config.problems import ProblemLog
from bridge.config.schema import FORWARDERS, ROUTES, SCHEMA, SUBSCRIPTION_TABLES
from bridge.config.values import INVALID, ValueConverter

__all__ = ["Document", "Entry", "Item", "walk"]

_SIMPLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _named(path: str, name: str) -> str:
    # `databases.my.db.connection` would be ambiguous, so quote names that are not identifiers.
    return f"{path}.{name}" if _SIMPLE_NAME.fullmatch(name) else f"{path}[{json.dumps(name)}]"


@dataclass
class Entry:
    """One validated mapping: converted values of the keys that passed, and the keys given."""

    path: str
    values: dict[str, Any]
    given: set[str] = field(default_factory=set)


@dataclass
class Item:
    """One valid value of a `multimap` section's list, with where it was written."""

    path: str
    value: Any


def _list_sections() -> dict[str, list[Entry | None]]:
    return {sec.name: [] for sec in SCHEMA if sec.shape == "list"}


@dataclass
class Document:
    """What the walk kept of a document: the entries of every section, by section name.

    A list section keeps None for an entry that is not a mapping at all, so that its index
    still matches the file.
    """

    databases: dict[str, Entry] = field(default_factory=dict)
    # Every database name given, including those whose settings are not a mapping.
    database_names: list[str] = field(default_factory=list)
    lists: dict[str, list[Entry | None]] = field(default_factory=_list_sections)
    mappings: dict[str, Entry | None] = field(default_factory=dict)
    # multimap section name -> entry name -> its valid values.
    multimaps: dict[str, dict[str, list[Item]]] = field(default_factory=dict)

    @property
    def forwarders(self) -> list[Entry | None]:
        return self.lists[FORWARDERS.name]

    @property
    def routes(self) -> list[Entry | None]:
        return self.lists[ROUTES.name]

    @property
    def subscription_tables(self) -> list[Entry | None]:
        return self.lists[SUBSCRIPTION_TABLES.name]

    def dialect_of(self, entry: Entry) -> str | None:
        """The dialect of the database `entry` names; None when it is unknown."""
        database = self.databases.get(entry.values.get("database", ""))
        return None if database is None else database.values.get("dialect")


def walk(raw: object, environ: Mapping[str, str], log: ProblemLog) -> Document | None:
    """Check `raw`, a document as `yaml.safe_load` returns it, against `SCHEMA`.

    Given the environment for `${VAR}` expansion and the log that receives every problem.
    Returns what passed, or None when the document is not a mapping at all.
    """
    if raw is None:
        log.error(
            "",
            "the configuration is empty; expected a mapping with at least the keys "
            "databases, forwarders and routes",
        )
        return None
    if not isinstance(raw, Mapping):
        log.error("", f"expected a mapping at the top level, got {describe_value(raw)}")
        return None
    walker = _Walker(environ, log)
    walker.check_keys(raw, [sec.name for sec in SCHEMA], "")
    for sec in SCHEMA:
        walker.section(sec, raw.get(sec.name))
    return walker.document


class _Walker:
    """One walk: fills `document` with what passed, section by section, in document order."""

    def __init__(self, environ: Mapping[str, str], log: ProblemLog) -> None:
        self.log = log
        self.values = ValueConverter(environ, log)
        self.document = Document()

    def check_keys(self, mapping: Mapping[Any, Any], known: list[str], path: str) -> None:
        """Report keys of `mapping` that are not strings or not in `known`."""
        for key in mapping:
            if not isinstance(key, str):
                self.log.error(path, f"keys must be strings, got {describe_value(key)}")
            elif key not in known:
                hint = suggestion(key, known) or f" (expected one of: {', '.join(known)})"
                self.log.error(join_path(path, key), f"unknown key{hint}")

    def section(self, sec: Section, value: object) -> None:
        path = sec.name
        if value is None:
            if sec.required:
                self.log.error(path, f"required key is missing; {self.section_shape_text(sec)}")
            elif sec.shape == "mapping" and not any(key.required for key in sec.keys):
                self.document.mappings[sec.name] = self.entry(sec, {}, path)
            # A mapping section with a required key (`servicecontrol`) is off when absent.
            return
        if sec.shape == "mapping":
            self.document.mappings[sec.name] = self.entry(sec, value, path)
        elif sec.shape == "named":
            self.named_section(sec, value)
        elif sec.shape == "multimap":
            self.multimap_section(sec, value)
        else:
            self.list_section(sec, value)

    @staticmethod
    def section_shape_text(sec: Section) -> str:
        if sec.shape == "named":
            return f"expected a mapping of {sec.entry} name to {sec.entry} settings"
        if sec.shape == "list":
            return f"expected a list of {sec.entry}s"
        if sec.shape == "multimap" and sec.items is not None:
            return f"expected a mapping of {sec.entry} to a list of {sec.items.name}"
        return "expected a mapping"

    def wrong_shape(self, sec: Section, value: object) -> None:
        self.log.error(sec.name, f"{self.section_shape_text(sec)}, got {describe_value(value)}")

    def check_min_items(self, sec: Section, value: Mapping[Any, Any] | list[Any]) -> None:
        if len(value) < sec.min_items:
            self.log.error(sec.name, f"at least {sec.min_items} {sec.entry} is required")

    def named_section(self, sec: Section, value: object) -> None:
        if not isinstance(value, Mapping):
            self.wrong_shape(sec, value)
            return
        self.check_min_items(sec, value)
        pattern = re.compile(sec.name_pattern or ".+")
        for name, raw_entry in value.items():
            if not isinstance(name, str):
                self.log.error(
                    sec.name, f"{sec.entry} names must be strings, got {describe_value(name)}"
                )
                continue
            path = _named(sec.name, name)
            if not pattern.fullmatch(name):
                self.log.error(
                    path,
                    f"invalid {sec.entry} name: use only letters, digits, '_', '.' and '-'",
                )
            self.document.database_names.append(name)
            entry = self.entry(sec, raw_entry, path)
            if entry is not None:
                self.document.databases[name] = entry

    def list_section(self, sec: Section, value: object) -> None:
        if not isinstance(value, list):
            self.wrong_shape(sec, value)
            return
        self.check_min_items(sec, value)
        target = self.document.lists[sec.name]
        for index, raw_entry in enumerate(value):
            target.append(self.entry(sec, raw_entry, f"{sec.name}[{index}]"))

    def multimap_section(self, sec: Section, value: object) -> None:
        assert sec.name_key is not None and sec.items is not None
        if not isinstance(value, Mapping):
            self.wrong_shape(sec, value)
            return
        found = self.document.multimaps.setdefault(sec.name, {})
        for name, values in value.items():
            if not isinstance(name, str):
                self.log.error(
                    sec.name, f"{sec.entry}s must be strings, got {describe_value(name)}"
                )
                continue
            # Always quoted: topics are full type names, dots and brackets included.
            path = f"{sec.name}[{json.dumps(name)}]"
            self.values.convert(sec.name_key, name, path)
            found[name] = self.multimap_items(sec.items, values, path)

    def multimap_items(self, key: Key, values: object, path: str) -> list[Item]:
        if isinstance(values, str):
            # Deliberately not read as a one-element list: "A, B" would silently be one address.
            self.log.error(
                path,
                f"expected a list of {key.name}, got {describe_value(values)}; write "
                f"{json.dumps([values])} for a single one",
            )
            return []
        if not isinstance(values, list):
            self.log.error(path, f"expected a list of {key.name}, got {describe_value(values)}")
            return []
        if not values:
            self.log.error(path, f"the list of {key.name} is empty; leave the entry out instead")
            return []
        items: list[Item] = []
        for index, value in enumerate(values):
            item_path = f"{path}[{index}]"
            if value is None:
                self.log.error(item_path, f"expected a string, got {describe_value(value)}")
                continue
            converted = self.values.convert(key, value, item_path)
            if converted is not INVALID:
                items.append(Item(item_path, converted))
        return items

    def entry(self, sec: Section, raw: object, path: str) -> Entry | None:
        """Check one mapping against the keys of `sec`; None when it is not a mapping at all."""
        if not isinstance(raw, Mapping):
            what = f"{sec.entry} settings" if sec.entry else "settings"
            self.log.error(path, f"expected a mapping of {what}, got {describe_value(raw)}")
            return None
        self.check_keys(raw, list(sec.key_names), path)
        entry = Entry(path, {})
        for key in sec.keys:
            self.entry_key(key, raw, entry)
        return entry

    def entry_key(self, key: Key, raw: Mapping[Any, Any], entry: Entry) -> None:
        path = join_path(entry.path, key.name)
        value = raw.get(key.name)
        dialect = entry.values.get("dialect")
        if key.dialects and dialect is not None and dialect not in key.dialects:
            # The key does not exist for this dialect: fill in None so the dataclass is
            # complete, and reject a value rather than silently ignoring it.
            entry.values[key.name] = None
            if value is not None:
                self.log.error(path, f"not used by {dialect} databases; {key.dialect_hint}")
            return
        if value is None:
            if not key.required:
                entry.values[key.name] = key.default
            elif key.dialects and dialect is None:
                pass  # Unknown dialect (already reported): cannot tell whether it is needed.
            elif key.name in raw:
                self.log.error(path, "required key has no value (null)")
            elif key.dialects:
                self.log.error(path, f"required key is missing for {dialect} databases")
            else:
                self.log.error(path, "required key is missing")
            return
        if key.type == "mapping":
            converted = self.nested(key, value, path)
        else:
            converted = self.values.convert(key, value, path)
        if converted is not INVALID:
            entry.values[key.name] = converted
            entry.given.add(key.name)

    def nested(self, key: Key, raw: object, path: str) -> object:
        """Check a `mapping` key's value against its fields and build its model; `INVALID`
        (after reporting every problem) when anything is wrong."""
        assert key.model is not None
        if not isinstance(raw, Mapping):
            hint = ""
            if isinstance(raw, str) and key.fields:
                hint = f"; write e.g. {key.name}: {{{key.fields[0].name}: {json.dumps(raw)}}}"
            self.log.error(
                path,
                f"expected a mapping with the keys {', '.join(f.name for f in key.fields)}, "
                f"got {describe_value(raw)}{hint}",
            )
            return INVALID
        self.check_keys(raw, [field.name for field in key.fields], path)
        values: dict[str, Any] = {}
        valid = True
        for field_key in key.fields:
            field_path = join_path(path, field_key.name)
            value = raw.get(field_key.name)
            if value is None:
                if field_key.required:
                    missing = "has no value (null)" if field_key.name in raw else "is missing"
                    self.log.error(field_path, f"required key {missing}")
                    valid = False
                else:
                    values[field_key.name] = field_key.default
                continue
            converted = self.values.convert(field_key, value, field_path)
            if converted is INVALID:
                valid = False
            else:
                values[field_key.name] = converted
        return key.model(**values) if valid else INVALID
