"""PostgreSQL connection strings read as libpq parameters. Pure: no driver is imported.

The configured `connection` of a PostgreSQL database is an ODBC-style string
(`Server=h1,h2;Port=5432;Uid=...;target_session_attrs=read-write`) or a libpq URL
(`postgresql://h1,h2/db?target_session_attrs=read-write`). Both drivers hand the server
part to libpq in the end: psycopg directly (`libpq_parameters`), psqlODBC through its own
keys and its `pqopt={...}` option, which it passes to libpq as written (`odbc_connection_string`).

Why this matters for failover: a key one of them does not know is ignored without a word by
that driver (psqlODBC ignores `target_session_attrs=read-write` outside `pqopt`, and psycopg
would drop a key this module did not pass), and the connection then lands on a standby. So every
libpq parameter passes, in either driver, and what cannot pass is refused by name
(`connection_problems`, at config load and again when connecting).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from bridge.drivers.odbc import parse_connection_string

__all__ = [
    "LIBPQ_KEYWORDS",
    "ConnectionProblem",
    "connection_problems",
    "libpq_parameters",
    "odbc_connection_string",
    "parse_conninfo",
    "render_conninfo",
]

# Every libpq connection parameter (PostgreSQL 18,
# https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-PARAMKEYWORDS).
LIBPQ_KEYWORDS = frozenset(
    {
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "password",
        "passfile",
        "require_auth",
        "channel_binding",
        "connect_timeout",
        "client_encoding",
        "options",
        "application_name",
        "fallback_application_name",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
        "replication",
        "gssencmode",
        "sslmode",
        "requiressl",
        "sslnegotiation",
        "sslcompression",
        "sslcert",
        "sslkey",
        "sslkeylogfile",
        "sslpassword",
        "sslcertmode",
        "sslrootcert",
        "sslcrl",
        "sslcrldir",
        "sslsni",
        "requirepeer",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "min_protocol_version",
        "max_protocol_version",
        "krbsrvname",
        "gsslib",
        "gssdelegation",
        "service",
        "target_session_attrs",
        "load_balance_hosts",
        "oauth_issuer",
        "oauth_client_id",
        "oauth_client_secret",
        "oauth_scope",
    }
)

# ODBC names of libpq parameters (psqlODBC reads these itself and gives them to libpq).
_ODBC_ALIASES = {
    "server": "host",
    "servername": "host",
    "uid": "user",
    "username": "user",
    "pwd": "password",
    "database": "dbname",
    "applicationname": "application_name",
}
# The keys psqlODBC reads itself (by these names, any case): everything else of libpq must
# reach it through `pqopt`. Its own options, which mean nothing to libpq, are `_PSQLODBC_OPTIONS`.
_PSQLODBC_READS = frozenset(
    {"server", "servername", "port", "uid", "username", "pwd", "password", "database", "sslmode"}
)
_PSQLODBC_OPTIONS = frozenset(
    {
        "driver",
        "dsn",
        "filedsn",
        "savefile",
        "description",
        "readonly",
        "protocol",
        "fakeoidindex",
        "showoidcolumn",
        "rowversioning",
        "showsystemtables",
        "fetch",
        "unknownsizes",
        "maxvarcharsize",
        "maxlongvarcharsize",
        "debug",
        "commlog",
        "usedeclarefetch",
        "textaslongvarchar",
        "unknownsaslongvarchar",
        "boolsaschar",
        "parse",
        "extrasystableprefixes",
        "lfconversion",
        "updatablecursors",
        "trueisminus1",
        "bi",
        "byteaaslongvarbinary",
        "useserversideprepare",
        "lowercaseidentifier",
        "gssauthusegss",
        "keepalivetime",
        "keepaliveinterval",
        "xaopt",
        "connsettings",
        "batchsize",
        "ignoretimeout",
        "fetchrefcursors",
        "optionalerrors",
        "numericasdouble",
        "pqopt",
    }
)
# psqlODBC's abbreviated option names (A0..A9, B0..B9, C0..C9, CX, D4, ...).
_PSQLODBC_ABBREVIATION = re.compile(r"[abcd][0-9x]")
# Keys the bridge sets itself, from keys of its own: given in the string they are refused.
_SET_BY_THE_BRIDGE = {
    "connect_timeout": (
        "set the database's connect_timeout key instead: it is libpq's connect_timeout (the wait "
        "for each host in turn)"
    ),
    "replication": "remove it: the bridge needs an ordinary session, not a replication one",
}
# libpq's conninfo grammar: key = value, the value bare or in single quotes with \ escapes.
_CONNINFO_PAIR = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*('(?:[^'\\]|\\.)*'|[^\s']*)")


@dataclass(frozen=True)
class ConnectionProblem:
    """What is wrong with a connection string, one key at a time: never its value (the string
    holds a password). `error` refuses the configuration; otherwise it is a warning."""

    key: str
    message: str
    error: bool = True


def is_url(connection_string: str) -> bool:
    """Whether `connection_string` is a libpq URL rather than an ODBC-style string."""
    return connection_string.strip().startswith(("postgresql://", "postgres://"))


def parse_conninfo(text: str) -> list[tuple[str, str]]:
    """libpq's `key=value key='quoted value'` form as (key, value) pairs, values unquoted.
    Raises ValueError naming the position of what is not such a pair (never the text)."""
    pairs: list[tuple[str, str]] = []
    position = 0
    text = text.strip()
    while position < len(text):
        match = _CONNINFO_PAIR.match(text, position)
        if match is None:
            raise ValueError(f"not a key=value pair at character {position + 1}")
        key, value = match.group(1), match.group(2)
        if value.startswith("'"):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        pairs.append((key.lower(), value))
        position = match.end()
        while position < len(text) and text[position].isspace():
            position += 1
    return pairs


def render_conninfo(parameters: dict[str, str]) -> str:
    """`parameters` in libpq's `key=value` form, quoting the values that need it."""
    parts = []
    for key, value in parameters.items():
        if value == "" or re.search(r"[\s'\\]", value):
            value = "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
        parts.append(f"{key}={value}")
    return " ".join(parts)


