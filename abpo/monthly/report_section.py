"""A titled table appended to a report the ``report`` step has just written (abpo.monthly.report): at the end of its
Markdown and before the end of its HTML body, each file replaced whole (a reader never sees half a file). The gate
section (abpo.monthly.gate_report) and the promotion section (abpo.monthly.promotion_report) are two such tables.
Standard library only (and abpo.abtest.markdown, which is): the approval task (abpo.monthly.approval, imported by the
DAG file) formats its numbers here."""

from __future__ import annotations

import html
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from abpo.abtest.markdown import table_row


def number(x: Any, fmt: str = "+.4f") -> str:
    """``x`` formatted with ``fmt``; "n/a" when it is missing, not a number or not finite (a gate's result carries None
    for a value that could not be computed)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "n/a"
    return format(v, fmt) if math.isfinite(v) else "n/a"


def section_markdown(title: str, intro: str, columns: Sequence[str], rows: Sequence[Sequence[str]], empty: str) -> str:
    """The section in Markdown: a heading, ``intro`` (abpo's own Markdown), then the table, or ``empty``. Every cell is
    escaped (abpo.abtest.markdown.escape) as section_html escapes it for HTML: an approver's name or comment, a gate's
    reason render as the text they are."""
    lines = ["", f"## {title}", "", intro, ""]
    if not rows:
        return "\n".join([*lines, empty, ""])
    lines.append(table_row(list(columns)))
    lines.append("|" + "---|" * len(columns))
    lines += [table_row(list(row)) for row in rows]
    return "\n".join([*lines, ""])


def section_html(title: str, intro: str, columns: Sequence[str], rows: Sequence[Sequence[str]], empty: str) -> str:
    """The same section in HTML, every text escaped."""
    out = [f"<h2>{html.escape(title)}</h2>", f"<p>{html.escape(intro)}</p>"]
    if not rows:
        return "".join([*out, f"<p>{html.escape(empty)}</p>"])
    out.append("<table><thead><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in columns) + "</tr></thead><tbody>")
    out += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows]
    out.append("</tbody></table>")
    return "".join(out)


def append_section(markdown: Path, html_path: Path, markdown_text: str, html_text: str) -> None:
    """Append ``markdown_text`` to the report's Markdown and insert ``html_text`` before its HTML's ``</body>`` (at
    the end when there is none), each file replaced whole."""
    md = Path(markdown).read_text(encoding="utf-8")
    _replace(Path(markdown), md.rstrip("\n") + "\n" + markdown_text)
    page = Path(html_path).read_text(encoding="utf-8")
    at = page.rfind("</body>")
    _replace(Path(html_path), page[:at] + html_text + page[at:] if at >= 0 else page + html_text)


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.section.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
