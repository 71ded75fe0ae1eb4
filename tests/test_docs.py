"""The documents the code points to: docs/ABPO_SPEC.md exists, every reference to the specification names it by that
path, and every section or step a reference names is in it; the README's "Use it with your own stack" section is
near the top and its links resolve."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "docs" / "ABPO_SPEC.md"
SOURCES = [REPO / "README.md", *(REPO / "abpo").rglob("*.py"), *(REPO / "tests").rglob("*.py"), REPO / "dags" /
           "abpo_monthly.py", REPO / "plugins" / "abpo_plugin.py", *(REPO / "configs").glob("*.yaml")]


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
    assert _missing_sections('see docs/ABPO_SPEC.md "The updates" and docs/ABPO_SPEC.md "Metrics / Onlin"',
                             _headings()) == ["The updates", "Metrics / Onlin"]


def test_the_readme_has_a_short_own_stack_section_near_the_top():
    readme = (REPO / "README.md").read_text()
    sections = re.findall(r"^## (.+)$", readme, re.M)
    assert "Use it with your own stack" in sections[:3], sections[:5]
    body = readme.split("## Use it with your own stack", 1)[1].split("\n## ", 1)[0]
    for topic in ("Airflow", "MLflow", "logs", "model", "GPU"):
        assert topic in body, topic
    assert len(body.splitlines()) < 45  # short: it points to the sections that say more
    anchors = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in re.findall(r"^#+ (.+)$", readme,
                                                                                                   re.M)}
    for target in re.findall(r"\]\(([^)]+)\)", body):
        if target.startswith("#"):
            assert target[1:] in anchors, target
        else:
            assert (REPO / target.split("#")[0]).exists(), target
