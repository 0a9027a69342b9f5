"""What the bridge's login lacks to create its own tables, and the exact GRANT that gives it.

The bridge creates a table as `bridge.storage.tables.create_tables` does: the schema first
when it does not exist (which takes the right to create schemas in the database: PostgreSQL's
CREATE on the database), then the table (the right to create tables in that schema). A schema
that exists is never created again, so the database right is not asked for then. `check`, the
daemon and `install` all ask this module, so they agree on what a login may do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bridge.addressing import TableAddress
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


def missing_insert_right(
    connection: Connection, dialect: Dialect, table: TableAddress
) -> MissingRight | None:
    """What the login lacks to write rows into the queue `table`: INSERT on it, and on
    PostgreSQL USAGE on the sequence of a serial column (the transport's `Seq`), with the
    GRANTs that give it; None when it lacks none, or that cannot be read (a permission denied
    for another reason, such as a row-level security policy). Reads only, inside whatever
    transaction `connection` has (a batch's source transaction, for a queue of the forwarding
    database): the caller ends it. Never raises."""
    rendered = dialect.grammar.render(table)
    qualified = dialect.grammar.qualified_name(table)
    try:
        allowed, lacking = _insert_rights(connection, dialect, qualified)
        if allowed and not lacking:
            return None
        login = connection.query(dialect.sql("current_login"))[0][0]
    except DatabaseError:
        return None
    login_name = dialect.grammar.quote_identifier(str(login))
    insert = dialect.grants.get("insert", "")
    use = dialect.grants.get("use_sequence", "")
    grants = [] if allowed or not insert else [insert.format(table=qualified, login=login_name)]
    grants += [use.format(sequence=name, login=login_name) for name in lacking if use]
    return MissingRight(f"write rows into {rendered}", "; ".join(grants) + ";" if grants else "")


def _insert_rights(
    connection: Connection, dialect: Dialect, qualified: str
) -> tuple[bool, list[str]]:
    """(whether the login may INSERT into the table, the sequences an insert uses that it may
    not). Raises the DatabaseError family."""
    allowed, sequences = connection.query(dialect.sql("can_insert"), (qualified,))[0]
    return bool(allowed), [name for name in str(sequences or "").split("\n") if name]


def lacking_table_rights(
    connection: Connection, dialect: Dialect, table: TableAddress, needed: Sequence[str]
) -> MissingRight | None:
    """What the login lacks of the rights `needed` on `table` (and, with INSERT, the
    sequences an insert uses), with the GRANTs; None when it lacks none, or where that cannot
    be read (the table missing: reported as such elsewhere). Never raises."""
    held = table_rights(connection, dialect, table)
    if held is None:
        return None
    qualified = dialect.grammar.qualified_name(table)
    lacking = [right for right in needed if right not in held]
    sequences: list[str] = []
    if "INSERT" in needed:
        try:
            sequences = _insert_rights(connection, dialect, qualified)[1]
        except DatabaseError:
            pass
        finally:
            connection.rollback()
    if not lacking and not sequences:
        return None
    try:
        login = dialect.grammar.quote_identifier(
            str(connection.query(dialect.sql("current_login"))[0][0])
        )
    except DatabaseError:
        return None
    finally:
        connection.rollback()
    grants = []
    if lacking and "rights" in dialect.grants:
        grants.append(
            dialect.grants["rights"].format(rights=", ".join(lacking), table=qualified, login=login)
        )
    use = dialect.grants.get("use_sequence", "")
    grants += [use.format(sequence=name, login=login) for name in sequences if use]
    what = ", ".join(lacking + [f"USAGE on sequence {name}" for name in sequences])
    return MissingRight(f"{what} on {qualified}", "; ".join(grants) + ";" if grants else "")


@dataclass(frozen=True)
class LoginPowers:
    """What the login of one connection may do beyond any table's rights: `powers` as
    phrases ("superuser", "CREATEDB", "member of pg_write_all_data"), `severe` when it is a
    superuser (SQL Server: sysadmin or db_owner), `login` its name."""

    login: str
    powers: tuple[str, ...]
    severe: bool


def login_powers(connection: Connection, dialect: Dialect) -> LoginPowers | None:
    """The powers of `connection`'s login; None where the dialect has no logins (SQLite).
    `connection` must have no transaction open and has none afterwards. Raises the
    DatabaseError family."""
    if "login_powers" not in dialect.statements:
        return None
    try:
        rows = connection.query(dialect.sql("login_powers"))
        login = str(connection.query(dialect.sql("current_login"))[0][0])
    finally:
        connection.rollback()
    return LoginPowers(
        login, tuple(str(row[0]) for row in rows), any(int(row[1] or 0) for row in rows)
    )


@dataclass(frozen=True)
class OwnedObject:
    """Something the login owns: `kind` (database, schema, table), its schema, its name."""

    kind: str
    schema: str | None
    name: str


def owned_objects(connection: Connection, dialect: Dialect) -> list[OwnedObject]:
    """What the login owns in the database; none where the dialect has no owners. Same
    transaction rules and errors as `login_powers`."""
    if "owned_objects" not in dialect.statements:
        return []
    try:
        rows = connection.query(dialect.sql("owned_objects"))
    finally:
        connection.rollback()
    return [
        OwnedObject(str(kind), schema and str(schema), str(name)) for kind, schema, name in rows
    ]


def table_rights(
    connection: Connection, dialect: Dialect, table: TableAddress
) -> frozenset[str] | None:
    """The rights the login holds on `table` (granted to it, a role of it or PUBLIC); None
    where the dialect has none or the table cannot be asked about (missing). Never raises."""
    if "table_rights" not in dialect.statements:
        return None
    try:
        rows = connection.query(
            dialect.sql("table_rights"), (dialect.grammar.qualified_name(table),)
        )
        return frozenset(str(row[0]) for row in rows)
    except DatabaseError:
        return None
    finally:
        connection.rollback()
