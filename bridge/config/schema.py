"""The declarative schema of the YAML configuration file.

This module is the single source of truth about the configuration: `validate.py` walks `SCHEMA`
to check and convert a parsed YAML document, and `render_reference_markdown()` turns the very
same description into the Markdown reference that the README embeds. A key added here is
therefore validated and documented at once; a key that is not here is rejected as unknown.

Keys are named exactly like the fields of the dataclasses in `bridge.config.model`, and a unit
test checks that the defaults here equal the dataclass defaults.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from bridge.config.model import (
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
from bridge.dialects.registry import dialects

__all__ = [
    "DATABASES",
    "DIALECTS",
    "FILE_DIALECTS",
    "FORWARDERS",
    "IMPLEMENTED_DIALECTS",
    "LEDGER",
    "LOGGING",
    "NAME_MESSAGE",
    "NAME_PATTERN",
    "PUBLISH",
    "REQUIRED",
    "RETRIES",
    "ROUTES",
    "SCHEMA",
    "SCHEMA_DIALECTS",
    "SENTRY",
    "SERVER_DIALECTS",
    "SUBSCRIPTIONS",
    "SUBSCRIPTION_TABLES",
    "Key",
    "KeyType",
    "Section",
    "describe_default",
    "describe_type",
    "format_duration",
    "parse_duration",
    "render_reference_markdown",
    "section",
    "topic_problem",
]


class _Required:
    """Type of the `REQUIRED` sentinel: the key has no default and must be given."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Final = _Required()

KeyType = Literal["string", "integer", "boolean", "duration", "choice", "address", "topic"]
SectionShape = Literal["mapping", "named", "list", "multimap"]

# Every dialect module in bridge/dialects (the registry finds them), and what they need.
DIALECTS: Final = tuple(dialects())
# Dialects with a working driver in this version; any other would be recognised (so the message
# can say "not available yet" instead of "unknown") but rejected.
IMPLEMENTED_DIALECTS: Final = DIALECTS
# Located by an ODBC connection string / by a file path; with schemas / without.
SERVER_DIALECTS: Final = tuple(n for n, d in dialects().items() if d.locator == "connection")
FILE_DIALECTS: Final = tuple(n for n, d in dialects().items() if d.locator == "path")
SCHEMA_DIALECTS: Final = tuple(n for n, d in dialects().items() if d.has_schemas)


def _names(names: Sequence[str]) -> str:
    """`a`, `a and b`, `a, b and c`."""
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


_NO_SCHEMAS = [name for name in DIALECTS if name not in SCHEMA_DIALECTS]
_CONNECTION_HINT = f"{_names(FILE_DIALECTS)} databases take 'path' instead"
_PATH_HINT = f"{_names(SERVER_DIALECTS)} databases take 'connection' instead"
_SCHEMA_HINT = f"{_names(_NO_SCHEMAS)} {'has' if len(_NO_SCHEMAS) == 1 else 'have'} no schemas"


# Names end up in log lines, metrics labels and file names, so keep them to a safe alphabet.
NAME_PATTERN: Final = r"[A-Za-z0-9_.-]+"
NAME_MESSAGE: Final = "is not a valid name: use only letters, digits, '_', '.' and '-'"


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
    an empty string into None instead of an error.
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
    dialects: tuple[str, ...] = ()
    dialect_hint: str = ""

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


# --------------------------------------------------------------------------------------------
# The schema
# --------------------------------------------------------------------------------------------

_POSITIVE: Final[dict[str, Any]] = {"minimum": 0, "exclusive_minimum": True}

