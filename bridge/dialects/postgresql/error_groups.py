"""PostgreSQL's statements for `sfbridge errors summary` and `errors list`: an error queue
grouped in the database, its rows counted, and chosen rows read by sequence value.

`error_queue_groups` counts the rows per `NServiceBus.FailedQ` and the values of two headers
(the grouping's: bound by name, the same one twice where a grouping reads one), with the least
and greatest time of failure among those written as wire dates (which sort as text, compared
byte by byte: `COLLATE "C"`), every other time-of-failure text, and, apart, the rows it cannot
group as the tools read them (`readable` false: headers that are not a JSON object of string
or null values), by sequence value: `bridge.commands.error_groups` reads those rows itself, so
a poison row is counted where the tools count it (reason `poison`, `(none)` otherwise).

It casts every Headers value to jsonb, which fails the whole statement (22P02, 22P05) when one
is not JSON at all; `error_queue_groups_checked` is then asked instead: the same, casting only
the rows a pattern proves castable (a JSON object of string or null values, without the
escapes jsonb refuses, `\\u0000` and lone surrogates), the others unreadable. The pattern costs
a second pass over the text, so it is the fallback, not the rule. Both patterns write `"` as
`\\x22` and have no `?` (see `error_queue_failed_queues` in statements.py).
"""

from __future__ import annotations

# A value that is not a string or null in a JSON object that parsed: a key's closing quote,
# the colon, then something else. A quote inside a string is escaped (`\"`), so text that
# looks like this inside a value only sends the row to be read by the tools, never the
# other way round.
_NOT_A_STRING = r"\x22[ \t\n\r]*:[ \t\n\r]*[^ \t\n\r\x22n]"

_WS = r"[ \t\n\r]*"
_HEX = "[0-9a-fA-F]"
# `\uXXXX` but for `\u0000` and the surrogates D800-DFFF, which jsonb refuses alone.
_ESCAPE = (
    rf"\\([\x22\\/bfnrt]|u(0{_HEX}{_HEX}[1-9a-fA-F]|0{_HEX}[1-9a-fA-F]0|0[1-9a-fA-F]00"
    rf"|[1-9a-cefA-CEF]{_HEX}{_HEX}{_HEX}|[dD][0-7]{_HEX}{_HEX}))"
)
_STRING = rf"\x22([^\x22\\\x01-\x1f]|{_ESCAPE})*\x22"
_MEMBER = rf"{_WS}{_STRING}{_WS}:{_WS}({_STRING}|null){_WS}"
# A JSON object of string or null values, nothing else: what jsonb reads without an error.
_STRING_OBJECT = rf"^{_WS}\x7b({_MEMBER}(,{_MEMBER})*|{_WS})\x7d{_WS}$"


def _pattern(regex: str) -> str:
    """`regex` as a literal; it has no brace (`\\x7b`, `\\x7d`), which templates reserve for
    their placeholders."""
    assert "{" not in regex and "}" not in regex and "'" not in regex
    return f"'{regex}'"


def _groups(parsed: str) -> str:
    """The grouping statement over `parsed`: a subquery of (seq, h, readable)."""
    return f"""
        SELECT readable, failed_queue, value, other_value, count(*) AS messages,
               min(tof) FILTER (WHERE wire) AS first_failure,
               max(tof) FILTER (WHERE wire) AS last_failure,
               json_agg(DISTINCT tof) FILTER (WHERE NOT wire)::text AS other_times,
               json_agg(seq) FILTER (WHERE NOT readable)::text AS unreadable
        FROM (
            SELECT seq, readable, failed_queue, value, other_value, tof,
                   length(tof) = 28 AND right(tof, 2) = ' Z' AS wire
            FROM (
                SELECT seq, readable,
                       CASE WHEN readable THEN h ->> 'NServiceBus.FailedQ' END AS failed_queue,
                       CASE WHEN readable THEN h ->> CAST(? AS text) END AS value,
                       CASE WHEN readable THEN h ->> CAST(? AS text) END AS other_value,
                       CASE WHEN readable THEN h ->> 'NServiceBus.TimeOfFailure' END
                           COLLATE "C" AS tof
                FROM ({parsed}) AS parsed
                OFFSET 0) AS row_values) AS grouped
        GROUP BY readable, failed_queue, value, other_value"""


# OFFSET 0 keeps each subquery apart: flattened, every use of `h` would parse the text again.
ERROR_GROUP_STATEMENTS: dict[str, str] = {
    "error_queue_groups": _groups(
        f"""
        SELECT seq, h,
               jsonb_typeof(h) = 'object' AND headers !~ {_pattern(_NOT_A_STRING)} AS readable
        FROM (SELECT seq, headers, headers::jsonb AS h FROM {{queue}} OFFSET 0) AS cast_rows
        OFFSET 0"""
    ),
    "error_queue_groups_checked": _groups(
        f"""
        SELECT seq, h, h IS NOT NULL AS readable
        FROM (SELECT seq,
                     CASE WHEN headers ~ {_pattern(_STRING_OBJECT)} THEN headers::jsonb END AS h
              FROM {{queue}} OFFSET 0) AS cast_rows
        OFFSET 0"""
    ),
    "error_queue_read_many": "SELECT id, headers, seq FROM {queue} WHERE seq IN ({rows})",
}
