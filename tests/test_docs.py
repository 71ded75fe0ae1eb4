"""The documents the code points to: docs/ABPO_SPEC.md exists, every reference to the specification names it by that
path, and every section or step a reference names is in it; the README's "Use it with your own stack" section is
near the top and its links resolve. The README is a front door: what it is and what it finds first (each finding
linked to its page, the climb chart), the terms it uses defined, the two commands with what `make demo` prints as the
demo's code prints it, its demo table the same as on the page it cites, no commit hash, at most one timing, a package
map that is the import-linter layers, a DAG diagram with every step and arm, and a link to every page of docs/; no
docs table is left empty; every
relative link in README.md and the pages of docs/ (its subdirectories too) reaches a file and, with an #anchor, a heading of it; the commands in their
bash blocks name Makefile targets, `abpo` subcommands and paths that exist."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.command_names import cli_commands, named_commands, unknown_commands

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "docs" / "ABPO_SPEC.md"
README = REPO / "README.md"
# The user pages: docs/ and its kinds' subdirectories (reference/, ...), not the experiment records.
PAGES = sorted(p for p in (REPO / "docs").rglob("*.md") if (REPO / "docs" / "experiments") not in p.parents)
SOURCES = [
    README,
    *(p for p in PAGES if p != SPEC),
    *(REPO / "abpo").rglob("*.py"),
    *(REPO / "tests").rglob("*.py"),
    REPO / "dags" / "abpo_monthly.py",
    REPO / "plugins" / "abpo_plugin.py",
    *(REPO / "configs").glob("*.yaml"),
]


def _headings() -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^#{2,4} (.+)$", SPEC.read_text(), re.M)]


def _missing_sections(text: str, headings: list[str]) -> list[str]:
    missing = []
    for m in re.finditer(r'docs/ABPO_SPEC\.md,?\s"([^"\n]+)"', text):
        for part in m.group(1).split(" / "):
            if not any(h == part or h.startswith(part + " (") for h in headings):
                missing.append(m.group(1))
    return missing


def test_every_reference_names_docs_abpo_spec_and_a_section_it_has():
    headings = _headings()
    assert {"Propensities", "Offline construction", "The update", "Variants", "Metrics"} <= set(headings)
    spec = SPEC.read_text()
    steps = {int(n) for n in re.findall(r"^(\d)\. \*\*", spec, re.M)}
    assert steps == {1, 2, 3, 4, 5}
    refs = bad_path = 0
    problems: dict[str, list[str]] = {}
    for f in SOURCES:
        text = f.read_text()
        if f == Path(__file__):
            continue
        bad_path += len(re.findall(r"(?<![/\w])ABPO_SPEC", text))  # the bare name: a file that is not there
        refs += text.count("docs/ABPO_SPEC.md")
        missing = _missing_sections(text, headings)
        missing += [f"step {n}" for n in re.findall(r"docs/ABPO_SPEC\.md,? steps? (\d)", text) if int(n) not in steps]
        if missing:
            problems[str(f.relative_to(REPO))] = missing
    assert bad_path == 0 and refs > 50 and not problems, (bad_path, refs, problems)


def test_the_section_check_catches_a_wrong_name():
    assert _missing_sections(
        'see docs/ABPO_SPEC.md "The updates" and docs/ABPO_SPEC.md "Metrics / Onlin"', _headings()
    ) == ["The updates", "Metrics / Onlin"]


def test_the_readme_has_a_short_own_stack_section_near_the_top():
    readme = (REPO / "README.md").read_text()
    sections = re.findall(r"^## (.+)$", readme, re.M)
    assert "Use it with your own stack" in sections[:3], sections[:5]
    body = readme.split("## Use it with your own stack", 1)[1].split("\n## ", 1)[0]
    for topic in ("Airflow", "MLflow", "logs", "model", "GPU"):
        assert topic in body, topic
    assert len(body.splitlines()) < 45  # short: it points to the sections that say more
    targets = re.findall(r"\]\(([^)]+)\)", body)
    assert len(targets) >= 6, targets  # it points to the pages that say more
    assert not _broken_links(README, body), _broken_links(README, body)


# --- the README as a map, and every link and command of the documentation -------------------------------------------

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _outside_fences(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines that are not inside a fenced code block."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((n, line))
    return out


def _bash_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines inside ```bash (or ```sh, ```shell) blocks."""
    out, lang = [], None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            lang = None if lang is not None else (line.strip()[3:].strip() or "")
        elif lang in ("bash", "sh", "shell", "console"):
            out.append((n, line))
    return out


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation other than - and _ removed, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor in a markdown text; a repeated one gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in _outside_fences(text):
        m = re.match(r"^ {0,3}#{1,6}\s+(.+?)\s*#*\s*$", line)
        if m:
            a = anchor(m.group(1))
            out.add(a if a not in seen else f"{a}-{seen[a]}")
            seen[a] = seen.get(a, 0) + 1
    return out


