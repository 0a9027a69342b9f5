"""What the `servicecontrol` section needs beyond its keys: its database is a configured one
that ServiceControl can use (a server dialect), and its queue an address in that database's
grammar; `servicecontrol_queue` resolves that address for the daemon."""

from __future__ import annotations

from bridge.addressing import AddressGrammar, TableAddress
from bridge.config.messages import join_path, suggestion
from bridge.config.problems import ProblemLog
from bridge.config.walker import Document
from bridge.dialects.registry import dialects, grammar_for
from bridge.exceptions import AddressError

__all__ = ["DEFAULT_QUEUE", "check_servicecontrol", "servicecontrol_queue"]

# The input queue of a ServiceControl instance with the default name (its `InstanceName`).
DEFAULT_QUEUE = "Particular.ServiceControl"


def servicecontrol_queue(
    grammar: AddressGrammar, queue: str | None, default_schema: str | None
) -> TableAddress:
    """The queue `queue` (None: `DEFAULT_QUEUE`, a table whose name holds a dot) resolved in
    `grammar` with the database's default schema. Raises AddressError."""
    text = grammar.quote_identifier(DEFAULT_QUEUE) if queue is None else queue
    return grammar.resolve(grammar.parse(text), default_schema, None)


def check_servicecontrol(document: Document, log: ProblemLog) -> None:
    """The section's `database` names a postgresql or sqlserver database, and its `queue`
    parses in that database's grammar."""
    entry = document.mappings.get("servicecontrol")
    if entry is None or "database" not in entry.values:
        return
    name = entry.values["database"]
    path = join_path(entry.path, "database")
    database = document.databases.get(name)
    if database is None:
        known = sorted(document.database_names)
        hint = suggestion(name, known) or (f" (databases: {', '.join(known)})" if known else "")
        log.error(path, f"no database named {name!r}{hint}")
        return
    dialect = dialects().get(database.values.get("dialect") or "")
    if dialect is None:
        return
    if dialect.locator != "connection":
        log.error(
            path,
            f"database {name!r} is {dialect.name}, which ServiceControl cannot read: its "
            "input queue is in the SQL Server or PostgreSQL database of its transport",
        )
        return
    try:
        servicecontrol_queue(
            grammar_for(dialect.name), entry.values.get("queue"), database.values.get("schema")
        )
    except AddressError as error:
        log.error(join_path(entry.path, "queue"), f"invalid {dialect.name} queue address: {error}")
