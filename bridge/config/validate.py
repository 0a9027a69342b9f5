"""Validation of a parsed YAML document against `bridge.config.schema`.

`validate` never stops at the first mistake: it walks the whole document, collecting every
problem (wrong types, unknown keys with a nearest-match suggestion, missing keys, values out of
range), then runs the checks that span several keys (references between sections, duplicate
queues, unreachable routes). Only a document without errors becomes a `BridgeConfig`.

No message ever contains a connection string or DSN value: such keys are marked `secret` in the
schema and their values are never echoed, and every `Problem` is passed through `mask_secrets`
as a second line of defence.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from bridge.config.model import (
    BridgeConfig,
    DatabaseConfig,
    ForwarderConfig,
    InstallConfig,
    LedgerConfig,
    LoggingConfig,
    PublishConfig,
    RetryConfig,
    RouteConfig,
    SentryConfig,
    SubscriptionTableConfig,
)
from bridge.config.schema import (
    FORWARDERS,
    RETRIES,
    ROUTES,
    SCHEMA,
    SUBSCRIPTION_TABLES,
    SUBSCRIPTIONS,
    Key,
    Section,
    format_duration,
    parse_duration,
    topic_problem,
)
from bridge.secrets import mask_secrets

__all__ = ["ConfigError", "Problem", "Severity", "expand_env", "validate"]

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a configuration.

    `path` locates it: a key path such as `routes[2].database`, `<file>:line:col` for YAML
    syntax errors, the file name for unreadable files, or "" for the document as a whole.
    Secrets in `path` and `message` are masked on construction, so a Problem is always safe to
    print or log.
    """

    path: str
    message: str
    severity: Severity = "error"

    def __post_init__(self) -> None:
        # Frozen, so bypass __setattr__; masking here protects every producer of Problems,
        # including future ones that forget to mask.
        object.__setattr__(self, "path", mask_secrets(self.path))
        object.__setattr__(self, "message", mask_secrets(self.message))

    def __str__(self) -> str:
        prefix = f"{self.path}: " if self.path else ""
        label = "warning: " if self.severity == "warning" else ""
        return f"{prefix}{label}{self.message}"


