"""Checking and converting one configuration value against its `Key`.

Strings are `${VAR}`-expanded where the key allows it (a variable that is not set makes the
value `Unresolved`, an error only where it is used) and matched against its pattern, numbers
and durations are range-checked (with a warning outside a key's usual range), choices are
normalised; every problem goes to the `ProblemLog`, worded without echoing secrets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from bridge.config.durations import format_duration, parse_duration
from bridge.config.environment import Unresolved, expand_references
from bridge.config.keys import Key
from bridge.config.listen import parse_listen
from bridge.config.messages import describe_value, suggestion
from bridge.config.problems import ProblemLog
from bridge.config.sizes import format_size, parse_size
from bridge.config.topics import topic_problem

__all__ = ["INVALID", "ValueConverter"]

# What `ValueConverter.convert` returns for a value it rejected (and reported).
INVALID: Final = object()
# A password given literally in an ODBC connection string (not via ${VAR}).
_LITERAL_PASSWORD = re.compile(r"(?:^|;)\s*(?:pwd|password)\s*=\s*(?P<value>[^;]*)", re.I)
# The same in a libpq URL: postgresql://user:PASSWORD@host/db, or ?password=PASSWORD.
_URL_PASSWORD = re.compile(
    r"^\s*postgres(?:ql)?://(?:[^:@/?#]*:(?P<value>[^@/?#]*)@"
    r"|[^?#]*\?(?:[^#]*&)?password=(?P<query>[^&#]*))",
    re.I,
)


def _type_hint(value: object) -> str:
    if isinstance(value, bool):
        return "; YAML reads unquoted yes/no/on/off/true/false as booleans, quote the value"
    if isinstance(value, int | float):
        return "; quote the value if it is meant as text"
    return ""


class ValueConverter:
    """Converts single non-null values for their keys, expanding `${VAR}` from `environ` and
    reporting what is wrong to `log`."""

    def __init__(self, environ: Mapping[str, str], log: ProblemLog) -> None:
        self.environ = environ
        self.log = log

    def convert(self, key: Key, value: object, path: str) -> object:
        """Check and convert one non-null value; returns `INVALID` after reporting."""
        if key.type in ("string", "address"):
            return self._convert_string(key, value, path)
        if key.type == "integer":
            return self._convert_integer(key, value, path)
        if key.type == "boolean":
            if isinstance(value, bool):
                return value
            self.log.error(path, f"expected true or false, got {describe_value(value)}")
            return INVALID
        if key.type == "duration":
            return self._convert_duration(key, value, path)
        if key.type == "topic":
            return self._convert_topic(value, path)
        if key.type == "listen":
            return self._convert_listen(value, path)
        if key.type == "size":
            return self._convert_size(key, value, path)
        if key.type == "names":
            return self._convert_names(value, path)
        return self._convert_choice(key, value, path)

    def _convert_names(self, value: object, path: str) -> object:
        """A list of non-blank names, as a tuple (duplicates dropped)."""
        if not isinstance(value, list):
            hint = f"; write [{value}]" if isinstance(value, str) else ""
            self.log.error(path, f"expected a list of names, got {describe_value(value)}{hint}")
            return INVALID
        names: list[str] = []
        for index, item in enumerate(value):
            if not isinstance(item, str) or not item.strip():
                self.log.error(
                    f"{path}[{index}]", f"expected a non-empty name, got {describe_value(item)}"
                )
                return INVALID
            names.append(item)
        return tuple(dict.fromkeys(names))

    def _convert_size(self, key: Key, value: object, path: str) -> object:
        try:
            size = parse_size(value)
        except ValueError as error:
            self.log.error(path, str(error))
            return INVALID
        if not self._in_range(key, size, path, format_size(size)):
            return INVALID
        return size

    def _convert_listen(self, value: object, path: str) -> object:
        if not isinstance(value, str):
            hint = "; quote it" if isinstance(value, int | float) else ""
            self.log.error(
                path, f"expected HOST:PORT as a string, got {describe_value(value)}{hint}"
            )
            return INVALID
        try:
            host, port = parse_listen(value)
        except ValueError as error:
            self.log.error(path, str(error))
            return INVALID
        if host in ("0.0.0.0", "::"):
            self.log.warning(
                path,
                f"serves /metrics on every network interface: whoever reaches this host on "
                f"port {port} reads the names of forwarders, databases and queues and the "
                "message counts (never connection strings or message data). Listen on "
                f"127.0.0.1:{port} or a management network's address, or firewall the port",
            )
        return value.strip()

    def _convert_topic(self, value: object, path: str) -> object:
        if not isinstance(value, str):
            self.log.error(path, f"expected a string, got {describe_value(value)}")
            return INVALID
        problem = topic_problem(value)
        if problem is not None:
            self.log.error(path, problem)
            return INVALID
        return value

    def _convert_string(self, key: Key, value: object, path: str) -> object:
        if key.numbers_as_text and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            self.log.error(
                path,
                f"expected a string, got {describe_value(value, key.secret)}{_type_hint(value)}",
            )
            return INVALID
        text = value
        if key.expand_env:
            expansion = expand_references(value, self.environ)
            for message in expansion.errors:
                self.log.error(path, message)
            if expansion.errors:
                return INVALID
            if key.secret:
                self._check_literal_password(value, path)
            if expansion.unset:
                # An error only where the value is used (see bridge.config.environment).
                return Unresolved(path, expansion.unset, expansion.text)
            text = expansion.text
        elif key.secret:
            self._check_literal_password(value, path)
        if not text.strip():
            if key.empty_is_none:
                return None
            after = " after expanding environment variables" if text != value else ""
            self.log.error(path, f"must not be empty{after}")
            return INVALID
        if key.pattern and not re.fullmatch(key.pattern, text):
            shown = "" if key.secret else f"{text!r} "
            self.log.error(path, f"{shown}{key.pattern_message or 'is not valid'}")
            return INVALID
        return text

    def _check_literal_password(self, raw: str, path: str) -> None:
        url = _URL_PASSWORD.match(raw)
        found = [match.group("value") for match in _LITERAL_PASSWORD.finditer(raw)]
        if url:
            found.append(url.group("value") or url.group("query") or "")
        for value in found:
            if value.strip() and "${" not in value:
                self.log.warning(
                    path,
                    "contains a password in plain text; put it in the environment and write "
                    "${VARIABLE} instead",
                )
                return

    def _convert_integer(self, key: Key, value: object, path: str) -> object:
        if isinstance(value, bool) or not isinstance(value, int):
            hint = "; remove the quotes" if isinstance(value, str) else ""
            self.log.error(path, f"expected an integer, got {describe_value(value)}{hint}")
            return INVALID
        if not self._in_range(key, value, path, str(value)):
            return INVALID
        return value

    def _convert_duration(self, key: Key, value: object, path: str) -> object:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            self.log.error(
                path,
                "expected a duration such as '10s' or a number of seconds, got "
                f"{describe_value(value)}",
            )
            return INVALID
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            self.log.error(path, str(exc))
            return INVALID
        if not self._in_range(key, seconds, path, format_duration(seconds)):
            return INVALID
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
                self.log.warning(path, f"{format_duration(seconds)} is {usual}{hint}")
        return seconds

    def _in_range(self, key: Key, number: float, path: str, shown: str) -> bool:
        low, high = key.minimum, key.maximum
        fmt = {"duration": format_duration, "size": format_size}.get(key.type, lambda n: f"{n:g}")
        too_low = low is not None and (number <= low if key.exclusive_minimum else number < low)
        too_high = high is not None and number > high
        if not (too_low or too_high):
            return True
        if low is not None and high is not None:
            self.log.error(path, f"must be between {fmt(low)} and {fmt(high)}, got {shown}")
        elif low is not None:
            relation = "greater than" if key.exclusive_minimum else "at least"
            self.log.error(path, f"must be {relation} {fmt(low)}, got {shown}")
        else:
            self.log.error(path, f"must be at most {fmt(high or 0)}, got {shown}")
        return False

    def _convert_choice(self, key: Key, value: object, path: str) -> object:
        available = [choice for choice in key.choices if choice not in key.unavailable]
        expected = ", ".join(available)
        if not isinstance(value, str):
            self.log.error(path, f"expected one of {expected}, got {describe_value(value)}")
            return INVALID
        normal = value.upper() if key.case_insensitive else value
        if normal in key.unavailable:
            self.log.error(
                path,
                f"{key.name} {value!r} is not available in this version (available: {expected})",
            )
            return INVALID
        if normal not in key.choices:
            hint = suggestion(normal, available)
            self.log.error(path, f"{value!r} is not one of {expected}{hint}")
            return INVALID
        return normal
