"""The cross-key check of connection strings: what a database's driver would not do as its
`connection` says (`Dialect.connection_problems`), reported before anything connects.

A key a driver ignores is how failover breaks without a word (the connection lands on a
standby), so a key the bridge refuses is an error and one nobody knows a warning. Messages
name keys only: the value of `connection` is secret.
"""

from __future__ import annotations

from bridge.config.messages import join_path
from bridge.config.problems import ProblemLog
from bridge.config.walker import Document
from bridge.dialects.registry import dialects

__all__ = ["check_connection_strings"]


def check_connection_strings(document: Document, log: ProblemLog) -> None:
    """Report each database's connection string problems, at `databases.<name>.connection`.
    A string that names unset variables is checked when it is connected with."""
    known = dialects()
    for entry in document.databases.values():
        connection = entry.values.get("connection")
        dialect = known.get(str(entry.values.get("dialect")))
        if not isinstance(connection, str) or dialect is None:
            continue
        if dialect.connection_problems is None:
            continue
        path = join_path(entry.path, "connection")
        for problem in dialect.connection_problems(connection, entry.values.get("driver")):
            report = log.error if problem.error else log.warning
            report(path, f"{problem.key} {problem.message}")
