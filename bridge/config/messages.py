"""How validation messages name keys, values and near misses, so that every check words them
alike: key paths (`routes[2].database`), YAML types ("an integer (5)") and "did you mean"."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

__all__ = ["describe_value", "join_path", "suggestion"]


def join_path(path: str, key: str) -> str:
    """The key path of `key` inside the mapping at `path` ("" for the top level)."""
    return f"{path}.{key}" if path else key


def describe_value(value: object, secret: bool = False) -> str:
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


def suggestion(word: object, candidates: Iterable[str]) -> str:
    """`" (did you mean 'x'?)"` for the closest candidate, or "" when none is close."""
    if not isinstance(word, str):
        return ""
    pool = list(candidates)
    matches = difflib.get_close_matches(word, pool, n=1, cutoff=0.6)
    if not matches:
        # Catch case-only differences that difflib scores too low for short words.
        matches = [c for c in pool if c.lower() == word.lower()][:1]
    return f" (did you mean {matches[0]!r}?)" if matches else ""
