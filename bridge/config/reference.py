"""The Markdown reference of the configuration file, generated from `bridge.config.schema`.

docs/configuration.md holds it between the `config-reference` markers, under its own
"## Reference" heading; `python -m bridge.config.reference --write docs/configuration.md`
puts the current one there (without `--write`, it is printed).
"""

from __future__ import annotations

from bridge.config.durations import format_duration
from bridge.config.keys import Key, Section
from bridge.config.schema import NAME_PATTERN, SCHEMA
from bridge.config.sizes import format_size

__all__ = [
    "END_MARKER",
    "START_MARKER",
    "describe_default",
    "describe_type",
    "reference_block",
    "render_reference_markdown",
    "with_current_reference",
]

START_MARKER = "<!-- config-reference:start -->\n"
END_MARKER = "<!-- config-reference:end -->"
# docs/configuration.md has the reference under "## Reference", so its sections are "###".
DOCS_HEADING_LEVEL = 2


def _format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def describe_type(key: Key) -> str:
    """Human-readable type and allowed values of `key`, e.g. "integer, 1..64"."""
    if key.type == "choice":
        choices = [c for c in key.choices if c not in key.unavailable]
        text = "one of " + ", ".join(f"`{c}`" for c in choices)
        if key.case_insensitive:
            text += " (any case)"
        if key.unavailable:
            later = ", ".join(f"`{c}`" for c in key.unavailable)
            text += f" ({later}: not available yet)"
        return text
    if key.type == "address":
        return "queue address"
    if key.type == "names":
        return "list of names"
    if key.type == "topic":
        return "type full name"
    if key.type == "listen":
        return "`HOST:PORT`"
    if key.type == "size":
        smallest, largest = key.minimum or 0, key.maximum
        bounds = f"{format_size(smallest)}..{format_size(largest)}" if largest else ""
        return f"size (B, KiB, MiB, GiB), {bounds}".rstrip(", ")
    if key.type == "mapping":
        return "mapping of " + ", ".join(f"`{field.name}`" for field in key.fields)
    if key.type in ("integer", "duration"):
        low, high = key.minimum, key.maximum
        if low is not None and high is not None:
            bounds = f"{_format_number(low)}..{_format_number(high)}"
            if key.type == "duration":
                bounds = f"{format_duration(low)}..{format_duration(high)}"
            return f"{key.type}, {bounds}"
        if low is not None:
            sign = ">" if key.exclusive_minimum else "≥"
            return f"{key.type} {sign} {_format_number(low)}"
        return key.type
    if key.type == "string" and key.pattern == NAME_PATTERN:
        return f"string matching `{key.pattern}`"
    return key.type


def describe_default(key: Key) -> str:
    """The default of `key` as it would be written in the file, or "required"."""
    if key.required:
        if key.dialects:
            return f"required for {', '.join(key.dialects)}"
        return "**required**"
    if key.default is None or key.default == ():
        return "none"
    if key.type == "duration" and isinstance(key.default, int | float):
        return f"`{format_duration(float(key.default))}`"
    if key.type == "size" and isinstance(key.default, int):
        return f"`{format_size(key.default)}`"
    if isinstance(key.default, bool):
        return f"`{str(key.default).lower()}`"
    return f"`{key.default}`"


def _describe_example(key: Key) -> str:
    if isinstance(key.example, dict):
        return "`{" + ", ".join(f"{k}: {v}" for k, v in key.example.items()) + "}`"
    if isinstance(key.example, bool):
        return f"`{str(key.example).lower()}`"
    if isinstance(key.example, list):
        return "`[" + ", ".join(str(item) for item in key.example) + "]`"
    return f"`{key.example}`"


def _section_heading(sec: Section) -> str:
    if sec.shape == "multimap" and sec.name_key is not None:
        return f"`{sec.name}.<{sec.name_key.name}>`"
    if sec.shape == "named":
        return f"`{sec.name}.<name>`"
    if sec.shape == "list":
        return f"`{sec.name}[]`"
    return f"`{sec.name}`"