def _links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every markdown link outside code blocks and inline code spans."""
    out = []
    prose = dict(_outside_fences(text))
    kept = "\n".join(prose.get(n, "") for n in range(1, len(text.splitlines()) + 1))
    kept = re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), kept)
    for m in LINK.finditer(kept):
        out.append((kept.count("\n", 0, m.start()) + 1, m.group(1)))
    return out


def _broken_links(path: Path, text: str | None = None) -> list[str]:
    """Each relative link of ``path`` (or of ``text``, read as if it were ``path``) that does not resolve: its file
    is missing, or its #anchor is no heading of that file. Messages name the file, the line and the link."""
    text = path.read_text() if text is None else text
    bad = []
    for line, target in _links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, frag = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        where = f"{path.relative_to(REPO)}:{line}: link ({target})"
        if not dest.exists():
            bad.append(f"{where}: no file {file}")
        elif frag and dest.suffix == ".md" and frag not in anchors(text if dest == path else dest.read_text()):
            bad.append(f"{where}: no heading with anchor #{frag} in {dest.relative_to(REPO)}")
    return bad


def _makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w.-]+):(?!=)", (REPO / "Makefile").read_text(), re.M))


def _bad_commands(path: Path, text: str | None = None) -> list[str]:
    """The commands of the bash blocks that name what does not exist: a `make` target the Makefile lacks, an `abpo`
    subcommand the CLI's parser lacks, a `.venv/bin/<x>` the virtualenv lacks, a `scripts/` or `benchmarks/` file
    the checkout lacks."""
    text = path.read_text() if text is None else text
    targets, commands, bindir = _makefile_targets(), cli_commands(), Path(sys.executable).parent
    bad = []
    for n, line in _bash_blocks(text):
        code = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
        where = f"{path.relative_to(REPO)}:{n}: `{line.strip()}`"
        m = re.match(r"^\s*(?:\w+=\S+\s+)*make\s+([\w.-]+)", code)
        if m and m.group(1) not in targets:
            bad.append(f"{where}: make target {m.group(1)!r} is not in the Makefile ({sorted(targets)})")
        for ref in unknown_commands(named_commands(code), commands):
            bad.append(f"{where}: `abpo {ref}` is not a subcommand of abpo's CLI")
        for exe in re.findall(r"\.venv/bin/([\w.+-]+)", code):
            if not (bindir / exe).exists():
                bad.append(f"{where}: .venv/bin/{exe} is not installed by the virtualenv ({bindir})")
        for rel in re.findall(r"(?<![\w/.$-])((?:scripts|benchmarks)/[\w./-]*[\w])", code):
            if not (REPO / rel).exists():
                bad.append(f"{where}: {rel} does not exist")
    return bad


def _section(text: str, heading: str) -> str:
    """The body of the section under ``heading`` (``## X`` or ``### X``), up to the next heading of any level."""
    body = text.split(f"\n{heading}\n", 1)[1]
    return re.split(r"\n#{2,3} ", body, maxsplit=1)[0]


