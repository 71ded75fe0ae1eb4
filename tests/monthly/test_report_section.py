"""A titled table appended to a written report (abpo.monthly.report_section): both formats, the empty case, the
escaping, where the HTML goes, and the numbers' n/a."""

from __future__ import annotations

import math

from abpo.monthly.report_section import append_section, number, section_html, section_markdown

COLUMNS = ("Arm", "Why")
ROWS = [["abpo", "a | b"], ["grpo", "<b>&"]]


def test_number_formats_finite_values_and_says_n_a_for_the_rest():
    assert number(0.01234) == "+0.0123" and number(3, ".0f") == "3"
    assert [number(x) for x in (None, "x", math.nan, math.inf, float("-inf"))] == ["n/a"] * 5


def test_markdown_has_the_heading_the_intro_and_one_escaped_row_per_entry():
    text = section_markdown("Gate", "Intro.", COLUMNS, ROWS, "Nothing.")
    assert text.splitlines() == [
        "",
        "## Gate",
        "",
        "Intro.",
        "",
        "| Arm | Why |",
        "|---|---|",
        "| abpo | a \\| b |",
        "| grpo | &lt;b>& |",  # a tag escaped, as section_html escapes it
    ]
    assert text.endswith("|\n")
    assert section_markdown("Gate", "Intro.", COLUMNS, [], "Nothing.") == "\n## Gate\n\nIntro.\n\nNothing.\n"


def test_html_escapes_every_text():
    page = section_html("Gate <1>", "a & b", COLUMNS, ROWS, "none")
    assert page.startswith("<h2>Gate &lt;1&gt;</h2><p>a &amp; b</p><table>")
    assert "<td>&lt;b&gt;&amp;</td>" in page and page.endswith("</tbody></table>")
    assert section_html("Gate", "i", COLUMNS, [], "No <gate>.").endswith("<p>No &lt;gate&gt;.</p>")


def test_append_goes_before_the_body_end_or_at_the_end_and_leaves_no_temporary_file(tmp_path):
    md, page = tmp_path / "report.md", tmp_path / "report.html"
    md.write_text("# Report\n\n\n", encoding="utf-8")
    page.write_text("<html><body><p>r</p></body></html>", encoding="utf-8")
    append_section(md, page, "\n## S\n", "<h2>S</h2>")
    assert md.read_text(encoding="utf-8") == "# Report\n\n## S\n"
    assert page.read_text(encoding="utf-8") == "<html><body><p>r</p><h2>S</h2></body></html>"
    page.write_text("<p>no body</p>", encoding="utf-8")
    append_section(md, page, "", "<h2>T</h2>")
    assert page.read_text(encoding="utf-8") == "<p>no body</p><h2>T</h2>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "report.md"]


def test_markdown_cells_render_as_their_text_and_keep_the_table():
    """An approver's name, a comment or a gate reason in a cell renders as itself (issue 59 point 9): no raw HTML,
    link or emphasis, and a ``|`` does not split the cell (markdown-it: CommonMark with GitHub's tables)."""
    from markdown_it import MarkdownIt

    rows = [["<script>alert(1)</script>", "[x](http://evil.example) *a* _b_ `c` | d"]]
    text = section_markdown("Gate", "Intro.", COLUMNS, rows, "Nothing.")
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    cells = [tokens[i + 1] for i, t in enumerate(tokens) if t.type == "td_open"]
    assert len(cells) == 2
    kinds = {c.type for cell in cells for c in cell.children}
    assert kinds == {"text"}, kinds
    assert ["".join(c.content for c in cell.children) for cell in cells] == rows[0]


def test_the_promotions_why_cell_carries_the_approvers_whole_comment_escaped():
    """The approver's comment (up to 500 characters, abpo.monthly.approval) after the approval's task and run id
    reaches the Why cell whole; it used to be cut at 240 characters, before the comment began."""
    from markdown_it import MarkdownIt

    from abpo.arms.history import Entry
    from abpo.monthly.approval import Approval
    from abpo.monthly.promotion_report import promotion_row, promotion_section_html, promotion_section_markdown

    comment = "<b>ok</b> *ship it* " + "x" * 470 + " END"
    said = Approval(
        "approved",
        by="<script>alice</script>",
        at="2026-02-01T10:00:00+00:00",
        comment=comment,
        task="abpo.approve",
        run_id="scheduled__2026-02-01T00:00:00+00:00_" + "r" * 100,
    ).sentence()
    reason = f"{said}; gate passed: offline +0.0100 >= -0.02; off-policy snips +0.0030 [-0.0010, +0.0070]"
    entry = Entry(7, "abpo", "gate", "<script>alice</script>", "2026-02-01T10:00:01", "1", "2", reason, "", "2026-01")
    assert promotion_row(entry)[-1] == reason
    md = promotion_section_markdown([entry])
    tokens = MarkdownIt("commonmark").enable("table").parse(md)
    cells = [tokens[i + 1] for i, t in enumerate(tokens) if t.type == "td_open"]
    assert {c.type for cell in cells for c in cell.children} == {"text"}
    texts = ["".join(c.content for c in cell.children) for cell in cells]
    assert texts[4] == "<script>alice</script>" and texts[-1] == reason and comment in texts[-1]
    page = promotion_section_html([entry])
    assert "<script>" not in page and "&lt;b&gt;ok&lt;/b&gt; *ship it* " in page and " END" in page