DATABASES = Section(
    name="databases",
    shape="named",
    entry="database",
    name_pattern=NAME_PATTERN,
    required=True,
    min_items=1,
    model=DatabaseConfig,
    description=(
        "The databases the bridge connects to, by name. Forwarders and routes refer to them by "
        "that name."
    ),
    keys=(
        Key(
            "dialect",
            "choice",
            "SQL dialect of the database and of its queue addresses.",
            example="postgresql",
            choices=DIALECTS,
            unavailable=tuple(d for d in DIALECTS if d not in IMPLEMENTED_DIALECTS),
        ),
        Key(
            "connection",
            "string",
            "ODBC connection string; `${VAR}` is expanded (keep passwords in the environment).",
            example="Driver={PostgreSQL Unicode};Server=db1;Database=receiver;Uid=bridge",
            expand_env=True,
            secret=True,
            dialects=SERVER_DIALECTS,
            dialect_hint=_CONNECTION_HINT,
        ),
        Key(
            "path",
            "string",
            "SQLite database file; `${VAR}` is expanded; a relative path is taken from the "
            "config file's folder.",
            example="/var/lib/sfbridge/edge.db",
            expand_env=True,
            dialects=FILE_DIALECTS,
            dialect_hint=_PATH_HINT,
        ),
        Key(
            "schema",
            "string",
            "Schema of queue addresses that name none (default: `public` / `dbo`).",
            example="nsb",
            default=None,
            dialects=SCHEMA_DIALECTS,
            dialect_hint=_SCHEMA_HINT,
        ),
        Key(
            "connect_timeout",
            "duration",
            "How long to wait for a connection before giving up.",
            example="5s",
            default=5.0,
            **_POSITIVE,
        ),
    ),
)

FORWARDERS = Section(
    name="forwarders",
    shape="list",
    entry="forwarder",
    required=True,
    min_items=1,
    model=ForwarderConfig,
    description=(
        "Local forwarding queues. Each forwarder drains one queue and delivers every message to "
        "the database its route selects."
    ),
    keys=(
        Key(
            "name",
            "string",
            "Unique name of the forwarder.",
            example="sender",
            pattern=NAME_PATTERN,
            pattern_message=NAME_MESSAGE,
        ),
        Key(
            "database",
            "string",
            "Name of the database (under `databases`) that holds the queue.",
            example="sender",
        ),
        Key(
            "queue",
            "address",
            "Queue to drain: a table name or an address in the database's dialect.",
            example="sfbridge.forward",
        ),
        Key(
            "error_queue",
            "address",
            "Queue for messages that cannot be delivered, parsed like `queue`; must differ "
            "from it.",
            example="error",
            default="error",
        ),
        Key(
            "batch_size",
            "integer",
            "Messages received per transaction.",
            example=100,
            default=100,
            minimum=1,
            maximum=10000,
        ),
        Key(
            "concurrency",
            "integer",
            "Parallel workers draining the queue (a sqlite database always gets one).",
            example=2,
            default=2,
            minimum=1,
            maximum=64,
        ),
        Key(
            "peek_interval",
            "duration",
            "Pause between polls of an empty queue; a warning outside 100ms..10s.",
            example="1s",
            default=1.0,
            warn_outside=(0.1, 10.0),
            **_POSITIVE,
        ),
    ),
)

ROUTES = Section(
    name="routes",
    shape="list",
    entry="route",
    required=True,
    min_items=1,
    model=RouteConfig,
    description=(
        "Where messages go, by destination table name. Routes are tried in order and the first "
        "match wins."
    ),
    keys=(
        Key(
            "match",
            "string",
            "Glob (`*`, `?`, `[abc]`) matched against the destination queue's table name.",
            example="Samples.Receiver*",
        ),
        Key(
            "database",
            "string",
            "Name of the database (under `databases`) that receives the matching messages.",
            example="receiver",
        ),
        Key(
            "schema",
            "string",
            "Schema of the destination queue, overriding the address and the database default "
            "(not for sqlite).",
            example="nsb",
            default=None,
        ),
    ),
)

SUBSCRIPTIONS = Section(
    name="subscriptions",
    shape="multimap",
    entry="topic",
    model=tuple,
    description=(
        "Who receives a published event (`$.store-and-forward.eventtype`), by topic: the "
        "event type's full name. Used together with `subscription_tables`."
    ),
    keys=(),
    name_key=Key(
        "topic",
        "topic",
        "Full name of the event type without the assembly part (a generic type's arguments "
        "in brackets may be assembly-qualified).",
        example="Shared.OrderSubmitted",
    ),
    items=Key(
        "subscribers",
        "address",
        "Subscriber queues, a list even for one: addresses in the grammar of every forwarding "
        "database (like destination headers), each matching a route; duplicates draw a warning.",
        example="Samples.Billing",
    ),
)