def test_the_readme_opens_with_what_it_is_and_what_it_finds():
    text = README.read_text()
    sections = re.findall(r"^## (.+)$", text, re.M)
    assert sections[:3] == ["What it finds", "Two commands", "Use it with your own stack"], sections[:3]
    intro = text.split("\n## ", 1)[0]
    assert "Airflow" in intro and "MLflow" in intro and len(intro.splitlines()) <= 12, intro
    findings = _section(text, "## What it finds")
    bullets = re.findall(r"^- (.+(?:\n  .+)*)", findings, re.M)
    assert len(bullets) >= 3 and "ABPO equals GRPO" in findings, findings
    unlinked = [b.split("\n")[0] for b in bullets if not LINK.search(b)]
    assert not unlinked, f"README.md's findings without the page of their figures: {unlinked}"
    (chart,) = re.findall(r"!\[[^]]*\]\((docs/figures/[^)]+\.png)\)", findings)
    assert (REPO / chart).is_file(), chart


# The terms the README uses before a reader has met them on another page.
README_TERMS = {"arm", "pi_init", "champion", "challenger", "gate", "holdback", "wll", "ML-retrain", "tau"}
README_TERMS |= {"expected CTR", "MDE"}


def test_the_readme_defines_the_terms_it_uses():
    text = README.read_text()
    terms = _section(text, "### Terms")
    defined = {t for line in re.findall(r"^- (.+?):", terms, re.M) for t in re.findall(r"\*\*(.+?)\*\*", line)}
    assert README_TERMS <= defined, f"README.md's Terms: missing {sorted(README_TERMS - defined)}"
    prose = text.split("### Terms", 1)[0] + text.split("## Two commands", 1)[1]
    unused = [t for t in defined if t not in prose]
    assert not unused, f"README.md's Terms define what the README does not use: {unused}"


def test_the_readme_shows_what_make_demo_prints_as_the_demo_prints_it():
    """The excerpt's lines are the shape of abpo demo's console: a line for each of its stages, in their order, as
    abpo.commands.demo's progress_line writes it, then the wall time and the summary."""
    from abpo.commands.demo import demo_stages, progress_line
    from abpo.months import month_range

    block = _fenced_block_after(README.read_text(), "### What `make demo` prints")
    months = month_range("2026-01", 4)
    labels = [label for _, label in demo_stages(months)]
    shown = [line for line in block if " elapsed, " in line]
    assert [line.split(" ... ", 1)[0] for line in shown] == labels, shown
    shape = progress_line("LABEL", 0, 0).replace("LABEL", "")
    assert all(line.endswith(("min left", "under a minute left")) and " ... " in line for line in shown), shape
    assert any(line.startswith("abpo demo: 4 months through abpo_monthly in ") for line in block), block
    assert "Final A/B report (2026-01..2026-04), summary:" in block, block
    assert not [line for line in block if TIMING.search(line)], "the excerpt is a shape: no measured time"


