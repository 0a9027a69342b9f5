"""SQL dialects: each dialect's SQL text, identifier quoting and value encoding in one place."""

from bridge.dialects.base import STATEMENT_NAMES, Dialect, dialect_for

__all__ = ["STATEMENT_NAMES", "Dialect", "dialect_for"]
