"""What a dedicated login of the bridge needs in each database, and `install --print-grants`:
the statements a DBA runs to create that login with no more.

The needs come from the configuration alone (no database is read): the bridge's own tables
(`bridge.storage.tables`, the dedup ledgers), the destination queues routes name outright and
proxies deliver to (INSERT, and the sequences an insert uses), the subscription tables
(SELECT). Queues behind a glob cannot be listed before messages name them; the script says so
and gives the schema-wide form as a comment. `sfbridge check` (`bridge.commands.check_login`)
compares the same needs with what the login holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

from bridge.addressing import TableAddress
from bridge.config.catalogs import database_catalog
from bridge.config.model import BridgeConfig, RouteConfig
from bridge.dialects import Dialect, dialect_for
from bridge.drivers.odbc import parse_connection_string
from bridge.exceptions import AddressError, UnsetVariable
from bridge.forwarding.proxies import proxy_destination
from bridge.routing import Destination, destination_of, first_matching_route
from bridge.secrets import inert
from bridge.storage.ledger import ledger_databases, ledger_steps
from bridge.storage.tables import forwarder_table_steps

# The rights on a table of the bridge's own: rows are claimed with `SELECT ... FOR UPDATE SKIP
# LOCKED`, which PostgreSQL allows only with UPDATE, and deleted; the ledger is never updated.
OWN_TABLE_RIGHTS = ("SELECT", "INSERT", "UPDATE", "DELETE")
LEDGER_RIGHTS = ("SELECT", "INSERT", "DELETE")
# The bridge only adds rows to an endpoint's queue. SELECT is not needed (with it, rows are
# streamed with COPY, which reads the column types first), so the script leaves it out and
# `check` does not count it as too much.
DESTINATION_RIGHTS = ("INSERT",)
NOT_TOO_MUCH_ON_DESTINATIONS = frozenset({"INSERT", "SELECT"})
DEFAULT_LOGIN = "sfbridge"


@dataclass(frozen=True)
class TableNeed:
    """The `rights` the login needs on `table`, and why (`what`). `own`: a table of the
    bridge (the login may own it); `ddl`: its CREATE statement(s), to find its sequences."""

    table: TableAddress
    rights: tuple[str, ...]
    what: str
    own: bool
    ddl: str = ""


@dataclass(frozen=True)
class GlobRoute:
    """A route whose queues are known only from the messages: `routes[index]`."""

    index: int
    match: str
    schema: str | None


@dataclass
class DatabaseNeeds:
    """Everything the login needs in one configured database."""

    name: str
    tables: list[TableNeed] = field(default_factory=list)
    globs: list[GlobRoute] = field(default_factory=list)

    def add(self, need: TableNeed) -> None:
        """Add `need`, once per table (the first reason stays)."""
        if all(known.table != need.table for known in self.tables):
            self.tables.append(need)

    @property
    def own_schemas(self) -> list[str | None]:
        """The schemas of the bridge's own tables here, in order."""
        return list(dict.fromkeys(need.table.schema for need in self.tables if need.own))

    @property
    def schemas(self) -> list[str | None]:
        """Every schema the login reaches here."""
        schemas = [need.table.schema for need in self.tables]
        return list(dict.fromkeys(schemas + [glob.schema for glob in self.globs]))


def needs_of(config: BridgeConfig) -> dict[str, DatabaseNeeds]:
    """What the login needs, per configured database (every database, in config order)."""
    needs = {name: DatabaseNeeds(name) for name in config.databases}
    for forwarder in config.forwarders:
        for step in forwarder_table_steps(config, forwarder):
            if step.table is not None and not step.optional:
                needs[forwarder.database].add(
                    TableNeed(
                        step.table,
                        OWN_TABLE_RIGHTS,
                        step.description,
                        True,
                        ";\n".join(step.statements),
                    )
                )
    for name in ledger_databases(config):
        for step in ledger_steps(config, name):
            if step.table is not None:
                needs[name].add(TableNeed(step.table, LEDGER_RIGHTS, step.description, True))
    for destination, what in destination_queues(config):
        dialect = dialect_for(config.databases[destination.database].dialect)
        ddl = dialect.sql("create_queue", queue=destination.address)
        needs[destination.database].add(
            TableNeed(destination.address, DESTINATION_RIGHTS, what, False, ddl)
        )
    for table in config.subscription_tables:
        database = config.databases[table.database]
        grammar = dialect_for(database.dialect).grammar
        address = grammar.resolve(grammar.parse(table.table), database.schema, None)
        needs[table.database].add(TableNeed(address, ("SELECT",), "subscription table", False))
    for index, route in enumerate(config.routes):
        if _is_glob(route.match):
            for schema in _route_schemas(config, route):
                needs[route.database].globs.append(GlobRoute(index, route.match, schema))
    return needs