def _demo_table(text: str) -> list[str]:
    """The rows of the first table in README's "What the demo shows" (its header and arms' rows)."""
    body = text.split("\n## What the demo shows\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in body.splitlines() if line.startswith("| ") and not set(line) <= set("|-: ")]


def _cited_page(text: str) -> Path:
    """The page README's demo section cites for its table: the first link of its first paragraph."""
    body = text.split("\n## What the demo shows\n", 1)[1].strip().split("\n\n", 1)[0]
    target = LINK.search(body).group(1).partition("#")[0]
    return (README.parent / target).resolve()


def _rows_missing(rows: list[str], page_text: str) -> list[str]:
    """The rows of README's table that the cited page does not hold, cell for cell (a page may add columns)."""
    lines = [[c.strip() for c in x.strip().strip("|").split("|")] for x in page_text.splitlines() if x.startswith("|")]
    missing = []
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if not any(line[: len(cells)] == cells for line in lines):
            missing.append(row)
    return missing


def test_the_demo_table_check_finds_a_row_the_page_lacks():
    rows = ["| Arm | CTR |", "| abpo | 9.280% |", "| grpo | 8.580% |"]
    page = "| Arm | CTR | 95% CI |\n|---|---|---|\n| abpo | 9.280% | [8.6%, 10.0%] |\n| grpo | 8.183% | [...] |\n"
    assert _rows_missing(rows, page) == ["| grpo | 8.580% |"]


def test_the_readmes_demo_table_is_the_one_on_the_page_it_cites():
    text = README.read_text()
    rows = _demo_table(text)
    assert len(rows) == 7 and rows[0].startswith("| Arm (2026-01..2026-04) |"), rows
    page = _cited_page(text)
    assert page.is_file(), page
    missing = _rows_missing(rows, page.read_text())
    assert not missing, f"README.md's demo table: rows not on {page.relative_to(REPO)}: {missing}"


# A commit hash: 7 to 40 hex digits holding at least one digit and one letter a-f (so no plain number or word).
HASH = re.compile(r"(?<![\w/#.-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w/-])")
# A timing: a number with a unit of time ("14.9 min", "20 s", "an hour" is words and not counted).
TIMING = re.compile(r"\b\d+(?:[.,]\d+)?\s?(?:ms|s|secs?|seconds?|mins?|minutes?|h|hours?)\b")


def _hashes(text: str) -> list[str]:
    return [f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in HASH.finditer(text)]


def _timings(text: str) -> list[str]:
    return [f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in TIMING.finditer(text)]


def test_the_readme_names_no_commit_and_at_most_one_timing():
    text = README.read_text()
    where = "docs/testing.md, docs/benchmarks.md or the topic page"
    assert not _hashes(text), f"README.md: commit hashes {_hashes(text)}; rule: none (they go to {where})"
    assert len(_timings(text)) <= 1, f"README.md: timings {_timings(text)}; rule: at most one (the others go to docs/)"


@pytest.mark.parametrize(
    "text, hashes, timings",
    [
        ("at 8f0305d, nothing else running: 35.6 min", ["line 1: 8f0305d"], ["line 1: 35.6 min"]),
        ("a\n(b819548) then 20 s and 12 minutes", ["line 2: b819548"], ["line 2: 20 s", "line 2: 12 minutes"]),
        ("1,612 passed, 100836 ratings, decade, effaced, 2026-11-26, #abcdef1, v1.2e-3", [], []),
        ("12 requests per user per month over 4 months, 5 seeds", [], []),
    ],
)
def test_the_hash_and_timing_checks_catch_what_they_should(text, hashes, timings):
    assert (_hashes(text), _timings(text)) == (hashes, timings)


def _fenced_block_after(text: str, heading: str) -> list[str]:
    """The lines of the first fenced code block in the section under ``heading``."""
    section = text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1].split("\n")[1:]


def _readme_layers() -> list[set[str]]:
    """The README's package map, top to bottom: the modules each line names before its description (two or more
    spaces), `x/` or `x.py` as abpo.x."""
    layers = []
    for line in _fenced_block_after(README.read_text(), "## The package map"):
        if line.strip():
            names = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0].split()
            layers.append({"abpo." + n.removesuffix("/").removesuffix(".py") for n in names})
    return layers


def test_the_readmes_package_map_is_the_import_linter_layers_and_names_every_module():
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    want = [{m.strip() for m in layer.split("|")} for layer in layers]
    got = _readme_layers()
    assert got == want, (
        f"README.md's package map, top to bottom: {got}; rule: the layers of pyproject.toml's import-linter contract, "
        f"in order: {want}"
    )
    top = {
        f"abpo.{p.stem}" for p in (REPO / "abpo").iterdir() if p.name[0] != "_" and (p.is_dir() or p.suffix == ".py")
    }
    named = set().union(*got)
    assert top == named, f"README.md's package map: missing {sorted(top - named)}, no such module {sorted(named - top)}"


def test_the_readmes_dag_diagram_shows_every_step_and_arm():
    from abpo.arms.names import ARMS
    from abpo.monthly.steps import LAST, ONCE, PER_ARM

    diagram = _fenced_block_after(README.read_text(), "## The monthly DAG")
    assert re.search(r"\s→\s".join(["resolve_month", *ONCE]), diagram[0]) and LAST[0] in diagram[0], diagram[0]
    for arm, entry in ARMS.items():
        lines = [line for line in diagram if re.search(rf"─ {arm}\s", line)]
        chain = " → ".join(PER_ARM[entry.kind])
        assert len(lines) == 1 and chain in lines[0], f"README.md's DAG diagram: arm {arm} should run {chain}: {lines}"