SUBSCRIPTION_TABLES = Section(
    name="subscription_tables",
    shape="list",
    entry="subscription table",
    model=SubscriptionTableConfig,
    description=(
        "NServiceBus native subscription tables (SQL transport subscription storage) whose "
        "subscribers are added to those under `subscriptions`."
    ),
    keys=(
        Key(
            "database",
            "string",
            "Name of the database (under `databases`) that holds the table.",
            example="receiver",
        ),
        Key(
            "table",
            "address",
            "The table: a table name or an address in the database's dialect.",
            example="SubscriptionRouting",
            default="SubscriptionRouting",
        ),
    ),
)

PUBLISH = Section(
    name="publish",
    shape="mapping",
    model=PublishConfig,
    description="How published events are multicast to their subscribers.",
    keys=(
        Key(
            "no_subscribers",
            "choice",
            "An event without subscribers: drop it (logged and counted) or move it to the "
            "error queue.",
            example="drop",
            default="drop",
            choices=("drop", "error"),
        ),
        Key(
            "cache",
            "duration",
            "How long subscriber lists read from `subscription_tables` are reused (NServiceBus "
            "uses 5s): a subscription added to or removed from a table takes effect at most "
            "this long after it is written. A warning above 1m.",
            example="5s",
            default=5.0,
            warn_outside=(0.0, 60.0),
            warn_hint="new subscriptions would be seen late",
            **_POSITIVE,
        ),
    ),
)

RETRIES = Section(
    name="retries",
    shape="mapping",
    model=RetryConfig,
    description=(
        "What happens when a delivery fails: a few immediate in-process attempts for transient "
        "errors, then durable delayed retries kept in the source database."
    ),
    keys=(
        Key(
            "delay",
            "duration",
            "Wait before the first delayed retry (and between them with `constant` backoff).",
            example="10s",
            default=10.0,
            **_POSITIVE,
        ),
        Key(
            "max_attempts",
            "integer",
            "Delivery attempts before a message is moved to the error queue.",
            example=100,
            default=100,
            minimum=1,
        ),
        Key(
            "backoff",
            "choice",
            "How the wait grows between delayed retries.",
            example="exponential",
            default="constant",
            choices=("constant", "linear", "exponential"),
        ),
        Key(
            "max_delay",
            "duration",
            "Longest wait between delayed retries; must be at least `delay`.",
            example="1h",
            default=3600.0,
            **_POSITIVE,
        ),
        Key(
            "immediate_attempts",
            "integer",
            "In-process attempts for transient errors before a delayed retry is scheduled.",
            example=3,
            default=3,
            minimum=1,
            maximum=10,
        ),
        Key(
            "missing_queue",
            "choice",
            "When the destination queue does not exist: keep retrying, or fail to the error queue.",
            example="retry",
            default="retry",
            choices=("retry", "error"),
        ),
        Key(
            "during_outage",
            "choice",
            "When a whole destination database is unreachable (cannot connect, does not exist, "
            "shutting down) or lacks a bridge table it cannot create: `count` spends an attempt "
            "each time as for any failure; `wait` spends none: one worker probes the database "
            "once per `delay` and its messages wait in retry storage until it is back, up to "
            "`max_wait`. Failures of one message (a rejected row, a missing queue in a reachable "
            "database) count in both.",
            example="wait",
            default="count",
            choices=("count", "wait"),
        ),
        Key(
            "max_wait",
            "duration",
            "With `during_outage: wait`, how long a message may wait from its first failure "
            "before it goes to the error queue (reason `outage-too-long`); must be at least "
            "`delay`. Expired messages are dropped while they wait, as always.",
            example="7d",
            default=7 * 24 * 3600.0,
            **_POSITIVE,
        ),
    ),
)