class ConfigError(Exception):
    """The configuration cannot be used. `problems` holds every problem found (warnings too);
    `str()` lists the errors, one per line."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems: list[Problem] = list(problems)
        # args = (problems,) so that the exception pickles and copies like any other.
        super().__init__(self.problems)

    @property
    def errors(self) -> list[Problem]:
        """The problems of severity "error"."""
        return [problem for problem in self.problems if problem.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        """The problems of severity "warning"."""
        return [problem for problem in self.problems if problem.severity == "warning"]

    def __str__(self) -> str:
        return "\n".join(str(problem) for problem in self.errors or self.problems)


# --------------------------------------------------------------------------------------------
# Environment variable expansion
# --------------------------------------------------------------------------------------------

_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def expand_env(text: str, environ: Mapping[str, str]) -> tuple[str, list[str]]:
    """Expand `${VAR}`, `${VAR:-default}` and `$$` in `text`.

    Given the raw value and the environment. Returns the expanded text and a list of error
    messages (empty when all went well). `${VAR}` with VAR unset is an error; `${VAR:-default}`
    uses the literal `default` when VAR is unset or empty; `$$` is a literal `$`; any other `$`
    is an error, so that a shell-style `$VAR` is not silently taken literally. Messages name
    variables and positions but never quote the text, which may hold a password.
    """
    pieces: list[str] = []
    errors: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char != "$":
            pieces.append(char)
            index += 1
            continue
        following = text[index + 1 : index + 2]
        if following == "$":
            pieces.append("$")
            index += 2
            continue
        if following != "{":
            errors.append(
                f"'$' at character {index + 1} does not start ${{VAR}} or ${{VAR:-default}}; "
                "write $$ for a literal '$'"
            )
            index += 1
            continue
        end = text.find("}", index + 2)
        if end < 0:
            errors.append(f"unterminated '${{' at character {index + 1}")
            break
        name, has_default, default = text[index + 2 : end].partition(":-")
        if not _VARIABLE_NAME.fullmatch(name):
            errors.append(
                f"invalid environment variable reference at character {index + 1}; "
                "expected ${NAME} or ${NAME:-default} with NAME made of letters, digits and '_'"
            )
        elif has_default:
            pieces.append(environ.get(name) or default)
        elif name in environ:
            pieces.append(environ[name])
        else:
            errors.append(f"environment variable {name} is not set")
        index = end + 1
    return "".join(pieces), errors


# --------------------------------------------------------------------------------------------
# Helpers for messages
# --------------------------------------------------------------------------------------------

_INVALID: Final = object()
_SIMPLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
# A password given literally in an ODBC connection string (not via ${VAR}).
_LITERAL_PASSWORD = re.compile(r"(?:^|;)\s*(?:pwd|password)\s*=\s*(?P<value>[^;]*)", re.I)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _named(path: str, name: str) -> str:
    # `databases.my.db.connection` would be ambiguous, so quote names that are not identifiers.
    return f"{path}.{name}" if _SIMPLE_NAME.fullmatch(name) else f"{path}[{json.dumps(name)}]"


def _describe(value: object, secret: bool = False) -> str:
    """Name the YAML type of `value`, quoting short non-secret scalars."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        kind, shown = "a boolean", str(value).lower()
    elif isinstance(value, int):
        kind, shown = "an integer", str(value)
    elif isinstance(value, float):
        kind, shown = "a number", repr(value)
    elif isinstance(value, str):
        kind, shown = "a string", repr(value if len(value) <= 40 else value[:37] + "...")
    elif isinstance(value, Mapping):
        return "a mapping"
    elif isinstance(value, list | tuple):
        return "a list"
    else:
        return f"a {type(value).__name__}"
    return kind if secret else f"{kind} ({shown})"


def _suggestion(word: object, candidates: Iterable[str]) -> str:
    """`" (did you mean 'x'?)"` for the closest candidate, or "" when none is close."""
    if not isinstance(word, str):
        return ""
    pool = list(candidates)
    matches = difflib.get_close_matches(word, pool, n=1, cutoff=0.6)
    if not matches:
        # Catch case-only differences that difflib scores too low for short words.
        matches = [c for c in pool if c.lower() == word.lower()][:1]
    return f" (did you mean {matches[0]!r}?)" if matches else ""


def _type_hint(value: object) -> str:
    if isinstance(value, bool):
        return "; YAML reads unquoted yes/no/on/off/true/false as booleans, quote the value"
    if isinstance(value, int | float):
        return "; quote the value if it is meant as text"
    return ""


# --------------------------------------------------------------------------------------------
# The validator
# --------------------------------------------------------------------------------------------


@dataclass
class _Entry:
    """One validated mapping: converted values of the keys that passed, and the keys given."""

    path: str
    values: dict[str, Any]
    given: set[str] = field(default_factory=set)
    name: str | None = None


@dataclass
class _Item:
    """One valid value of a `multimap` section's list, with where it was written."""

    path: str
    value: Any


