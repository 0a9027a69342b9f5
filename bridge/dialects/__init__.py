"""SQL dialects: one module per database family (`postgresql`, `sqlserver`, `sqlite`).

Each module defines `DIALECT`: its SQL text, identifier quoting and value encoding, its queue
address grammar, its capabilities, how to connect, and which server errors mean what.
`registry` finds them; adding a dialect is adding a module.
"""

from bridge.dialects.base import STATEMENT_NAMES, Dialect
from bridge.dialects.registry import dialect_for, dialect_names, grammar_for

__all__ = ["STATEMENT_NAMES", "Dialect", "dialect_for", "dialect_names", "grammar_for"]
