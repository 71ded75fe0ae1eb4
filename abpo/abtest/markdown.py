"""Text written into a Markdown file as the text it is: the escaping report.md gets (the A/B report's template, the
gate and promotion sections), as report.html gets HTML's. An arm name, an approver's name or comment, a gate's reason
or a CSV's arm then renders as itself: no raw HTML, no link, no emphasis, no code span, no table cell split, no
heading or list started. Standard library only, and Jinja inside :func:`environment` (the approval task's module,
abpo.monthly.report_section, imports this one).

The rules are CommonMark's (with GitHub's tables and strikethrough), escaping only what could start a construct, so
that numbers and intervals stay readable in the raw file ("[+0.012, +0.034]", "p <0.001"):

- ``\\ ` * | ~`` always take a backslash; ``_`` unless it stands between two letters or digits (an underscore inside
  a word, as in ml_retrain, opens no emphasis);
- ``]`` before ``(`` or ``[`` (the end of a link or image text), and ``[`` at the start of a line (a link reference
  definition), take a backslash;
- ``<`` before a letter, ``/``, ``!`` or ``?`` (a tag, comment, declaration, processing instruction or autolink)
  becomes ``&lt;``, and ``&`` before a letter, digit or ``#`` (a character reference) ``&amp;``: entities, which every
  Markdown renderer decodes (not all take ``\\<``);
- a line break becomes a space: a value is one line;
- at the start of a line (:func:`escape_line`: a list item, a paragraph) a block marker takes a backslash: ``#``,
  ``>``, ``-``, ``+``, ``=``, ``[`` and an ordered-list number's ``.`` or ``)``; leading spaces are dropped (four of
  them open a code block)."""

from __future__ import annotations

import re

_BACKSLASHED = re.compile(r"[\\`*|~]|(?<![^\W_])_|_(?![^\W_])|\](?=[(\[])")
_TAG_OPEN = re.compile(r"<(?=[A-Za-z/!?])")
_REFERENCE = re.compile(r"&(?=[A-Za-z0-9#])")
_LINE_BREAK = re.compile(r"\r\n|[\r\n]")
_BLOCK_MARKER = re.compile(r"^(?:[#>+\-=\[]|(\d{1,9})([.)]))")


class Markdown(str):
    """Text that is Markdown already: escaped by this module, or written as Markdown on purpose by abpo itself (a
    template's table row). The report's Markdown template prints it as it is; any other value it escapes."""


def escape(text: object) -> str:
    """``text`` (str() of it) as Markdown inline text that renders as itself, on one line (the rules: the module's
    docstring). For a table cell or text in the middle of a line; :func:`escape_line` where it starts a line."""
    s = _LINE_BREAK.sub(" ", str(text))
    s = _BACKSLASHED.sub(lambda m: "\\" + m.group(0), s)
    s = _REFERENCE.sub("&amp;", s)
    return _TAG_OPEN.sub("&lt;", s)


def escape_line(text: object) -> str:
    """:func:`escape`, for text at the start of a line (a list item, a paragraph): a leading block marker is escaped
    as well, and leading spaces are dropped."""
    s = escape(text).lstrip(" \t")
    m = _BLOCK_MARKER.match(s)
    if m is None:
        return s
    if m.group(1):  # "1. x": the number stays, its . or ) takes the backslash
        return f"{m.group(1)}\\{m.group(2)}{s[m.end() :]}"
    return "\\" + s


def table_row(cells: list[object]) -> Markdown:
    """One row of a Markdown table, every cell escaped (:func:`escape`)."""
    return Markdown("| " + " | ".join(escape(c) for c in cells) + " |")


def environment():
    """The Jinja environment of the Markdown templates in abpo/abtest/templates/ (report.md.j2): every ``{{ value }}``
    is escaped (:func:`escape_line`), as the HTML environment autoescapes every value for HTML, so an arm name, a note
    or a CSV's text renders as the text it is; a value that is :class:`Markdown` already is printed as it is, and the
    ``row`` filter builds a table row (:func:`table_row`)."""
    import jinja2

    def finalize(value: object) -> str:
        return value if isinstance(value, Markdown) else escape_line(value)

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("abpo.abtest", "templates"),
        autoescape=False,
        finalize=finalize,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["row"] = table_row
    return env