INSTALL = Section(
    name="install",
    shape="mapping",
    model=InstallConfig,
    description=(
        "Creating the bridge's own tables (forwarding and error queues, retry storage, counters, "
        "event types and destination states in forwarding databases; the dedup ledger in "
        "destination databases). `sfbridge install` creates them all; `install --print-sql` "
        "prints the DDL for a DBA."
    ),
    keys=(
        Key(
            "at_runtime",
            "boolean",
            "Whether the daemon creates one of those tables when it finds it missing (a "
            "database dropped and recreated heals without a human). `false` for shops where "
            "only a DBA runs DDL: a missing table is then reported (log, `status`, `check`) "
            "and its messages wait in retry storage.",
            example=True,
            default=True,
        ),
    ),
)

LEDGER = Section(
    name="ledger",
    shape="mapping",
    model=LedgerConfig,
    description="The deduplication ledger that keeps forwarding from delivering a message twice.",
    keys=(
        Key(
            "retention",
            "duration",
            "How long a forwarded message id is remembered.",
            example="7d",
            default=7 * 24 * 3600.0,
            **_POSITIVE,
        ),
        Key(
            "cleanup_interval",
            "duration",
            "How often expired ledger entries are deleted.",
            example="1m",
            default=60.0,
            **_POSITIVE,
        ),
        Key(
            "cleanup",
            "boolean",
            "Whether this bridge deletes expired ledger entries at all.",
            example=True,
            default=True,
        ),
    ),
)

LOGGING = Section(
    name="logging",
    shape="mapping",
    model=LoggingConfig,
    description="Log output.",
    keys=(
        Key(
            "level",
            "choice",
            "Least severe level that is logged.",
            example="INFO",
            default="INFO",
            choices=("DEBUG", "INFO", "WARNING", "ERROR"),
            case_insensitive=True,
        ),
    ),
)

SENTRY = Section(
    name="sentry",
    shape="mapping",
    model=SentryConfig,
    description="Error reporting to Sentry; an empty or absent `dsn` disables it.",
    keys=(
        Key(
            "dsn",
            "string",
            "Sentry DSN; `${VAR}` is expanded; empty means no Sentry.",
            example="${SENTRY_DSN:-}",
            default=None,
            expand_env=True,
            secret=True,
            empty_is_none=True,
            # Only the shape: sentry-sdk checks the rest when it starts, with its own message.
            pattern=r"https?://[^\s@/]+@[^\s/]+/\S+",
            pattern_message="is not a Sentry DSN: expected https://<key>@<host>/<project>",
        ),
        Key(
            "environment",
            "string",
            "Environment name attached to Sentry events; empty means none.",
            example="production",
            default=None,
            empty_is_none=True,
        ),
    ),
)

SCHEMA: Final[tuple[Section, ...]] = (
    DATABASES,
    FORWARDERS,
    ROUTES,
    SUBSCRIPTIONS,
    SUBSCRIPTION_TABLES,
    PUBLISH,
    RETRIES,
    INSTALL,
    LEDGER,
    LOGGING,
    SENTRY,
)


def section(name: str) -> Section:
    """The top-level section called `name`; raises KeyError when there is none."""
    for candidate in SCHEMA:
        if candidate.name == name:
            return candidate
    raise KeyError(name)


# --------------------------------------------------------------------------------------------
# Topics
# --------------------------------------------------------------------------------------------


def topic_problem(topic: str) -> str | None:
    """What is wrong with `topic` as a topic (an event type's full name), or None if nothing.

    The message does not quote the topic: it goes with a key path that does.

    Rejects empty names, leading or trailing whitespace, unbalanced brackets and an assembly
    part (`Shared.OrderSubmitted, Shared`): only a comma outside brackets starts one, since a
    generic type's arguments are assembly-qualified inside its brackets
    (``Shared.Envelope`1[[Shared.Order, Shared, Version=1.0.0.0]]``).
    """
    if not topic.strip():
        return "a topic must not be empty"
    if topic != topic.strip():
        return f"has leading or trailing whitespace; write {topic.strip()!r}"
    depth = 0
    for index, char in enumerate(topic):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                break
        elif char == "," and depth == 0:
            type_name, assembly = topic[:index].strip(), topic[index + 1 :].strip()
            return (
                f"names an assembly ({assembly!r}); a topic is the event type's full name "
                f"without the assembly part: write {type_name!r}"
            )
    if depth != 0:
        return "has unbalanced '[' and ']'"
    return None