def destination_queues(config: BridgeConfig) -> Iterator[tuple[Destination, str]]:
    """(Destination, why) for each queue the configuration names outright: a route's `match`
    without glob characters (unless an earlier route matches it first), a proxy's
    destination."""
    for route in config.routes:
        if _is_glob(route.match) or first_matching_route(route.match, config.routes) is not route:
            continue
        target = config.databases[route.database]
        # The database's default schema, and each one the route lets an address name.
        for schema in (None, *(() if route.schema else route.schemas)):
            try:
                destination = destination_of(
                    TableAddress(route.match, schema),
                    target,
                    target,
                    route,
                    default_transaction=config.delivery.transaction,
                )
            except AddressError:
                continue  # `check` reports it
            yield destination, f"destination queue of route '{route.match}'"
    for forwarder in config.forwarders:
        try:
            fixed = proxy_destination(config, forwarder)
        except AddressError:
            continue
        if fixed is not None:
            yield fixed, f"destination queue of proxy '{forwarder.name}'"


def _is_glob(match: str) -> bool:
    return any(character in match for character in "*?[")


def _route_schemas(config: BridgeConfig, route: RouteConfig) -> list[str | None]:
    """The schemas a route's queues may be in: its `schema`, else the database's default and
    the route's `schemas` (`bridge.routing.resolve_for_target`)."""
    database = config.databases[route.database]
    grammar = dialect_for(database.dialect).grammar
    default = grammar.resolve(TableAddress("queue"), route.schema or database.schema, None).schema
    if route.schema or default is None:
        return [default]
    return list(dict.fromkeys([default, *route.schemas]))


def configured_login(config: BridgeConfig, name: str) -> str | None:
    """The user name the connection string of database `name` logs in as, if it says (also
    when a variable it names is not set: the user name seldom needs one)."""
    connection = _connection_text(config, name)
    if connection.startswith(("postgresql://", "postgres://")):
        user = urlparse(connection).username
        return unquote(user) if user else None
    for key, value in parse_connection_string(connection):
        if key.strip().lower() in ("uid", "user", "user id", "username"):
            return value.strip().strip("{}") or None
    return None


def _connection_text(config: BridgeConfig, name: str) -> str:
    """The connection string of database `name`, with any unset variable left a mark
    (`Unresolved.partial`); read here for names only, never shown."""
    database = config.databases[name]
    if database.unresolved is not None:
        return database.unresolved.partial
    return database.connection or ""


def server_database(config: BridgeConfig, name: str) -> str | None:
    """The name the server knows database `name` by (`Database=` or the URL's path)."""
    database = config.databases[name]
    try:
        catalog = database_catalog(database)
    except UnsetVariable:
        catalog = None  # its connection string is one variable, which is not set
    if catalog:
        return catalog
    connection = _connection_text(config, name)
    if connection.startswith(("postgresql://", "postgres://")):
        return unquote(urlparse(connection).path.lstrip("/")) or None
    for key, value in parse_connection_string(connection):
        if key.strip().lower() in ("database", "dbname"):
            return value.strip().strip("{}") or None
    return None


def render_grants(
    config: BridgeConfig, login: str | None = None, *, login_creates_tables: bool = False
) -> str:
    """The script of `install --print-grants`: per dialect, the login once per server; per
    database, its statements, commented. `login`: the login's name (default: the one each
    connection string names, else sfbridge)."""
    needs = needs_of(config)
    lines = [
        "-- The least a dedicated login of sfbridge needs (sfbridge install --print-grants).",
        *(_LOGIN_CREATES if login_creates_tables else _DBA_CREATES),
        "",
    ]
    created: set[tuple[str, str]] = set()
    for name, database_needs in needs.items():
        dialect = dialect_for(config.databases[name].dialect)
        user = login or configured_login(config, name) or DEFAULT_LOGIN
        lines.append(f"-- ===== database: {name} ({dialect.name}) =====")
        if not dialect.grants:
            lines.append(
                f"-- {dialect.title} has no logins and nothing to grant: whoever may write the "
                "file may write every table in it. Give the file and its folder to the "
                "bridge's system user alone (mode 0600 / 0700)."
            )
            lines.append("")
            continue
        quote = dialect.grammar.quote_identifier
        if (dialect.name, user) not in created and "create_login" in dialect.grants:
            created.add((dialect.name, user))
            lines.append(f"-- Once per {dialect.title} server (the login belongs to the server):")
            lines.append(_statement(dialect, "create_login", login=quote(user)))
            if "login_note" in dialect.grants:
                lines.append("-- " + dialect.grants["login_note"].format(login=quote(user)))
        lines.extend(
            _database_lines(config, dialect, database_needs, quote(user), login_creates_tables)
        )
        lines.append("")
    return "\n".join(lines)


