"""report.md renders every value as the text it is (issue 59 point 9): arm names from a CSV, the candidate and holdback
arms, approver names and comments, gate reasons. Checked by rendering the Markdown with markdown-it (CommonMark with
GitHub's tables and strikethrough, what rich and GitHub render): no raw HTML, link, image, emphasis, code span,
heading or list comes out of a value, no table cell is split, and each value reads back whole."""

from __future__ import annotations

import html

import pytest
from markdown_it import MarkdownIt

from abpo.abtest.markdown import escape, escape_line, table_row

HOSTILE = [
    "<script>alert(1)</script>",
    "<b>bold</b>",
    "*stars* and **strong**",
    "_under_ score_",
    "[link](http://evil.example)",
    "![img](http://evil.example/x.png)",
    "`code`",
    "a | b",
    "~~struck~~",
    "&lt;i&gt;entity&#60;",
    "<http://autolink.example>",
    "<!-- comment -->",
    "back\\slash\\",
    "line\nbreak\r\nand\rmore",
]
LINE_STARTS = [
    "# heading",
    "> quote",
    "- item",
    "+ item",
    "1. first",
    "3) third",
    "    indented code",
    "[ref]: /x",
    "===",
]
INERT = ["ml_retrain", "p <0.001", "[+0.012, +0.034]", "5 < 7 & 8 > 2", "2026-01..2026-03", "-0.125"]
# what rendering a value may produce: text and soft breaks inside a paragraph, nothing else
CONSTRUCTS = {"html_inline", "html_block", "link_open", "image", "em_open", "strong_open", "code_inline", "s_open"}


def _md() -> MarkdownIt:
    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


def _text(tokens) -> str:
    out = []
    for t in tokens:
        if t.children:
            out.append(_text(t.children))
        elif t.type in ("text", "softbreak"):
            out.append(t.content if t.type == "text" else " ")
    return "".join(out)


def _inline_tokens(source: str):
    tokens = _md().parse(source)
    return tokens, [c for t in tokens if t.children for c in t.children]


def _one_line(s: str) -> str:
    return " ".join(s.replace("\r\n", "\n").replace("\r", "\n").split("\n"))


@pytest.mark.parametrize("value", HOSTILE + INERT)
def test_a_value_in_a_paragraph_renders_as_its_own_text(value):
    source = f"Arm: {escape(value)} ends here."
    tokens, inline = _inline_tokens(source)
    assert [t.type for t in tokens] == ["paragraph_open", "inline", "paragraph_close"], source
    assert not {t.type for t in inline} & CONSTRUCTS, (source, [t.type for t in inline])
    assert _text(tokens) == f"Arm: {_one_line(value)} ends here.", source
    assert "<script" not in _md().render(source)


@pytest.mark.parametrize("value", HOSTILE + INERT + LINE_STARTS)
def test_a_value_that_starts_a_list_item_or_a_paragraph_stays_one_item_of_text(value):
    for source in (f"- {escape_line(value)}\n- next", f"{escape_line(value)}\n\nnext"):
        tokens, inline = _inline_tokens(source)
        blocks = [t.type for t in tokens if t.type.endswith("_open")]
        if source.startswith("- "):
            want = ["bullet_list_open", "list_item_open", "paragraph_open", "list_item_open", "paragraph_open"]
        else:
            want = ["paragraph_open", "paragraph_open"]
        assert blocks == want, (source, blocks)
        assert not {t.type for t in inline} & CONSTRUCTS, (source, [t.type for t in inline])
        assert _text(tokens).startswith(_one_line(value).lstrip()), (source, _text(tokens))


def test_a_table_row_keeps_its_cells_whatever_they_hold():
    cells = [*HOSTILE, *INERT]
    source = "\n".join([table_row([f"h{i}" for i in range(len(cells))]), "|" + "---|" * len(cells), table_row(cells)])
    tokens = _md().parse(source)
    body = [t for t in tokens if t.type == "td_open"]
    assert len(body) == len(cells)
    tds = [tokens[i + 1] for i, t in enumerate(tokens) if t.type == "td_open"]
    for cell, value in zip(tds, cells):
        assert not {c.type for c in cell.children} & CONSTRUCTS, (value, [c.type for c in cell.children])
        assert _text([cell]) == _one_line(value).strip(), value


def test_inert_text_is_left_readable_in_the_file():
    assert [escape(v) for v in INERT] == INERT  # no backslash or entity where nothing could open


def test_the_report_markdown_escapes_arm_names_the_candidate_and_the_holdback(counts_table, tmp_path):
    """A CSV's arm names and the report config's candidate and holdback arms (the config refuses names outside
    arms.names; a CSV's arms are the file's) reach report.md as text, as they reach report.html."""
    from abpo.abtest.analysis import analyse
    from abpo.abtest.render import write_report
    from abpo.config.report import ReportConfig

    names = {"abpo": "<b>cand</b>", "grpo": "*grpo*_x_", "popularity": "<script>x</script>", "ml_retrain": "[a](b)|c"}
    t = counts_table.set_column(1, "arm", [[names[a] for a in counts_table.column("arm").to_pylist()]])
    cfg = ReportConfig(
        candidate_arm=names["abpo"],
        holdback_arm=names["ml_retrain"],
        updated_arms=[names["grpo"]],
        arm_shares={v: 0.25 for v in names.values()},
    )
    files = write_report(analyse(t, cfg), tmp_path)
    md = files.markdown.read_text()
    tokens = _md().parse(md)
    inline = [c for t in tokens if t.children for c in t.children]
    kinds = {c.type for c in inline}
    assert not kinds & {"html_inline", "html_block", "link_open", "em_open", "code_inline"}, kinds
    assert not [t for t in tokens if t.type == "html_block"]
    assert sum(c.type == "image" for c in inline) == 1  # the plot, which the template links on purpose
    assert sum(c.type == "strong_open" for c in inline) == 1  # the candidate, bold on purpose
    text = _text(tokens)
    for name in names.values():
        assert name in text, name
    assert f"Candidate arm: {names['abpo']}" in text
    # every row of every table has as many cells as its header
    rows = [i for i, t in enumerate(tokens) if t.type == "tr_open"]
    for i in rows:
        j = i + 1
        n = 0
        while tokens[j].type != "tr_close":
            n += tokens[j].type in ("td_open", "th_open")
            j += 1
        assert n >= 6, n
    assert "Updating vs not updating (holdback)" in md  # the holdback's table, its arm named as text
    rendered = _md().render(md)
    assert "<script" not in rendered and "<b>" not in rendered
    assert html.escape("<b>cand</b>") in rendered