class _Validator:
    def __init__(self, environ: Mapping[str, str], source_path: str | None) -> None:
        self.environ = environ
        self.source_path = source_path
        self.problems: list[Problem] = []
        self.database_names: list[str] = []
        self.databases: dict[str, _Entry] = {}
        self.forwarders: list[_Entry | None] = []
        self.routes: list[_Entry | None] = []
        self.subscription_tables: list[_Entry | None] = []
        self.lists: dict[str, list[_Entry | None]] = {
            FORWARDERS.name: self.forwarders,
            ROUTES.name: self.routes,
            SUBSCRIPTION_TABLES.name: self.subscription_tables,
        }
        self.mappings: dict[str, _Entry | None] = {}
        # multimap section name -> entry name -> its valid values.
        self.multimaps: dict[str, dict[str, list[_Item]]] = {}

    def error(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message, "error"))

    def warning(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message, "warning"))

    @property
    def has_errors(self) -> bool:
        return any(problem.severity == "error" for problem in self.problems)

    # -- walking ----------------------------------------------------------------------------

    def run(self, raw: object) -> BridgeConfig | None:
        if raw is None:
            self.error(
                "",
                "the configuration is empty; expected a mapping with at least the keys "
                "databases, forwarders and routes",
            )
            return None
        if not isinstance(raw, Mapping):
            self.error("", f"expected a mapping at the top level, got {_describe(raw)}")
            return None
        self.check_keys(raw, [sec.name for sec in SCHEMA], "")
        for sec in SCHEMA:
            self.section(sec, raw.get(sec.name))
        self.cross_checks()
        return None if self.has_errors else self.build()

    def check_keys(self, mapping: Mapping[Any, Any], known: list[str], path: str) -> None:
        """Report keys of `mapping` that are not strings or not in `known`."""
        for key in mapping:
            if not isinstance(key, str):
                self.error(path, f"keys must be strings, got {_describe(key)}")
            elif key not in known:
                hint = _suggestion(key, known) or f" (expected one of: {', '.join(known)})"
                self.error(_join(path, key), f"unknown key{hint}")

    def section(self, sec: Section, value: object) -> None:
        path = sec.name
        if value is None:
            if sec.required:
                self.error(path, f"required key is missing; {self.section_shape_text(sec)}")
            elif sec.shape == "mapping":
                self.mappings[sec.name] = self.entry(sec, {}, path)
            return
        if sec.shape == "mapping":
            self.mappings[sec.name] = self.entry(sec, value, path)
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

    def named_section(self, sec: Section, value: object) -> None:
        if not isinstance(value, Mapping):
            self.error(sec.name, f"{self.section_shape_text(sec)}, got {_describe(value)}")
            return
        if len(value) < sec.min_items:
            self.error(sec.name, f"at least {sec.min_items} {sec.entry} is required")
        pattern = re.compile(sec.name_pattern or ".+")
        for name, raw_entry in value.items():
            if not isinstance(name, str):
                self.error(sec.name, f"{sec.entry} names must be strings, got {_describe(name)}")
                continue
            path = _named(sec.name, name)
            if not pattern.fullmatch(name):
                self.error(
                    path,
                    f"invalid {sec.entry} name: use only letters, digits, '_', '.' and '-'",
                )
            self.database_names.append(name)
            entry = self.entry(sec, raw_entry, path)
            if entry is not None:
                entry.name = name
                self.databases[name] = entry

    def list_section(self, sec: Section, value: object) -> None:
        if not isinstance(value, list):
            self.error(sec.name, f"{self.section_shape_text(sec)}, got {_describe(value)}")
            return
        if len(value) < sec.min_items:
            self.error(sec.name, f"at least {sec.min_items} {sec.entry} is required")
        target = self.lists[sec.name]
        for index, raw_entry in enumerate(value):
            target.append(self.entry(sec, raw_entry, f"{sec.name}[{index}]"))

    def multimap_section(self, sec: Section, value: object) -> None:
        assert sec.name_key is not None and sec.items is not None
        if not isinstance(value, Mapping):
            self.error(sec.name, f"{self.section_shape_text(sec)}, got {_describe(value)}")
            return
        found = self.multimaps.setdefault(sec.name, {})
        for name, values in value.items():
            if not isinstance(name, str):
                self.error(sec.name, f"{sec.entry}s must be strings, got {_describe(name)}")
                continue
            # Always quoted: topics are full type names, dots and brackets included.
            path = f"{sec.name}[{json.dumps(name)}]"
            self.convert(sec.name_key, name, path)
            found[name] = self.multimap_items(sec.items, values, path)

    def multimap_items(self, key: Key, values: object, path: str) -> list[_Item]:
        if isinstance(values, str):
            # Deliberately not read as a one-element list: "A, B" would silently be one address.
            self.error(
                path,
                f"expected a list of {key.name}, got {_describe(values)}; write "
                f"{json.dumps([values])} for a single one",
            )
            return []
        if not isinstance(values, list):
            self.error(path, f"expected a list of {key.name}, got {_describe(values)}")
            return []
        if not values:
            self.error(path, f"the list of {key.name} is empty; leave the entry out instead")
            return []
        items: list[_Item] = []
        for index, value in enumerate(values):
            item_path = f"{path}[{index}]"
            if value is None:
                self.error(item_path, f"expected a string, got {_describe(value)}")
                continue
            converted = self.convert(key, value, item_path)
            if converted is not _INVALID:
                items.append(_Item(item_path, converted))
        return items

    def entry(self, sec: Section, raw: object, path: str) -> _Entry | None:
        """Check one mapping against the keys of `sec`; None when it is not a mapping at all."""
        if not isinstance(raw, Mapping):
            what = f"{sec.entry} settings" if sec.entry else "settings"
            self.error(path, f"expected a mapping of {what}, got {_describe(raw)}")
            return None
        self.check_keys(raw, list(sec.key_names), path)
        entry = _Entry(path, {})
        for key in sec.keys:
            self.entry_key(key, raw, entry)
        return entry

    def entry_key(self, key: Key, raw: Mapping[Any, Any], entry: _Entry) -> None:
        path = _join(entry.path, key.name)
        value = raw.get(key.name)
        dialect = entry.values.get("dialect")
        if key.dialects and dialect is not None and dialect not in key.dialects:
            # The key does not exist for this dialect: fill in None so the dataclass is
            # complete, and reject a value rather than silently ignoring it.
            entry.values[key.name] = None
            if value is not None:
                self.error(path, f"not used by {dialect} databases; {key.dialect_hint}")
            return
        if value is None:
            if not key.required:
                entry.values[key.name] = key.default
            elif key.dialects and dialect is None:
                pass  # Unknown dialect (already reported): cannot tell whether it is needed.
            elif key.name in raw:
                self.error(path, "required key has no value (null)")
            elif key.dialects:
                self.error(path, f"required key is missing for {dialect} databases")
            else:
                self.error(path, "required key is missing")
            return
        converted = self.convert(key, value, path)
        if converted is not _INVALID:
            entry.values[key.name] = converted
            entry.given.add(key.name)

    # -- conversion of single values --------------------------------------------------------

    def convert(self, key: Key, value: object, path: str) -> object:
        """Check and convert one non-null value; returns `_INVALID` after reporting."""
        if key.type in ("string", "address"):
            return self.convert_string(key, value, path)
        if key.type == "integer":
            return self.convert_integer(key, value, path)
        if key.type == "boolean":
            if isinstance(value, bool):
                return value
            self.error(path, f"expected true or false, got {_describe(value)}")
            return _INVALID
        if key.type == "duration":
            return self.convert_duration(key, value, path)
        if key.type == "topic":
            return self.convert_topic(value, path)
        return self.convert_choice(key, value, path)

    def convert_topic(self, value: object, path: str) -> object:
        if not isinstance(value, str):
            self.error(path, f"expected a string, got {_describe(value)}")
            return _INVALID
        problem = topic_problem(value)
        if problem is not None:
            self.error(path, problem)
            return _INVALID
        return value

    def convert_string(self, key: Key, value: object, path: str) -> object:
        if not isinstance(value, str):
            self.error(
                path, f"expected a string, got {_describe(value, key.secret)}{_type_hint(value)}"
            )
            return _INVALID
        text = value
        if key.expand_env:
            text, errors = expand_env(value, self.environ)
            for message in errors:
                self.error(path, message)
            if errors:
                return _INVALID
        if key.secret:
            self.check_literal_password(value, path)
        if not text.strip():
            if key.empty_is_none:
                return None
            after = " after expanding environment variables" if text != value else ""
            self.error(path, f"must not be empty{after}")
            return _INVALID
        if key.pattern and not re.fullmatch(key.pattern, text):
            shown = "" if key.secret else f"{text!r} "
            self.error(path, f"{shown}{key.pattern_message or 'is not valid'}")
            return _INVALID
        return text

    def check_literal_password(self, raw: str, path: str) -> None:
        for match in _LITERAL_PASSWORD.finditer(raw):
            if match.group("value").strip() and "${" not in match.group("value"):
                self.warning(
                    path,
                    "contains a password in plain text; put it in the environment and write "
                    "${VARIABLE} instead",
                )
                return

    def convert_integer(self, key: Key, value: object, path: str) -> object:
        if isinstance(value, bool) or not isinstance(value, int):
            hint = "; remove the quotes" if isinstance(value, str) else ""
            self.error(path, f"expected an integer, got {_describe(value)}{hint}")
            return _INVALID
        if not self.in_range(key, value, path, str(value)):
            return _INVALID
        return value

    def convert_duration(self, key: Key, value: object, path: str) -> object:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            self.error(
                path,
                f"expected a duration such as '10s' or a number of seconds, got {_describe(value)}",
            )
            return _INVALID
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            self.error(path, str(exc))
            return _INVALID
        if not self.in_range(key, seconds, path, format_duration(seconds)):
            return _INVALID
        if key.warn_outside is not None:
            low, high = key.warn_outside
            if not low <= seconds <= high:
                hint = f"; {key.warn_hint}" if key.warn_hint else ""
                if seconds > high and low <= (key.minimum or 0):
                    # The lower end is no real bound (values there are errors), so leave it out.
                    usual = f"more than the usual maximum {format_duration(high)}"
                else:
                    usual = (
                        f"outside the usual range {format_duration(low)}..{format_duration(high)}"
                    )
                self.warning(path, f"{format_duration(seconds)} is {usual}{hint}")
        return seconds

    def in_range(self, key: Key, number: float, path: str, shown: str) -> bool:
        low, high = key.minimum, key.maximum
        fmt = format_duration if key.type == "duration" else (lambda n: f"{n:g}")
        too_low = low is not None and (number <= low if key.exclusive_minimum else number < low)
        too_high = high is not None and number > high
        if not (too_low or too_high):
            return True
        if low is not None and high is not None:
            self.error(path, f"must be between {fmt(low)} and {fmt(high)}, got {shown}")
        elif low is not None:
            relation = "greater than" if key.exclusive_minimum else "at least"
            self.error(path, f"must be {relation} {fmt(low)}, got {shown}")
        else:
            self.error(path, f"must be at most {fmt(high or 0)}, got {shown}")
        return False

    def convert_choice(self, key: Key, value: object, path: str) -> object:
        available = [choice for choice in key.choices if choice not in key.unavailable]
        expected = ", ".join(available)
        if not isinstance(value, str):
            self.error(path, f"expected one of {expected}, got {_describe(value)}")
            return _INVALID
        normal = value.upper() if key.case_insensitive else value
        if normal in key.unavailable:
            self.error(
                path,
                f"{key.name} {value!r} is not available in this version (available: {expected})",
            )
            return _INVALID
        if normal not in key.choices:
            hint = _suggestion(normal, available)
            self.error(path, f"{value!r} is not one of {expected}{hint}")
            return _INVALID
        return normal

    # -- checks across keys -----------------------------------------------------------------

    def cross_checks(self) -> None:
        self.check_references()
        self.check_forwarders()
        self.check_routes()
        self.check_subscriptions()
        self.check_subscription_tables()
        self.check_retries()

    def check_references(self) -> None:
        for entries in (self.forwarders, self.routes, self.subscription_tables):
            for entry in entries:
                if entry is None or "database" not in entry.values:
                    continue
                name = entry.values["database"]
                if name in self.database_names:
                    continue
                known = sorted(self.database_names)
                hint = _suggestion(name, known)
                if not hint:
                    hint = f" (databases: {', '.join(known)})" if known else " (none is defined)"
                self.error(_join(entry.path, "database"), f"no database named {name!r}{hint}")

    def dialect_of(self, entry: _Entry) -> str | None:
        database = self.databases.get(entry.values.get("database", ""))
        return None if database is None else database.values.get("dialect")

    def check_forwarders(self) -> None:
        first_by_name: dict[str, str] = {}
        first_by_queue: dict[tuple[str, object], str] = {}
        for entry in self.forwarders:
            if entry is None:
                continue
            name = entry.values.get("name")
            if name is not None:
                if name in first_by_name:
                    self.error(
                        _join(entry.path, "name"),
                        f"duplicate forwarder name {name!r} (already used by "
                        f"{first_by_name[name]})",
                    )
                else:
                    first_by_name[name] = entry.path
            queue, error_queue = self.resolve_queues(entry)
            if queue is not None and queue == error_queue:
                self.error(
                    _join(entry.path, "error_queue"),
                    "is the same queue as 'queue'; failed messages would be forwarded again",
                )
            database = entry.values.get("database")
            if queue is not None and database is not None:
                slot = (database, queue)
                if slot in first_by_queue:
                    self.error(
                        _join(entry.path, "queue"),
                        f"{first_by_queue[slot]} already drains this queue in database "
                        f"{database!r}",
                    )
                else:
                    first_by_queue[slot] = entry.path
            self.check_single_writer(entry)

    def resolve_queues(self, entry: _Entry) -> tuple[object, object]:
        """Parse `queue` and `error_queue` in the grammar of the forwarder's database.

        Returns comparable forms of both (resolved addresses, or the raw text when the
        database or its grammar is unknown), None for a missing or unparsable one.
        """
        from bridge.addressing import AddressError
        from bridge.dialects.registry import grammar_for

        dialect = self.dialect_of(entry)
        database = self.databases.get(entry.values.get("database", ""))
        default_schema = None if database is None else database.values.get("schema")
        results: list[object] = []
        for key in ("queue", "error_queue"):
            text = entry.values.get(key)
            if text is None or dialect is None:
                results.append(text)
                continue
            try:
                grammar = grammar_for(dialect)
                results.append(grammar.resolve(grammar.parse(text), default_schema, None))
            except AddressError as exc:
                self.error(_join(entry.path, key), f"invalid {dialect} queue address: {exc}")
                results.append(None)
        return results[0], results[1]

    def check_single_writer(self, entry: _Entry) -> None:
        from bridge.dialects.registry import dialects

        dialect = dialects().get(self.dialect_of(entry) or "")
        if dialect is None or not dialect.single_writer:
            return
        concurrency = entry.values.get("concurrency")
        if "concurrency" in entry.given and isinstance(concurrency, int) and concurrency > 1:
            self.warning(
                _join(entry.path, "concurrency"),
                f"{dialect.title} serialises writers, so the bridge runs one worker for a "
                f"{dialect.name} database; concurrency {concurrency} is ignored",
            )
        # Make the config say what actually runs, including when the default (2) was used.
        entry.values["concurrency"] = 1

    def check_routes(self) -> None:
        from bridge.dialects.registry import dialects

        earlier: list[_Entry] = []
        for entry in self.routes:
            if entry is None:
                continue
            match = entry.values.get("match")
            if match is not None:
                self.check_reachable(entry, match, earlier)
                earlier.append(entry)
            dialect = dialects().get(self.dialect_of(entry) or "")
            if entry.values.get("schema") is not None and dialect and not dialect.has_schemas:
                self.error(
                    _join(entry.path, "schema"),
                    f"{dialect.name} has no schemas (database {entry.values['database']!r} is "
                    f"{dialect.name})",
                )

    def check_reachable(self, entry: _Entry, match: str, earlier: list[_Entry]) -> None:
        for previous in earlier:
            pattern = previous.values["match"]
            if set(pattern) == {"*"}:
                reason = f"{previous.path} (match {pattern!r}) matches every destination first"
            elif pattern == match:
                reason = f"{previous.path} has the same match and comes first"
            else:
                continue
            self.warning(_join(entry.path, "match"), f"route {match!r} is unreachable: {reason}")
            return

    def forwarding_dialects(self) -> list[str]:
        """The dialects of the forwarders' databases, in forwarder order, each once."""
        dialects: list[str] = []
        for entry in self.forwarders:
            dialect = None if entry is None else self.dialect_of(entry)
            if dialect is not None and dialect not in dialects:
                dialects.append(dialect)
        return dialects

    def check_subscriptions(self) -> None:
        """Subscriber addresses: parsed in every forwarding dialect, routable, not repeated.

        A published event is multicast by whichever forwarder drains it, and a subscriber
        address is read like a destination header: in that forwarder's database's grammar.
        """
        from bridge.addressing import AddressError, QueueAddress
        from bridge.dialects.registry import grammar_for

        dialects = self.forwarding_dialects()
        routes = self.route_configs()
        for topic, items in self.multimaps.get(SUBSCRIPTIONS.name, {}).items():
            first: dict[object, str] = {}
            unique: list[_Item] = []
            for item in items:
                parsed: dict[str, QueueAddress] = {}
                for dialect in dialects:
                    try:
                        parsed[dialect] = grammar_for(dialect).parse(item.value)
                    except AddressError as exc:
                        self.error(item.path, f"invalid {dialect} address: {exc}")
                if routes is not None:
                    self.check_subscriber_route(item, parsed, routes)
                # The same queue in every forwarding dialect, e.g. `a.b` and `"a"."b"` when all
                # forwarders are postgresql; the text when an address does not parse.
                complete = dialects and len(parsed) == len(dialects)
                same = tuple(parsed.items()) if complete else item.value
                if same in first:
                    self.warning(
                        item.path,
                        f"{item.value!r} is the same subscriber as {first[same]}; it gets the "
                        "event once",
                    )
                else:
                    first[same] = item.path
                    unique.append(item)
            self.multimaps[SUBSCRIPTIONS.name][topic] = unique

    def route_configs(self) -> list[RouteConfig] | None:
        """The routes as far as matching goes; None when one is broken (already reported),
        since checking against the others would report destinations it may well route."""
        routes: list[RouteConfig] = []
        for entry in self.routes:
            if entry is None or entry.values.get("match") is None:
                return None
            routes.append(RouteConfig(entry.values["match"], entry.values.get("database", "")))
        return routes

    def check_subscriber_route(
        self, item: _Item, parsed: Mapping[str, Any], routes: list[RouteConfig]
    ) -> None:
        from bridge.routing import first_matching_route

        reported: set[str] = set()
        for dialect, address in parsed.items():
            table = address.table
            if table in reported or first_matching_route(table, routes) is not None:
                continue
            reported.add(table)
            patterns = [route.match for route in routes]
            close = difflib.get_close_matches(table, patterns, n=1, cutoff=0.6)
            hint = f" (did you mean a destination matching {close[0]!r}?)" if close else ""
            read_as = ""
            if table != item.value:
                read_as = f"; {dialect} reads {item.value!r} as table {table!r}"
                if address.schema is not None and first_matching_route(item.value, routes):
                    read_as += f", write {json.dumps(item.value)!r} for a table with a dot"
            listed = ", ".join(repr(p) for p in patterns)
            self.error(
                item.path,
                f"no route matches subscriber table {table!r}{hint}{read_as}; routes: {listed}",
            )

    def check_subscription_tables(self) -> None:
        from bridge.addressing import AddressError
        from bridge.dialects.registry import grammar_for

        first: dict[tuple[object, object], str] = {}
        for entry in self.subscription_tables:
            if entry is None or entry.values.get("table") is None:
                continue
            name = entry.values.get("database")
            database = self.databases.get(name) if isinstance(name, str) else None
            if database is None or database.values.get("dialect") is None:
                continue
            dialect, text = database.values["dialect"], entry.values["table"]
            try:
                grammar = grammar_for(dialect)
                parsed = grammar.parse(text)
                table = grammar.resolve(parsed, database.values.get("schema"), None)
            except AddressError as exc:
                self.error(_join(entry.path, "table"), f"invalid {dialect} table address: {exc}")
                continue
            slot = (name, table)
            if slot in first:
                self.warning(
                    _join(entry.path, "table"),
                    f"{first[slot]} already names this table in database {name!r}; it is read once",
                )
            else:
                first[slot] = entry.path

    def check_retries(self) -> None:
        retries = self.mappings.get(RETRIES.name)
        if retries is None:
            return
        delay = retries.values.get("delay")
        for key in ("max_delay", "max_wait"):
            value = retries.values.get(key)
            if delay is None or value is None or value >= delay:
                continue
            default = "" if key in retries.given else " (the default)"
            self.error(
                _join(retries.path, key),
                f"{format_duration(value)}{default} is less than retries.delay "
                f"{format_duration(delay)}; it must be at least the delay",
            )


    # -- building ---------------------------------------------------------------------------

    def build(self) -> BridgeConfig:
        databases = {
            name: DatabaseConfig(name=name, **self.database_values(entry))
            for name, entry in self.databases.items()
        }
        mappings = {name: entry.values if entry else {} for name, entry in self.mappings.items()}
        return BridgeConfig(
            databases=types.MappingProxyType(databases),
            forwarders=tuple(ForwarderConfig(**e.values) for e in self.forwarders if e),
            routes=tuple(RouteConfig(**e.values) for e in self.routes if e),
            retries=RetryConfig(**mappings["retries"]),
            install=InstallConfig(**mappings["install"]),
            ledger=LedgerConfig(**mappings["ledger"]),
            logging=LoggingConfig(**mappings["logging"]),
            sentry=SentryConfig(**mappings["sentry"]),
            subscriptions=types.MappingProxyType(
                {
                    topic: tuple(item.value for item in items)
                    for topic, items in self.multimaps.get(SUBSCRIPTIONS.name, {}).items()
                }
            ),
            subscription_tables=tuple(
                SubscriptionTableConfig(**e.values) for e in self.subscription_tables if e
            ),
            publish=PublishConfig(**mappings["publish"]),
            source_path=self.source_path,
        )

    def database_values(self, entry: _Entry) -> dict[str, Any]:
        values = dict(entry.values)
        path = values.get("path")
        # Relative SQLite paths are taken from the config file's folder, not from the working
        # directory, which under systemd is `/` and differs between a shell and the service.
        if (
            path
            and self.source_path
            and not os.path.isabs(path)
            and path != ":memory:"
            and not path.startswith("file:")
        ):
            base = os.path.dirname(os.path.abspath(self.source_path))
            values["path"] = os.path.normpath(os.path.join(base, path))
        return values


def validate(
    raw: object, environ: Mapping[str, str], source_path: str | None = None
) -> tuple[BridgeConfig | None, list[Problem]]:
    """Check a parsed YAML document and build the configuration from it.

    Given the document as `yaml.safe_load` returns it, the environment used for `${VAR}`
    expansion and the file it came from (stored as `BridgeConfig.source_path`; relative SQLite
    paths are resolved against its folder). Returns `(config, problems)`: every problem found,
    in document order followed by cross-key checks, and the config only when none of them is an
    error (warnings allowed), else None. Never raises for bad input.
    """
    validator = _Validator(environ, source_path)
    config = validator.run(raw)
    return config, validator.problems