_DBA_CREATES = (
    "-- The login creates nothing: a DBA first creates the bridge's tables as their owner with",
    "-- the DDL of 'sfbridge install --print-sql', then runs this; set install.at_runtime: false",
    "-- (a table dropped later is then re-created by the DBA, not by the daemon).",
    "-- Or: 'sfbridge install --print-grants --login-creates-tables', where the login may create",
    "-- (and owns) the bridge's tables in their schemas, as 'sfbridge install' and the daemon do.",
)
_LOGIN_CREATES = (
    "-- The login creates (and owns) the bridge's tables itself: run this, then",
    "-- 'sfbridge install' as the login. It may create tables in the bridge's schemas, so it",
    "-- could create others there too; without --login-creates-tables it creates nothing.",
)


def _database_lines(
    config: BridgeConfig,
    dialect: Dialect,
    needs: DatabaseNeeds,
    login: str,
    login_creates_tables: bool,
) -> list[str]:
    quote = dialect.grammar.quote_identifier
    server_name = server_database(config, needs.name)
    lines: list[str] = []
    if "use_catalog" in dialect.grants and server_name:
        lines.append(_statement(dialect, "use_catalog", catalog=quote(server_name)))
    if "create_user" in dialect.grants:
        lines.append(_statement(dialect, "create_user", login=login))
    if "connect" in dialect.grants:
        if server_name:
            lines.append(_statement(dialect, "connect", database=quote(server_name), login=login))
        else:
            lines.append("-- (the connection string names no database: grant CONNECT on it)")
    if login_creates_tables:
        for schema in needs.own_schemas:
            if schema and "create_schema" in dialect.grants and schema != _default_schema(dialect):
                lines.append(_statement(dialect, "create_schema", schema=quote(schema)))
    if "use_schema" in dialect.grants:
        for schema in needs.schemas:
            if schema:
                lines.append(_statement(dialect, "use_schema", schema=quote(schema), login=login))
    if login_creates_tables:
        for schema in needs.own_schemas:
            grant = dialect.grants["create_tables"].format(
                schema=quote(schema or ""), login=login, database=quote(server_name or "")
            )
            lines.append("-- The bridge's own tables, created by the login itself:")
            lines.append(grant + ";")
    current = None
    for need in needs.tables:
        if need.own and login_creates_tables:
            continue
        title = _OWN_TABLES if need.own else "Tables of the endpoints:"
        if title != current:
            current = title
            lines.append(f"-- {title}")
        lines.extend(_table_lines(dialect, need, login))
    for glob in needs.globs:
        lines.extend(_glob_lines(dialect, glob, login))
    if dialect.pushes and any(f.database == needs.name for f in config.forwarders):
        lines.append("-- Push (LISTEN, and the triggers' NOTIFY) needs no right of its own.")
    return lines


_OWN_TABLES = (
    "The bridge's own tables (UPDATE also for the claims' row locks, SELECT ... FOR UPDATE):"
)


def _table_lines(dialect: Dialect, need: TableNeed, login: str) -> list[str]:
    grammar = dialect.grammar
    table = grammar.qualified_name(TableAddress(need.table.table, need.table.schema))
    lines = [f"-- {inert(need.what)}"]  # a route's match may hold a line break
    lines.append(
        _statement(dialect, "rights", rights=", ".join(need.rights), table=table, login=login)
    )
    if "INSERT" in need.rights and dialect.serial_sequences and "use_sequence" in dialect.grants:
        for sequence in dialect.serial_sequences(need.table, need.ddl):
            lines.append(
                _statement(
                    dialect,
                    "use_sequence",
                    sequence=grammar.qualified_name(TableAddress(sequence.table, sequence.schema)),
                    login=login,
                )
            )
    return lines


def _glob_lines(dialect: Dialect, glob: GlobRoute, login: str) -> list[str]:
    quote = dialect.grammar.quote_identifier
    lines = [
        f"-- routes[{glob.index}] (match {glob.match!r}): its queues cannot be listed before "
        "messages name them.",
        "-- Grant INSERT on each one it should reach, as above; or, on every table of the schema",
        "-- (the endpoints' and the bridge's, those there now but not later ones), run:",
    ]
    if "schema_insert" in dialect.grants:
        form = dialect.grants["schema_insert"].format(schema=quote(glob.schema or ""), login=login)
        lines.extend(f"-- {part.strip()};" for part in form.split(";"))
    return lines


def _default_schema(dialect: Dialect) -> str | None:
    return dialect.grammar.resolve(TableAddress("queue"), None, None).schema


def _statement(dialect: Dialect, name: str, **values: str) -> str:
    return dialect.grants[name].format(**values) + ";"
