"""Making text safe to show: credentials masked, control characters made inert.

Connection strings and Sentry DSNs carry passwords and keys. Anything the bridge shows a human
about them goes through `mask_secrets` first, so a typo in a config file never ends up pasting a
production password into a bug report.

Messages carry text their senders wrote. Anything the CLI prints from a message (headers, a
body's text, an Id, an error that quotes either) goes through `inert` (or `for_terminal`,
which masks as well), so that nothing a sender writes can move the cursor, clear the screen,
retitle the terminal, start a line of its own or reorder what is shown.
"""

from __future__ import annotations

import re

__all__ = ["MASK", "for_terminal", "inert", "mask_secrets"]

MASK = "***"

# A key=value pair whose key names a credential: ODBC `PWD=` / `Password=`, libpq `password=`,
# URL query `?password=`, `SSLPassword=`, `api_key=`, `sentry_secret=` ... The key must start at
# a token boundary so that e.g. `Uid=pwdadmin` is not mistaken for a key.
# `PublicKeyToken=` is not a secret: it is part of every strong-named .NET type name, and
# masking it would mangle event types and topics in messages.
_SECRET_KEY = re.compile(
    r"(?<![\w.-])(?!publickeytoken\s*=)"
    r"[\w.-]*(?:pwd|passwd|password|secret|token|api_?key|sentry_key)\s*=\s*",
    re.IGNORECASE,
)

# `scheme://userinfo@`. The userinfo runs up to the LAST `@` of the whitespace/quote-delimited
# token: passwords are often not percent-encoded and may contain `@`, `/` or `:`, and masking a
# little too much (part of a host) is harmless while masking too little leaks.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s'\"]*)@")

# A URL user name that is really a key (Sentry DSN public keys are 32 hex digits); ordinary user
# names such as `postgres` stay visible because they help diagnose connection problems.
_KEY_LIKE_USER = re.compile(r"[0-9a-fA-F]{16,}|[A-Za-z0-9_-]{24,}")


# What a terminal acts on rather than shows: C0 controls (line breaks and tabs included: a
# line break would let a sender start a line that reads as the tool's own), DEL, C1 controls
# (ECMA-48 reads U+009B as CSI), Unicode's line and paragraph separators, and the bidirectional
# formatting characters, which reorder what follows them on the line.
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def inert(text: str) -> str:
    """`text` with every control character a terminal would act on written as an escape
    (ESC as `\\x1b`, a carriage return as `\\x0d`, a right-to-left override as `\\u202e`):
    one line, shown as it is, whatever it holds.
    Printable text, non-ASCII letters included, is left alone. Never raises."""
    return _CONTROL.sub(_escape, text)


def for_terminal(text: str) -> str:
    """`text` with credentials masked and control characters escaped (`mask_secrets`, then
    `inert`): what any message data printed on a terminal goes through."""
    return inert(mask_secrets(text))


def mask_secrets(text: str) -> str:
    """Return `text` with every password, secret key or token replaced by `***`.

    Given any text (a connection string, a URL, a message quoting either). Handles ODBC/libpq
    `key=value` pairs whose key names a password (case-insensitive; ODBC `{braced;values}` with
    `}}` escapes, quoted values), URL query parameters, and the userinfo of URLs such as
    `postgresql://user:pass@host` and Sentry DSNs (`https://public:secret@host/1`; a key-like
    public key is masked too). Idempotent; never raises. Errs on the side of masking more.
    """
    return _mask_urls(_mask_key_values(text))


def _mask_key_values(text: str) -> str:
    pieces: list[str] = []
    position = 0
    while True:
        match = _SECRET_KEY.search(text, position)
        if match is None:
            break
        # In a URL query the value ends at `&`; elsewhere (ODBC) an unbraced value runs to `;`
        # and may legitimately contain `&` or spaces, so only `;` or a line break ends it.
        in_query = match.start() > 0 and text[match.start() - 1] in "?&"
        end = _value_end(text, match.end(), in_query)
        pieces.append(text[position : match.end()])
        pieces.append(MASK)
        position = end
    pieces.append(text[position:])
    return "".join(pieces)


def _value_end(text: str, start: int, in_query: bool) -> int:
    """Index just past the value that begins at `start`."""
    if start >= len(text):
        return start
    opener = text[start]
    if opener == "{":
        # ODBC braced value: `}}` is an escaped `}`; an unterminated brace runs to the end.
        index = start + 1
        while index < len(text):
            if text[index] == "}":
                if text.startswith("}}", index):
                    index += 2
                    continue
                return index + 1
            index += 1
        return len(text)
    if opener in "'\"":
        # libpq-style quoted value with backslash escapes.
        index = start + 1
        while index < len(text):
            if text[index] == "\\":
                index += 2
                continue
            if text[index] == opener:
                return index + 1
            index += 1
        return len(text)
    terminators = "&#; \t\r\n" if in_query else ";\r\n"
    index = start
    while index < len(text) and text[index] not in terminators:
        index += 1
    return index


def _mask_urls(text: str) -> str:
    def replace(match: re.Match[str]) -> str:
        userinfo = match.group("userinfo")
        user, colon, _password = userinfo.partition(":")
        if colon:
            if _KEY_LIKE_USER.fullmatch(user):
                user = MASK
            return f"{match.group('scheme')}{user}:{MASK}@"
        if userinfo != MASK and _KEY_LIKE_USER.fullmatch(userinfo):
            return f"{match.group('scheme')}{MASK}@"
        return match.group(0)

    return _URL_USERINFO.sub(replace, text)
