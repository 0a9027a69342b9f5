"""What the bridge's login lacks to create its own tables, and the exact GRANT that gives it.

The bridge creates a table as `bridge.storage.tables.create_tables` does: the schema first
when it does not exist (which takes the right to create schemas in the database: PostgreSQL's
CREATE on the database), then the table (the right to create tables in that schema). A schema
that exists is never created again, so the database right is not asked for then. `check`, the
daemon and `install` all ask this module, so they agree on what a login may do.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from bridge.dialects import Dialect
from bridge.drivers import Connection
from bridge.exceptions import DatabaseError


@dataclass(frozen=True)
class MissingRight:
    """`what` the login may not do (a phrase), and `grant`: the statement that allows it
    (empty where the dialect grants no rights in SQL)."""

    what: str
    grant: str

    def advice(self) -> str:
        """What to tell a person: the GRANT, or the DDL for a DBA."""
        if not self.grant:
            return f"the bridge's login may not {self.what}"
        return (
            f"the bridge's login may not {self.what}: have a DBA run {self.grant} (or create "
            "the table with the DDL from 'sfbridge install --print-sql' and grant the login "
            "SELECT, INSERT, UPDATE and DELETE on it)"
        )


def missing_create_right(
    connection: Connection, dialect: Dialect, schema: str | None
) -> MissingRight | None:
    """None when the login may create a table in `schema` as the bridge would (creating the
    schema first if it is missing); else what it lacks. Reads only; `connection` must have
    no transaction open and has none afterwards. Raises the DatabaseError family."""
    try:
        if dialect.has_schemas and schema:
            exists = _one(connection, dialect.sql("schema_exists"), (schema,))
            if not exists:
                if _one(connection, dialect.sql("can_create_schemas"), ()):
                    return None  # its own schema: it may create tables there
                return _missing(connection, dialect, "create_schemas", schema)
        if _one(connection, dialect.sql("can_create_tables"), (schema or "",)):
            return None
        return _missing(connection, dialect, "create_tables", schema)
    finally:
        connection.rollback()


def lacking_right(
    connection: Connection, dialect: Dialect, schemas: Iterable[str | None]
) -> MissingRight | None:
    """The first right the login lacks to create tables in `schemas`; None when it lacks none
    or that cannot be read (the caller then says what it knows). Never raises."""
    try:
        connection.rollback()
        for schema in dict.fromkeys(schemas):
            lacking = missing_create_right(connection, dialect, schema)
            if lacking is not None:
                return lacking
    except DatabaseError:
        pass
    return None


def _missing(
    connection: Connection, dialect: Dialect, right: str, schema: str | None
) -> MissingRight:
    login, database = connection.query(dialect.sql("current_login"))[0]
    quote = dialect.grammar.quote_identifier
    if right == "create_schemas":
        what = f"create schema {quote(schema or '')} in database {quote(str(database))}"
    else:
        what = f"create tables in schema {quote(schema or '')}"
    template = dialect.grants.get(right, "")
    grant = template.format(
        login=quote(str(login)), schema=quote(schema or ""), database=quote(str(database))
    )
    return MissingRight(what, grant + ";" if grant else "")


def _one(connection: Connection, statement: str, parameters: tuple[object, ...]) -> bool:
    rows = connection.query(statement, parameters)
    return bool(rows and rows[0][0])
