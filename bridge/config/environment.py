"""Environment variables in configuration values: `${VAR}`, `${VAR:-default}` and `$$`.

Only keys marked `expand_env` in the schema are expanded (`connection`, `path`, `sentry.dsn`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["expand_env"]

_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def expand_env(text: str, environ: Mapping[str, str]) -> tuple[str, list[str]]:
    """Expand `${VAR}`, `${VAR:-default}` and `$$` in `text`.

    Given the raw value and the environment. Returns the expanded text and a list of error
    messages (empty when all went well). `${VAR}` with VAR unset is an error; `${VAR:-default}`
    uses the literal `default` when VAR is unset or empty; `$$` is a literal `$`; any other `$`
    is an error, so that a shell-style `$VAR` is not silently taken literally. Messages name
    variables and positions but never quote the text, which may hold a password.
    """
    pieces: list[str] = []
    errors: list[str] = []
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
            errors.append(f"environment variable {name} is not set")
        index = end + 1
    return "".join(pieces), errors
