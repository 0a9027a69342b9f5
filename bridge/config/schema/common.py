"""What every section of the schema shares: the dialects and what they need, names, hints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from bridge.config.keys import Key
from bridge.config.model import (
    TRANSACTION_MODES,
)
from bridge.dialects.registry import dialects

# Every dialect module in bridge/dialects (the registry finds them), and what they need.
DIALECTS: Final = tuple(dialects())
# Dialects with a working driver in this version; any other would be recognised (so the message
# can say "not available yet" instead of "unknown") but rejected.
IMPLEMENTED_DIALECTS: Final = DIALECTS
# Located by an ODBC connection string / by a file path; with schemas / without.
SERVER_DIALECTS: Final = tuple(n for n, d in dialects().items() if d.locator == "connection")
FILE_DIALECTS: Final = tuple(n for n, d in dialects().items() if d.locator == "path")
SCHEMA_DIALECTS: Final = tuple(n for n, d in dialects().items() if d.has_schemas)
# Dialects whose addresses name catalogs (databases on the server).
CATALOG_DIALECTS: Final = tuple(n for n, d in dialects().items() if d.has_catalogs)
# Dialects whose databases can be opened with more than one driver, and every such driver.
DRIVER_DIALECTS: Final = tuple(n for n, d in dialects().items() if len(d.drivers) > 1)
DRIVERS: Final = tuple(dict.fromkeys(x for d in dialects().values() for x in d.drivers))
# Dialects whose databases may sit behind a connection pooler (the `pooler` key).
POOLER_DIALECTS: Final = tuple(n for n, d in dialects().items() if d.poolers)


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


# --------------------------------------------------------------------------------------------
# The schema
# --------------------------------------------------------------------------------------------

_POSITIVE: Final[dict[str, Any]] = {"minimum": 0, "exclusive_minimum": True}


def _transaction_key(description: str, default: str | None = None) -> Key:
    return Key(
        "transaction",
        "choice",
        description,
        example="two-phase",
        choices=TRANSACTION_MODES,
        default=default,
    )
