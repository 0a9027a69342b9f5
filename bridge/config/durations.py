"""Durations in the configuration file: `parse_duration` reads them, `format_duration` writes
them back in the same syntax (for messages and the reference)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Final

__all__ = ["DURATION_FORMS", "format_duration", "parse_duration"]

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
