"""The report as a self-contained HTML page: tables and inline SVG bar charts. Pure."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

BAR_COLOUR = "#3b6ea5"


def bar_chart(title: str, rows: Sequence[tuple[str, int]], *, width: int = 640) -> str:
    """A horizontal bar chart as an <svg> element; labels escaped; empty data says so."""
    if not rows:
        return f"<h3>{html.escape(title)}</h3><p class='empty'>nothing</p>"
    bar_height, label_width, gap = 22, 260, 6
    largest = max(count for _, count in rows) or 1
    height = len(rows) * (bar_height + gap) + gap
    parts = [
        f"<h3>{html.escape(title)}</h3>",
        f'<svg role="img" aria-label="{html.escape(title)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
    ]
    for index, (label, count) in enumerate(rows):
        y = gap + index * (bar_height + gap)
        length = max(1, int((width - label_width - 60) * count / largest))
        shown = label if len(label) <= 38 else label[:35] + "..."
        parts.append(
            f'<text x="{label_width - 8}" y="{y + 15}" text-anchor="end" font-size="12">'
            f"<title>{html.escape(label)}</title>{html.escape(shown)}</text>"
            f'<rect x="{label_width}" y="{y}" width="{length}" height="{bar_height}" '
            f'fill="{BAR_COLOUR}"/>'
            f'<text x="{label_width + length + 6}" y="{y + 15}" font-size="12">{count}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def table(headings: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headings)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def page(title: str, sections: Sequence[str], data: Any) -> str:
    """A whole page; `data` is embedded as JSON for anyone who wants the numbers."""
    embedded = json.dumps(data, default=str).replace("</", "<\\/")
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>"
        "body{font-family:sans-serif;margin:2em;max-width:60em}"
        "table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;font-size:13px}"
        ".empty{color:#777}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>\n" + "\n".join(sections) + "\n"
        f"<script type='application/json' id='data'>{embedded}</script></body></html>\n"
    )
