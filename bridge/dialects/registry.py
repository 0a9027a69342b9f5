"""The dialects the bridge knows: every module of this package that defines `DIALECT`.

Nothing lists the dialects by hand. A module `bridge/dialects/<name>.py` whose `DIALECT` is a
`Dialect` named `<name>` is found the first time any dialect is asked for, and from then on it
is a choice of the config's `dialect` key, has its address grammar, opens its connections and
answers the capability questions the rest of the bridge asks.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from functools import cache
from types import MappingProxyType

from bridge.addressing import AddressGrammar
from bridge.dialects.base import Dialect

__all__ = ["dialect_for", "dialect_names", "dialects", "grammar_for"]

# The package searched: this module's own (bridge.dialects).
_PACKAGE = __name__.rpartition(".")[0]


@cache
def dialects() -> Mapping[str, Dialect]:
    """Every dialect, by name, sorted by name.

    Imports each module of the package once (modules without `DIALECT`, such as `base`, are
    skipped). Raises TypeError for a `DIALECT` that is not a Dialect and ValueError when two
    modules define dialects of the same name.
    """
    package = importlib.import_module(_PACKAGE)
    found: dict[str, Dialect] = {}
    origins: dict[str, str] = {}
    for module_info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module_name = f"{_PACKAGE}.{module_info.name}"
        dialect = getattr(importlib.import_module(module_name), "DIALECT", None)
        if dialect is None:
            continue
        if not isinstance(dialect, Dialect):
            raise TypeError(f"{module_name}.DIALECT is a {type(dialect).__name__}, not a Dialect")
        if dialect.name in found:
            raise ValueError(
                f"two modules define the dialect {dialect.name!r}: "
                f"{origins[dialect.name]} and {module_name}"
            )
        found[dialect.name] = dialect
        origins[dialect.name] = module_name
    return MappingProxyType(dict(sorted(found.items())))


def dialect_names() -> tuple[str, ...]:
    """The names of every dialect, sorted: the choices of the config's `dialect` key."""
    return tuple(dialects())


def dialect_for(name: str) -> Dialect:
    """The Dialect for a configured dialect name. Raises KeyError for unknown names."""
    try:
        return dialects()[name]
    except KeyError:
        available = ", ".join(dialect_names())
        raise KeyError(f"no dialect named {name!r} (available: {available})") from None


def grammar_for(dialect: str) -> AddressGrammar:
    """The address grammar of `dialect` (e.g. "postgresql"). Raises KeyError for unknown names."""
    try:
        return dialects()[dialect].grammar
    except KeyError:
        known = ", ".join(dialect_names())
        raise KeyError(f"unknown SQL dialect {dialect!r}; expected one of: {known}") from None
