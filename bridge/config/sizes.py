"""Sizes in the configuration file (`batch_bytes`): `parse_size` reads `512KiB`, `8MiB`, `1GiB`
or a plain number of bytes; `format_size` writes a number of bytes back the same way."""

from __future__ import annotations

import re
from typing import Final

__all__ = ["SIZE_FORMS", "format_size", "parse_size"]

_UNITS: Final = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB)?\s*")
SIZE_FORMS: Final = "a number of bytes or a number with B, KiB, MiB or GiB, such as '8MiB'"


def parse_size(value: object) -> int:
    """Bytes in `value` (an int, or a string like '8MiB'). Raises ValueError saying what is
    wrong; decimal units (KB, MB) are refused rather than guessed."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size, {SIZE_FORMS}")
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a size, {SIZE_FORMS}")
    match = _SIZE.fullmatch(value)
    if match is None:
        hint = ""
        if re.fullmatch(r"\s*\d+(\.\d+)?\s*[kKmMgG][bB]?\s*", value):
            hint = " (sizes are binary: write KiB, MiB or GiB)"
        raise ValueError(f"{value!r} is not a size: expected {SIZE_FORMS}{hint}")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit or ""])


def format_size(size: float) -> str:
    """`8388608` -> `8MiB`; sizes that are no whole number of a unit stay in bytes."""
    for unit in ("GiB", "MiB", "KiB"):
        if size >= _UNITS[unit] and size % _UNITS[unit] == 0:
            return f"{int(size // _UNITS[unit])}{unit}"
    return f"{int(size)}B"