def _unbraced(value: str) -> str:
    value = value.strip()
    if value.startswith("{") and value.endswith("}"):
        return value[1:-1].replace("}}", "}")
    return value


def _libpq_name(key: str) -> str | None:
    """The libpq parameter an ODBC-style key stands for, None for any other key."""
    lowered = key.strip().lower()
    if lowered in LIBPQ_KEYWORDS:
        return lowered
    return _ODBC_ALIASES.get(lowered)


def _pqopt(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The libpq parameters in the string's `pqopt={...}` (ValueError if it is not conninfo)."""
    found: list[tuple[str, str]] = []
    for key, value in pairs:
        if key.strip().lower() == "pqopt":
            found.extend(parse_conninfo(_unbraced(value)))
    return found


def libpq_parameters(connection_string: str) -> dict[str, str]:
    """libpq parameters from an ODBC-style connection string (`Server=h1,h2;Port=5432;
    Uid=...;Pwd=...;Database=...;target_session_attrs=read-write;`), for psycopg: every
    libpq parameter by its own name or its ODBC one (`Server`, `Uid`, `Pwd`, `Database`), and
    those in psqlODBC's `pqopt={...}`; psqlODBC's own options are left out. A libpq URL
    (`postgresql://...`) is given back as `{"conninfo": URL}`. Braces around a value are
    removed (`Pwd={a;b}`). What `connection_problems` refuses is not checked here."""
    if is_url(connection_string):
        return {"conninfo": connection_string.strip()}
    pairs = parse_connection_string(connection_string.strip())
    parameters: dict[str, str] = {}
    for key, value in pairs:
        name = _libpq_name(key)
        if name is not None:
            parameters[name] = _unbraced(value)
    try:
        parameters.update(_pqopt(pairs))
    except ValueError:
        pass  # refused by connection_problems
    return parameters


def odbc_connection_string(connection_string: str, defaults: dict[str, str]) -> str:
    """The string for psqlODBC: the libpq parameters psqlODBC does not read itself
    (`target_session_attrs`, `load_balance_hosts`, `hostaddr`, ...) and host and port lists
    (`Server=h1,h2;Port=5432,5433`) moved into its `pqopt`, which also gets `defaults` (libpq
    parameters) where the string sets none of them."""
    pairs = parse_connection_string(connection_string.strip())
    try:
        given = _pqopt(pairs)
    except ValueError:
        given = []  # refused by connection_problems
    moved: list[tuple[str, str]] = []
    kept: list[tuple[str, str]] = []
    for key, value in pairs:
        lowered = key.strip().lower()
        if lowered == "pqopt":
            continue
        if lowered in LIBPQ_KEYWORDS and lowered not in _PSQLODBC_READS:
            moved.append((lowered, _unbraced(value)))
        elif lowered in ("server", "servername", "port") and "," in value:
            # psqlODBC keeps a Port of at most 9 characters (`5433,5434` and no more: a longer
            # list reaches libpq cut short) and passes what it has as an option of its own,
            # which pqopt may not repeat: lists go to libpq through pqopt alone.
            moved.append((_ODBC_ALIASES.get(lowered, lowered), _unbraced(value)))
        else:
            kept.append((key, value))
    named = {key for key, _ in [*given, *moved]}
    options = {
        **{key: value for key, value in defaults.items() if key not in named},
        **dict(given),
        **dict(moved),
    }
    pqopt = render_conninfo(options).replace("}", "}}")
    kept.append(("pqopt", "{" + pqopt + "}"))
    return ";".join(f"{key}={value}" for key, value in kept) + ";"


def connection_problems(connection_string: str, driver: str) -> list[ConnectionProblem]:
    """What the PostgreSQL `driver` (`psycopg` or `odbc`) would not do as this connection
    string says, key by key: a key the bridge sets itself (`connect_timeout`) or that breaks
    it (`replication`), a key given twice (outside `pqopt` and in it), a `pqopt` that is not
    libpq's `key=value` form or names no libpq parameter; and, as warnings, keys that are
    neither libpq's nor psqlODBC's (psycopg ignores them: often a misspelt libpq key).
    A libpq URL is libpq's own business: nothing is checked."""
    if is_url(connection_string):
        return []
    problems: list[ConnectionProblem] = []
    pairs = parse_connection_string(connection_string.strip())
    try:
        in_pqopt = _pqopt(pairs)
    except ValueError as error:
        problems.append(
            ConnectionProblem(
                "pqopt", f"is not libpq's key=value form ({error}): e.g. pqopt={{a=1 b=2}}"
            )
        )
        in_pqopt = []
    seen: dict[str, str] = {}
    for key, _value in pairs:
        shown = key.strip()
        name = _libpq_name(shown)
        if name is None:
            lowered = shown.lower()
            if lowered in _PSQLODBC_OPTIONS or _PSQLODBC_ABBREVIATION.fullmatch(lowered):
                continue
            problems.append(_unknown_key(shown, driver))
            continue
        if name in seen:
            problems.append(ConnectionProblem(shown, f"says again what {seen[name]} says"))
        seen[name] = shown
    for key, _ in in_pqopt:
        if key not in LIBPQ_KEYWORDS:
            problems.append(_unknown_key(key, driver, where="pqopt: "))
        elif key in seen:
            problems.append(
                ConnectionProblem(
                    f"pqopt: {key}", f"is given outside pqopt too (as {seen[key]}): keep one"
                )
            )
        else:
            seen[key] = f"pqopt: {key}"
    for name, shown in seen.items():
        advice = _SET_BY_THE_BRIDGE.get(name)
        if advice is not None:
            problems.append(ConnectionProblem(shown, f"is not taken from the connection; {advice}"))
    return problems


def _unknown_key(key: str, driver: str, where: str = "") -> ConnectionProblem:
    close = difflib.get_close_matches(key.lower(), sorted(LIBPQ_KEYWORDS), n=1, cutoff=0.75)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if where:  # inside pqopt, libpq itself refuses it: so does the bridge
        return ConnectionProblem(f"{where}{key}", f"is not a libpq parameter{hint}")
    ignored = "psycopg ignores it" if driver == "psycopg" else "psqlODBC ignores it"
    return ConnectionProblem(
        key, f"is neither a libpq parameter nor a psqlODBC option{hint}: {ignored}", error=False
    )
