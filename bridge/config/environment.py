"""Environment variables in configuration values: `${VAR}`, `${VAR:-default}` and `$$`.

Only keys marked `expand_env` in the schema are expanded (`connection`, `path`, `sentry.dsn`).
Their syntax is checked when the file is loaded, every value of them; a variable that is not
set makes the value `Unresolved` instead, which is an error only where it is used: a command
that opens that database (`bridge.connections.connect`), or the daemon, which needs them all.
So `sfbridge status` runs with the secrets of the databases it reads, not every secret.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from bridge.exceptions import UnsetVariable

__all__ = [
    "ENVIRONMENT_FILE",
    "Expansion",
    "Unresolved",
    "expand_env",
    "expand_references",
    "unset_variable_advice",
]

_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Where the shipped unit (`systemd/sfbridge.service`, `EnvironmentFile=`) reads the variables
# the configuration names; `tests/unit/config/test_environment.py` holds the two together.
ENVIRONMENT_FILE = "/etc/sfbridge/sfbridge.env"

# What stands for an unset variable in `Unresolved.partial`: no environment variable and no
# connection string holds a NUL.
UNSET_MARK = "\x00"


@dataclass(frozen=True)
class Expansion:
    """`text` with every reference replaced (an unset variable by `UNSET_MARK`), the names of
    the variables that were not set, in order, once each, and the syntax errors."""

    text: str
    unset: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Unresolved:
    """A value (at `key_path`, e.g. `databases.receiver.connection`) that names environment
    variables that were not set when the configuration was loaded.

    `partial` is the value with the variables that were set expanded and each unset one as
    `UNSET_MARK`: what the parts that need none of them say (the database a connection string
    opens). It may hold a secret, so it is in no repr and never shown.
    """

    key_path: str
    variables: tuple[str, ...]
    partial: str = field(repr=False, compare=False)

    def error(self, database: str, doing: str = "cannot connect") -> UnsetVariable:
        """The error to raise where database `database` needs the value (`doing`: what
        cannot be done without it)."""
        return UnsetVariable(
            database,
            self.variables,
            self.key_path,
            advice=unset_variable_advice(self.variables),
            doing=doing,
        )


def unset_variable_advice(variables: tuple[str, ...]) -> str:
    """Where the service gets `variables` and how to give a shell the same: a subshell that
    reads the unit's EnvironmentFile, so that the secrets neither stay in the shell nor appear
    on a command line (`env $(cat FILE)` would show them to every user, in `ps`)."""
    them = "it" if len(variables) == 1 else "them"
    return (
        f"sfbridge.service reads {them} from {ENVIRONMENT_FILE} (EnvironmentFile=; add {them} "
        f"there if missing); in a shell, as root or sfbridge: (set -a; . {ENVIRONMENT_FILE}; "
        "set +a; sfbridge ...)"
    )


def expand_env(text: str, environ: Mapping[str, str]) -> tuple[str, list[str]]:
    """`expand_references` with an unset variable as one more error: the expanded text and
    the error messages (empty when all went well)."""
    expansion = expand_references(text, environ)
    errors = list(expansion.errors)
    errors += [f"environment variable {name} is not set" for name in expansion.unset]
    return expansion.text, errors


def expand_references(text: str, environ: Mapping[str, str]) -> Expansion:
    """Expand `${VAR}`, `${VAR:-default}` and `$$` in `text`.

    Given the raw value and the environment. `${VAR}` with VAR unset is listed in `unset`
    (and stands as `UNSET_MARK`); `${VAR:-default}` uses the literal `default` when VAR is
    unset or empty; `$$` is a literal `$`; any other `$` is an error, so that a shell-style
    `$VAR` is not silently taken literally. Error messages name variables and positions but
    never quote the text, which may hold a password.
    """
    pieces: list[str] = []
    errors: list[str] = []
    unset: dict[str, None] = {}
    index = 0
    while index < len(text):
        char = text[index]
        if char != "$":
            pieces.append(char)
            index += 1
            continue
        following = text[index + 1 : index + 2]
        if following == "$":
            pieces.append("$")
            index += 2
            continue
        if following != "{":
            errors.append(
                f"'$' at character {index + 1} does not start ${{VAR}} or ${{VAR:-default}}; "
                "write $$ for a literal '$'"
            )
            index += 1
            continue
        end = text.find("}", index + 2)
        if end < 0:
            errors.append(f"unterminated '${{' at character {index + 1}")
            break
        name, has_default, default = text[index + 2 : end].partition(":-")
        if not _VARIABLE_NAME.fullmatch(name):
            errors.append(
                f"invalid environment variable reference at character {index + 1}; "
                "expected ${NAME} or ${NAME:-default} with NAME made of letters, digits and '_'"
            )
        elif has_default:
            pieces.append(environ.get(name) or default)
        elif name in environ:
            pieces.append(environ[name])
        else:
            unset[name] = None
            pieces.append(UNSET_MARK)
        index = end + 1
    return Expansion("".join(pieces), tuple(unset), tuple(errors))