# A table left to be filled: a row whose cells after the first are all empty, or a header with no rows under it.
def _empty_table_rows(path: Path, text: str | None = None) -> list[str]:
    bad, where = [], path.relative_to(REPO)
    lines = _outside_fences(path.read_text() if text is None else text)
    for i, (n, line) in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else []
        separator = bool(cells) and set("".join(cells)) <= set("-: ") and "-" in line
        if len(cells) >= 2 and not separator and not any(cells[1:]):
            bad.append(f"{where}:{n}: `{line.strip()}`: a table row with nothing after its first cell")
        after = lines[i + 1] if i + 1 < len(lines) else (n + 1, "")
        if separator and (after[0] != n + 1 or not after[1].lstrip().startswith("|")):
            bad.append(f"{where}:{n}: a table header with no rows under it")
    return bad


def test_no_docs_table_is_left_empty():
    bad = [b for p in [README, *PAGES] for b in _empty_table_rows(p)]
    assert not bad, "\n".join(bad)


def test_the_empty_table_check_catches_a_table_to_be_filled():
    text = (
        "| arm | HR@5 | CTR |\n|---|---:|---:|\n| abpo | 0.36 | |\n| grpo | | |\n"
        "| | 0.20 | 0.32 |\n```\n| x | | |\n```\n\n| a | b |\n| --- | --- |\n\ntext\n"
    )
    assert _empty_table_rows(README, text) == [
        "README.md:4: `| grpo | | |`: a table row with nothing after its first cell",
        "README.md:11: a table header with no rows under it",
    ]


def test_every_relative_link_in_the_readme_and_docs_resolves():
    records = sorted((REPO / "docs" / "experiments").glob("*.md"))
    bad = [b for p in [README, *PAGES, *records] for b in _broken_links(p)]
    assert sum(len(_links(p.read_text())) for p in [README, *PAGES]) > 60  # the pattern does find the links
    assert not bad, "\n".join(bad)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for _, t in _links(README.read_text())}
    missing = [
        f"README.md: no link to {p.relative_to(REPO)}; rule: the README's docs map links every page of docs/"
        for p in PAGES
        if p.resolve() not in linked
    ]
    assert not missing, "\n".join(missing)


def test_the_commands_in_the_bash_blocks_exist():
    readme_lines = [line for _, line in _bash_blocks(README.read_text())]
    assert any(line.startswith("make test") for line in readme_lines), readme_lines
    bad = [b for p in [README, *PAGES] for b in _bad_commands(p)]
    assert not bad, "\n".join(bad)


def test_the_ci_runs_the_readmes_test_command():
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    readme = [line.split("#", 1)[0].strip() for _, line in _bash_blocks(README.read_text())]
    assert ci[-1] in readme and ci[-1] == "make test", (ci[-1], readme)


def test_the_anchors_follow_githubs_rules():
    assert (
        anchor("The production loop (`abpo/monthly`, `abpo/arms`, `abpo/sim`, `dags/abpo_monthly.py`)")
        == "the-production-loop-abpomonthly-abpoarms-abposim-dagsabpo_monthlypy"
    )
    assert anchor("What it refuses (round 3, config and UI)") == "what-it-refuses-round-3-config-and-ui"
    assert anchor("The paper's table: `abpo experiment`") == "the-papers-table-abpo-experiment"


@pytest.mark.parametrize(
    "text, want",
    [
        ("see [x](docs/nosuch.md)", "README.md:1: link (docs/nosuch.md): no file docs/nosuch.md"),
        (
            "a\n\nsee [x](docs/loop.md#nosuch)",
            "README.md:3: link (docs/loop.md#nosuch): no heading with anchor #nosuch",
        ),
        ("see [x](#nosuch-here)", "README.md:1: link (#nosuch-here): no heading with anchor #nosuch-here"),
    ],
)
def test_the_link_check_catches_a_broken_link(text, want):
    assert any(b.startswith(want) for b in _broken_links(README, text)), _broken_links(README, text)


