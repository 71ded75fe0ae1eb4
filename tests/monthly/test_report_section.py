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
        "| grpo | <b>& |",
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