def _escape_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(sec: Section) -> list[tuple[str, str, str, str, str]]:
    """The cells of the reference table of `sec`: key, type, default, description, example."""
    if sec.shape == "multimap":
        # One row for the entry names, one for the values of their lists.
        assert sec.name_key is not None and sec.items is not None
        name = f"<{sec.name_key.name}>"
        return [
            (
                f"`{name}`",
                describe_type(sec.name_key),
                "—",
                sec.name_key.description,
                _describe_example(sec.name_key),
            ),
            (
                f"`{name}[]`",
                "non-empty list; each a " + describe_type(sec.items),
                "—",
                sec.items.description,
                _describe_example(sec.items),
            ),
        ]
    rows = []
    for key in sec.keys:
        description = key.description
        if key.dialects and not key.required:
            description += f" Only for {', '.join(key.dialects)}."
        cells = (
            f"`{key.name}`",
            describe_type(key),
            describe_default(key),
            description,
            _describe_example(key),
        )
        rows.append(cells)
        for field in key.fields:
            rows.append(
                (
                    f"`{key.name}.{field.name}`",
                    describe_type(field),
                    describe_default(field),
                    field.description,
                    _describe_example(field),
                )
            )
    return rows


def render_reference_markdown(heading_level: int = 2) -> str:
    """Render the configuration reference as Markdown.

    Given the heading level of the title (2: `##`, sections one level deeper). Returns the
    reference: an introduction to value syntax (durations, `${VAR}`), then one table per
    section with each key's name, type and allowed values, default, description and example.
    """
    title = "#" * heading_level
    sub = "#" * (heading_level + 1)
    lines = [
        f"{title} Configuration reference",
        "",
        "The configuration is one YAML file. Unknown keys are errors; `null` or an omitted "
        "optional key means its default. All problems are reported at once.",
        "",
        "- **Durations** are seconds (`10`, `1.5`) or number-and-unit parts with units `ms`, "
        "`s`, `m`, `h`, `d`, largest first: `500ms`, `10s`, `1.5s`, `2m`, `1h`, `7d`, `1h30m`.",
        "- **`${VAR}`** in `connection`, `path` and `sentry.dsn` is replaced by the environment "
        "variable `VAR`; `${VAR:-default}` uses `default` when it is unset or empty; `$$` is a "
        "literal `$`. Every reference is checked when the file is read, but a variable that is "
        "not set is an error only for a command that opens its database (`sentry.dsn`: only "
        "`run`); see [secrets in the environment](security.md#secrets-in-the-environment).",
        "- **Queue addresses** are a table name or an address in the database's dialect "
        '(PostgreSQL `"schema"."table"`, SQL Server `table@[schema]@[catalog]`, SQLite '
        "`table`).",
        "- **Booleans** are `true` / `false` (YAML also reads `yes` / `no`).",
        "",
    ]
    for sec in SCHEMA:
        required = "Required" if sec.required else "Optional"
        if sec.min_items:
            required += f", at least {sec.min_items} {sec.entry}"
            required += "s" if sec.min_items > 1 else ""
        lines += [
            f"{sub} {_section_heading(sec)}",
            "",
            f"{sec.description} *{required}.*",
            "",
            "| Key | Type | Default | Description | Example |",
            "| --- | --- | --- | --- | --- |",
        ]
        for cells in _rows(sec):
            lines.append("| " + " | ".join(_escape_cell(cell) for cell in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def reference_block() -> str:
    """The generated text between the markers of docs/configuration.md: the reference at the
    page's heading level, without its title (the page has its own)."""
    lines = render_reference_markdown(heading_level=DOCS_HEADING_LEVEL).splitlines()
    return "\n".join(lines[1:]).strip() + "\n"


def with_current_reference(page: str) -> str:
    """Given the text of a page holding both markers, returns it with the current reference
    between them and everything else unchanged. Raises ValueError when a marker is missing."""
    if START_MARKER not in page or END_MARKER not in page:
        raise ValueError(f"the page has no {START_MARKER.strip()} ... {END_MARKER} block")
    before, rest = page.split(START_MARKER, 1)
    after = rest.split(END_MARKER, 1)[1]
    return before + START_MARKER + reference_block() + END_MARKER + after


def main(argv: list[str] | None = None) -> None:
    """`python -m bridge.config.reference [--write PAGE]`: print the reference, or put it
    between the markers of PAGE (docs/configuration.md)."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m bridge.config.reference")
    parser.add_argument("--write", metavar="PAGE", type=Path, help="the page to update")
    args = parser.parse_args(argv)
    if args.write is None:
        print(render_reference_markdown(heading_level=DOCS_HEADING_LEVEL))
        return
    page = args.write.read_text(encoding="utf-8")
    args.write.write_text(with_current_reference(page), encoding="utf-8")


if __name__ == "__main__":
    main()