def test_the_link_check_passes_good_links_and_skips_code():
    text = (
        "# Top\n\n[a](#top) [b](docs/loop.md) [c](https://example.com/x)\n```\n[d](nosuch.md)\n```\n`[e](nosuch.md)`\n"
    )
    assert _broken_links(README, text) == []


def test_the_command_check_catches_what_does_not_exist():
    text = (
        "```bash\nmake tset   # a typo\n.venv/bin/abpo experimnt --split validation\n.venv/bin/nosuchtool\n"
        "bash scripts/nosuch.sh && .venv/bin/python benchmarks/nosuch.py\nmake test\n"
        ".venv/bin/abpo arms month --month 2026-01\n```\n"
    )
    bad = _bad_commands(README, text)
    assert [b.split(": ", 1)[0] for b in bad] == [
        "README.md:2",
        "README.md:3",
        "README.md:4",
        "README.md:5",
        "README.md:5",
    ], bad
    assert "make target 'tset'" in bad[0] and "`abpo experimnt`" in bad[1] and ".venv/bin/nosuchtool" in bad[2]
    assert "scripts/nosuch.sh" in bad[3] and "benchmarks/nosuch.py" in bad[4]


# --- no project bookkeeping on what a user reads --------------------------------------------------------------------

# The project's own tickets ("issue 60", "Issue 49's", an anchor's "issue-60", "(#42)"), its work sessions ("stop 61"),
# commit hashes (HASH above) and paths of one machine ("/tmp/demo61", "/work/..."). A `#N` after a word is another
# project's ticket (great_expectations#10738), a colour (#333) or an entry (entry #2): only "(#N)", "in #N", "see #N".
# A duration such as "3000000d" (digits and one unit letter) is no commit hash.
BOOKKEEPING_HASH = re.compile(r"(?![0-9]+[a-f](?![0-9a-f]))" + HASH.pattern)
BOOKKEEPING = re.compile(
    r"\bissues?[\s-]+#?\d+\b"
    r"|\(#\d{1,5}\)|\b(?:in|see|fixed|PR|ticket)\s+#\d{1,5}\b"
    r"|\bstops?[\s-]+\d+\b"
    r"|(?<![\w.~$-])/(?:tmp|work)\b",
    re.I,
)
BOOKKEEPING_DIRS = ("docs", "configs", "dags", "plugins", "abpo")
BOOKKEEPING_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".html", ".txt"}
EXPERIMENTS = REPO / "docs" / "experiments"  # the dated experiment records: runs, dates, commits and all


def _bookkeeping_files() -> list[Path]:
    files = [README]
    for d in BOOKKEEPING_DIRS:
        files += [
            p
            for p in sorted((REPO / d).rglob("*"))
            if p.is_file() and p.suffix in BOOKKEEPING_SUFFIXES and EXPERIMENTS not in p.parents
        ]
    return files


def _bookkeeping(path: Path, text: str | None = None) -> list[str]:
    """``file:line: `found` in `line``` for each ticket, session, commit or machine path ``path`` names."""
    text = path.read_text() if text is None else text
    bad = []
    for n, line in enumerate(text.splitlines(), 1):
        found = [m.group(0) for m in BOOKKEEPING.finditer(line)] + [m.group(0) for m in BOOKKEEPING_HASH.finditer(line)]
        bad += [f"{path.relative_to(REPO)}:{n}: `{f}` in `{line.strip()[:160]}`" for f in found]
    return bad


def test_no_ticket_session_commit_or_machine_path_on_what_a_user_reads():
    files = _bookkeeping_files()
    assert len(files) > 100 and REPO / "docs" / "loop.md" in files and REPO / "dags" / "abpo_monthly.py" in files
    bad = [b for p in files for b in _bookkeeping(p)]
    assert not bad, (
        f"{len(bad)} references to the project's bookkeeping; rule: a user page, config or code comment says the "
        "reason, not the ticket, session, commit or machine (the run's record goes to docs/experiments/):\n"
        + "\n".join(bad)
    )