# --------------------------------------------------------------------------------------------
# Durations
# --------------------------------------------------------------------------------------------

_UNIT_SECONDS: Final[Mapping[str, float]] = {
    "d": 86400.0,
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 0.001,
}
_UNIT_ORDER: Final = ("d", "h", "m", "s", "ms")
# `ms` must come before `m` so that "500ms" is not read as "500m" followed by junk.
_DURATION_PART = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)(ms|d|h|m|s)")
DURATION_FORMS: Final = (
    "a number of seconds (10, 1.5) or a string of <number><unit> parts with units "
    "ms, s, m, h, d in that order, largest first, such as '500ms', '10s', '1.5s', '2m', "
    "'1h', '7d' or '1h30m'"
)


def parse_duration(value: object) -> float:
    """Convert a duration from the config file to seconds.

    Given an int or float (seconds) or a string such as "500ms", "10s", "1.5s", "2m", "1h",
    "7d" or "1h30m" (units largest first, each at most once, optional spaces between parts).
    Returns the duration in seconds as a float. Raises ValueError, naming the accepted forms,
    for anything else, including booleans, unit-less strings, negative and non-finite numbers.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"expected a duration: {DURATION_FORMS}; got {type(value).__name__}")
    if isinstance(value, int | float):
        seconds = float(value)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"invalid duration {value!r}: must be a finite number of seconds >= 0")
        return seconds
    return _parse_duration_text(value)


def _parse_duration_text(text: str) -> float:
    shown = text if len(text) <= 40 else text[:37] + "..."
    invalid = ValueError(f"invalid duration {shown!r}: expected {DURATION_FORMS}")
    total = 0.0
    position = 0
    last_rank = -1
    stripped = text.rstrip()
    while position < len(stripped):
        match = _DURATION_PART.match(stripped, position)
        if match is None:
            raise invalid
        rank = _UNIT_ORDER.index(match.group(2))
        if rank <= last_rank:
            # "30m1h" or "1m1m" is almost certainly a typo; refuse rather than guess.
            raise invalid
        last_rank = rank
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    if last_rank < 0:
        raise invalid
    return total


def format_duration(seconds: float) -> str:
    """Render `seconds` in the config file's duration syntax, e.g. 5400.0 -> "1h30m".

    Given a finite number >= 0; returns the shortest exact combination of units that
    `parse_duration` reads back, falling back to seconds with decimals ("1.25s").
    """
    if seconds == 0:
        return "0s"
    millis = round(seconds * 1000)
    if not math.isclose(millis, seconds * 1000, abs_tol=1e-6):
        return f"{seconds:g}s"
    parts: list[str] = []
    for unit in _UNIT_ORDER:
        size = round(_UNIT_SECONDS[unit] * 1000)
        count, millis = divmod(millis, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


# --------------------------------------------------------------------------------------------
# Documentation
# --------------------------------------------------------------------------------------------


def _format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def describe_type(key: Key) -> str:
    """Human-readable type and allowed values of `key`, e.g. "integer, 1..64"."""
    if key.type == "choice":
        choices = [c for c in key.choices if c not in key.unavailable]
        text = "one of " + ", ".join(f"`{c}`" for c in choices)
        if key.case_insensitive:
            text += " (any case)"
        if key.unavailable:
            later = ", ".join(f"`{c}`" for c in key.unavailable)
            text += f" ({later}: not available yet)"
        return text
    if key.type == "address":
        return "queue address"
    if key.type == "topic":
        return "type full name"
    if key.type in ("integer", "duration"):
        low, high = key.minimum, key.maximum
        if low is not None and high is not None:
            bounds = f"{_format_number(low)}..{_format_number(high)}"
            if key.type == "duration":
                bounds = f"{format_duration(low)}..{format_duration(high)}"
            return f"{key.type}, {bounds}"
        if low is not None:
            sign = ">" if key.exclusive_minimum else "≥"
            return f"{key.type} {sign} {_format_number(low)}"
        return key.type
    if key.type == "string" and key.pattern == NAME_PATTERN:
        return f"string matching `{key.pattern}`"
    return key.type


def describe_default(key: Key) -> str:
    """The default of `key` as it would be written in the file, or "required"."""
    if key.required:
        if key.dialects:
            return f"required for {', '.join(key.dialects)}"
        return "**required**"
    if key.default is None:
        return "none"
    if key.type == "duration" and isinstance(key.default, int | float):
        return f"`{format_duration(float(key.default))}`"
    if isinstance(key.default, bool):
        return f"`{str(key.default).lower()}`"
    return f"`{key.default}`"


def _describe_example(key: Key) -> str:
    if isinstance(key.example, bool):
        return f"`{str(key.example).lower()}`"
    return f"`{key.example}`"


def _section_heading(sec: Section) -> str:
    if sec.shape == "multimap" and sec.name_key is not None:
        return f"`{sec.name}.<{sec.name_key.name}>`"
    if sec.shape == "named":
        return f"`{sec.name}.<name>`"
    if sec.shape == "list":
        return f"`{sec.name}[]`"
    return f"`{sec.name}`"


def _escape_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(sec: Section) -> list[tuple[str, str, str, str, str]]:
    """The cells of the reference table of `sec`: key, type, default, description, example."""
    if sec.shape == "multimap":
        # One row for the entry names, one for the values of their lists.
        assert sec.name_key is not None and sec.items is not None
        name = f"<{sec.name_key.name}>"
        return [
            (
                f"`{name}`",
                describe_type(sec.name_key),
                "—",
                sec.name_key.description,
                _describe_example(sec.name_key),
            ),
            (
                f"`{name}[]`",
                "non-empty list; each a " + describe_type(sec.items),
                "—",
                sec.items.description,
                _describe_example(sec.items),
            ),
        ]
    rows = []
    for key in sec.keys:
        description = key.description
        if key.dialects and not key.required:
            description += f" Only for {', '.join(key.dialects)}."
        cells = (
            f"`{key.name}`",
            describe_type(key),
            describe_default(key),
            description,
            _describe_example(key),
        )
        rows.append(cells)
    return rows


def render_reference_markdown(heading_level: int = 2) -> str:
    """Render the configuration reference as Markdown.

    Given the heading level of the title (2: `##`, sections one level deeper). Returns the
    reference: an introduction to value syntax (durations, `${VAR}`), then one table per
    section with each key's name, type and allowed values, default, description and example.
    """
    title = "#" * heading_level
    sub = "#" * (heading_level + 1)
    lines = [
        f"{title} Configuration reference",
        "",
        "The configuration is one YAML file. Unknown keys are errors; `null` or an omitted "
        "optional key means its default. All problems are reported at once.",
        "",
        "- **Durations** are seconds (`10`, `1.5`) or number-and-unit parts with units `ms`, "
        "`s`, `m`, `h`, `d`, largest first: `500ms`, `10s`, `1.5s`, `2m`, `1h`, `7d`, `1h30m`.",
        "- **`${VAR}`** in `connection`, `path` and `sentry.dsn` is replaced by the environment "
        "variable `VAR` (an error if it is not set); `${VAR:-default}` uses `default` when it is "
        "unset or empty; `$$` is a literal `$`.",
        "- **Queue addresses** are a table name or an address in the database's dialect "
        '(PostgreSQL `"schema"."table"`, SQL Server `table@[schema]@[catalog]`, SQLite '
        "`table`).",
        "- **Booleans** are `true` / `false` (YAML also reads `yes` / `no`).",
        "",
    ]
    for sec in SCHEMA:
        required = "Required" if sec.required else "Optional"
        if sec.min_items:
            required += f", at least {sec.min_items} {sec.entry}"
            required += "s" if sec.min_items > 1 else ""
        lines += [
            f"{sub} {_section_heading(sec)}",
            "",
            f"{sec.description} *{required}.*",
            "",
            "| Key | Type | Default | Description | Example |",
            "| --- | --- | --- | --- | --- |",
        ]
        for cells in _rows(sec):
            lines.append("| " + " | ".join(_escape_cell(cell) for cell in cells) + " |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_reference_markdown(heading_level=3))