@pytest.mark.parametrize(
    "text, found",
    [
        ("as before issue 42, then Issue 49's G", ["issue 42", "Issue 49"]),
        ("see [x](gate.md#does-the-gate-let-a-climb-through-issue-60-point-6)", ["issue-60"]),
        ("fixed (#42) and in #7.", ["(#42)", "in #7"]),
        ("stop 61's run, `/tmp/demo61`, /work/main/x", ["stop 61", "/tmp", "/work"]),
        ("measured at 8f0305d (b819548)", ["8f0305d", "b819548"]),
        (
            "step 5, v1.2.3, 2026-11-29, #abcdef1, color: #333; fill:#123, &#123; great_expectations#10738, "
            "sha256 " + "ab12" * 16 + ", an issue, stopped 3 times, ~/tmp/x, $TMPDIR/tmp, 1e-4, 12 issues, entry #2, "
            "timeout 3000000d",
            [],
        ),
    ],
)
def test_the_bookkeeping_check_catches_what_it_should(text, found):
    got = [b.split(": `", 1)[1].split("` in `", 1)[0] for b in _bookkeeping(README, text)]
    assert sorted(got) == sorted(found), got


# ------------------------------------------------------------------ docs/reference/config.md, generated and checked
CONFIG_REFERENCE = REPO / "docs" / "reference" / "config.md"
CONFIG_INTRO = """# Config reference

Reference: every key of abpo's config, its default, its meaning and its allowed values, section by section. It is the
table `abpo config --explain` prints (without a preset's values and their sources), generated from the same fields
(`abpo.config.describe`): regenerate it with `.venv/bin/python -m tests.test_docs`; `tests/test_docs.py` fails when
it drifts from the code. It assumes [the `abpo` command](../cli.md#the-abpo-command) (how `--config`, `--set`,
`extends:` and the environment combine); what a refused value prints is in [errors and
refusals](refusals.md#config-files-and-values).

To see the values of one preset and where each came from: `abpo config --config demo --explain`. Which keys a DAG
trigger may override: [the DAG's reference](dag.md#params).
"""


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("*", "\\*").replace("<", "&lt;").replace("\n", " ").strip()


def config_reference() -> str:
    """docs/reference/config.md as abpo.config.describe (the fields behind `abpo config --explain`) gives it."""
    from abpo.config import Config, describe

    sections: dict[str, list[tuple[str, object, str]]] = {}
    for key, default, help_text in describe(Config):
        sections.setdefault(key.split(".")[0] if "." in key else "top level", []).append((key, default, help_text))
    out = [CONFIG_INTRO]
    for name, rows in sections.items():
        out.append(f"\n## {name}\n\n| key | default | meaning |\n|---|---|---|\n")
        out += [f"| `{key}` | `{default!r}` | {_cell(help_text) or '-'} |\n" for key, default, help_text in rows]
    return "".join(out)


def test_the_config_reference_is_what_abpo_config_explain_describes():
    text = config_reference()
    assert text.count("| `") > 200 and "`update.learning_rate`" in text
    assert CONFIG_REFERENCE.read_text() == text, (
        "docs/reference/config.md differs from the config's fields; rule: it is generated, regenerate it with "
        "`.venv/bin/python -m tests.test_docs`"
    )


if __name__ == "__main__":
    CONFIG_REFERENCE.write_text(config_reference())
    print(f"wrote {CONFIG_REFERENCE.relative_to(REPO)}")


# ------------------------------------------------------------------ docs/reference/dag.md against the DAG
DAG_REFERENCE = REPO / "docs" / "reference" / "dag.md"


def _dag_reference_gaps() -> list[str]:
    """What docs/reference/dag.md lacks of the DAG's params, overridable keys, $ABPO_* settings, arms and routes."""
    from abpo.arms.names import ARMS
    from abpo.monthly.overrides import OVERRIDE_ALLOWED

    text = DAG_REFERENCE.read_text()
    dag = (REPO / "dags" / "abpo_monthly.py").read_text()
    params = re.findall(r'^\s+"(\w+)": Param\(', dag, re.M)
    settings = set(re.findall(r'environ\.get\("(ABPO_\w+)"', (REPO / "abpo/monthly/dag_settings.py").read_text()))
    routes = re.findall(r'@app\.get\("([^"]+)"', (REPO / "plugins" / "abpo_plugin.py").read_text())
    gaps = [f"param `{p}`" for p in params if f"| `{p}` |" not in text]
    gaps += [f"override key `{k}`" for k in OVERRIDE_ALLOWED if f"`{k}`" not in text]
    gaps += [f"variable `{v}`" for v in sorted(settings) if f"| `{v}` |" not in text]
    gaps += [f"arm {a}" for a in ARMS if a not in text.split("## Tasks", 1)[1].split("##", 1)[0]]
    gaps += [f"route /abpo{r}" for r in routes if f"`/abpo{r.replace('{path:path}', '{path}')}`" not in text]
    listed = text.split("OVERRIDE_ALLOWED`:", 1)[1].split("Every other key", 1)[0]
    gaps += [
        f"key `{k}` listed but not overridable" for k in re.findall(r"`([^`]+)`", listed) if k not in OVERRIDE_ALLOWED
    ]
    return gaps


def test_the_dag_reference_lists_its_params_keys_settings_arms_and_routes():
    assert not _dag_reference_gaps(), _dag_reference_gaps()


def test_the_loops_arm_table_has_every_arm_of_the_registry():
    from abpo.arms.names import ARMS

    text = (REPO / "docs" / "loop.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| ", text.split("| arm | what serves |", 1)[1].split("\n\n", 1)[0], re.M)
    assert sorted(rows) == sorted(ARMS), f"docs/loop.md's arm table: {rows}; rule: one row per arm of {list(ARMS)}"


# ------------------------------------------------------------------ docs/README.md: every page by its kind
INDEX = REPO / "docs" / "README.md"
KINDS = ("Tutorial", "How-to", "Reference", "Explanation")


def _index_kinds(text: str) -> dict[Path, str]:
    """Each page docs/README.md links, with the kind of the section (## Tutorial, ...) that lists it."""
    kinds: dict[Path, str] = {}
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        kind = section.split("\n", 1)[0].strip()
        for _, target in _links(section):
            page = (INDEX.parent / target.partition("#")[0]).resolve()
            if kind in KINDS and EXPERIMENTS not in page.parents and page.parent != REPO:
                kinds[page] = kind
    return kinds


def _label(path: Path, text: str | None = None) -> str:
    """The kind a page's first paragraph after its title says it is ("How-to: ..."), or ""."""
    text = path.read_text() if text is None else text
    first = text.split("\n", 1)[1].strip().split("\n\n", 1)[0]
    return next((k for k in KINDS if first.startswith(f"{k}:") or first.startswith(f"{k},")), "")


def test_the_docs_index_lists_every_page_under_the_kind_it_says_it_is():
    kinds = _index_kinds(INDEX.read_text())
    pages = [p for p in PAGES if p != INDEX]
    unlisted = [str(p.relative_to(REPO)) for p in pages if p.resolve() not in kinds]
    assert not unlisted, f"docs/README.md lists no kind for {unlisted}; rule: every page of docs/ under one kind"
    wrong = [
        f"{p.relative_to(REPO)}: says {_label(p) or 'no kind'!r}, listed under {kinds[p.resolve()]!r}"
        for p in pages
        if _label(p) != kinds[p.resolve()]
    ]
    assert not wrong, (
        "rule: a page's first paragraph starts with its kind (Tutorial:, How-to:, Reference:, Explanation:), "
        "the one docs/README.md lists it under:\n" + "\n".join(wrong)
    )
    assert kinds[(REPO / "docs" / "gate.md").resolve()] == "Explanation"


def test_the_kind_check_reads_a_pages_first_paragraph():
    assert _label(INDEX, "# T\n\nHow-to: land a month.\n\nReference: no\n") == "How-to"
    assert _label(INDEX, "# T\n\nThis page explains.\n") == ""
    text = "# Docs\n\n## How-to\n\n- [a](operations.md)\n\n## Reference\n\n- [b](reference/dag.md)\n"
    assert _index_kinds(text) == {
        REPO / "docs" / "operations.md": "How-to",
        REPO / "docs/reference/dag.md": "Reference",
    }


def test_the_readme_links_the_docs_index():
    assert "(docs/README.md)" in README.read_text()
