"""The report's gate section (issue 42 point 5, abpo.monthly.gate_report): each gate's offline test (which one, its
difference, bound against -margin, statistic and p) and off-policy half (the estimator that decided, its interval
against -margin, the others beside it), read back from the gate runs' recorded results in a real MLflow store and
added to a written report's Markdown and HTML."""

from __future__ import annotations

import numpy as np
import pytest

from abpo.config import load_config
from abpo.monthly.gate import GateResult, ope_estimates_on_rows, ope_numbers
from abpo.monthly.gate_report import add_gate_section, gate_row, gate_section_markdown, month_gates
from abpo.monthly.gate_verdict import gate_verdict


def _gate(arm="abpo", version="3", estimator="dr", seed=0) -> GateResult:
    rng = np.random.default_rng(seed)
    n, k = 300, 5
    p = rng.dirichlet(np.ones(k), n)
    logged = np.array([rng.choice(k, p=row) for row in p])
    est = ope_estimates_on_rows(
        candidates=[list(range(10 * i, 10 * i + k)) for i in range(n)],
        logged_items=[10 * i + j for i, j in enumerate(logged)],
        history_lengths=[3] * n,
        clicked=(rng.random(n) < 0.1).astype(int),
        e0=p[np.arange(n), logged],
        challenger=list(p**1.5 / (p**1.5).sum(axis=1, keepdims=True)),
        champion=list(p),
        users=list(np.arange(n) // 3),
        own=np.arange(n) % 2 == 0,
        n_boot=100,
        seed=seed,
    )
    ope = dict(ope_numbers(est, estimator), margin=0.05)
    new, old = [3] * 2 + [40] * 398, [9] * 2 + [3] * 3 + [40] * 395
    v = gate_verdict(
        metric="HR@5",
        challenger_ranks=new,
        champion_ranks=old,
        margin=0.02,
        challenger_version=version,
        champion_version="2",
        ope=ope,
        ope_margin=0.05,
        min_ess=10.0,
    )
    return GateResult(
        arm=arm,
        version=version,
        champion_version="2",
        passed=v.passed,
        reason=v.reason,
        metric="HR@5",
        challenger={},
        champion={},
        off_policy=ope,
        offline=v.offline,
    )


def test_a_row_shows_both_halves_and_what_decided():
    g = _gate().to_json() | {"month": "2026-02"}
    row = gate_row(g)
    verdict = "PASS" if g["passed"] else "FAIL"
    assert row[:6] == ["2026-02", "abpo", "v3 vs v2", verdict, "both", "Tango score"]
    off, ope = g["offline"], g["off_policy"]
    assert row[6] == f"{off['diff']:+.4f} (2/3)" and row[7] == f"{off['lower']:+.4f} vs -0.0200"
    assert row[8] == f"z {off['statistic']:.2f}, p {off['p_value']:.3g}"
    assert row[9] == "DR (every arm's, 300)"
    assert row[10] == f"{ope['diff']:+.4f} [{ope['ci_low']:+.4f}, {ope['ci_high']:+.4f}] vs -0.0500"
    others = row[12].split("; ")
    assert [o.split(" [")[0].rsplit(" ", 1)[0] for o in others] == [
        "SNIPS (the arm's own rows)",
        "DM",
        "IPS",
        "SNIPS",
        "SNDR",
        "Switch-DR",
    ]  # every estimator but the one that decided
    md = gate_section_markdown([g])
    assert "## Gate" in md and "| 2026-02 | abpo | v3 vs v2 |" in md and "arms.gate_ope_estimator" in md


def test_the_off_policy_cell_says_when_its_interval_cannot_be_read_alone():
    """Issue 59 point 8: a month of no-responses showed [+0.0000, +0.0000] with no note; every row clicked, an
    estimate outside [0, 1], an arm that served none of the rows: the cell says so (abpo.monthly.gate_verdict.ope_notes),
    the JSON result read back as the report reads it."""
    g = _gate().to_json() | {"month": "2026-02"}
    assert "(" not in gate_row(g)[10]  # an ordinary month: the interval alone
    ope = g["off_policy"]
    for change, note in [
        ({"clicks": 0}, "every row a no-response: the interval is degenerate; decided on the zero-click bound"),
        ({"clicks": ope["n"]}, "every row clicked: self-normalised estimators are blind"),
        ({"challenger_estimate": 13.1}, "estimate outside [0, 1]: refused"),
        ({"own_rows": 0}, "the arm served none of the month's rows"),
    ]:
        cell = gate_row(g | {"off_policy": ope | change})[10]
        assert cell.startswith(f"{ope['diff']:+.4f} [") and f"vs -0.0500 ({note}" in cell, cell
    assert "(" not in gate_row(g | {"off_policy": {k: v for k, v in ope.items() if k != "clicks"}})[10]  # no clicks


def test_a_row_of_the_redesign_says_the_off_policy_half_decided_and_reads_the_guardrails_upper_bound():
    g = _gate().to_json() | {"month": "2026-02", "decided_by": "off-policy"}
    g["offline"] = g["offline"] | {"upper": 0.0123}
    g["off_policy"] = g["off_policy"] | {"row_set": "heldout"}
    row = gate_row(g)
    assert row[4] == "off-policy" and row[7] == "upper +0.0123 vs -0.0200 (guardrail)"
    assert row[9] == "DR (every arm's, held-out users, 300)"
    assert "Decided by off-policy (arms.gate_primary = ope)" in gate_section_markdown([g])


def test_a_gate_without_the_off_policy_half_says_so():
    g = _gate().to_json() | {"month": "2026-02", "off_policy": None}
    assert gate_row(g)[9:12] == ["not run", "n/a", "n/a"] and gate_row(g)[4] == "offline"
    assert "No gate ran" in gate_section_markdown([])


@pytest.mark.slow  # a real MLflow store: its creation and migrations, ~20 s on a free machine, 100 s at load 9
def test_the_section_reads_the_gate_runs_and_joins_the_report(tmp_path):
    from abpo import registry
    from abpo.monthly.common import start_run

    cfg = load_config("tiny", [f"paths.root={tmp_path}"])
    assert month_gates(cfg, ["2026-02"]) == []  # no store: nothing, and none created
    for arm, version, estimator, month in [
        ("abpo", "3", "dr", "2026-02"),
        ("grpo", "4", "snips", "2026-02"),
        ("abpo", "5", "dr", "2026-03"),
    ]:
        tags = {"abpo.arm": arm, "abpo.month": month, "abpo.challenger": version}
        with start_run(cfg, f"gate-{arm}-v{version}", tags) as run:
            pass
        registry.record_task_result(run.info.run_id, _gate(arm, version, estimator).to_json())
    with start_run(cfg, "update-abpo", {"abpo.month": "2026-02", "abpo.arm": "abpo"}):
        pass  # not a gate
    gates = month_gates(cfg, ["2026-02"])
    assert [(g["month"], g["arm"], g["version"]) for g in gates] == [("2026-02", "abpo", "3"), ("2026-02", "grpo", "4")]
    assert gates[1]["off_policy"]["estimator"] == "snips"
    md, page = tmp_path / "report.md", tmp_path / "report.html"
    md.write_text("# A/B report\n")
    page.write_text("<html><body><h1>A/B report</h1></body></html>")
    add_gate_section(cfg, ["2026-02"], md, page)
    text = md.read_text()
    assert text.startswith("# A/B report\n\n## Gate") and "| 2026-02 | grpo | v4 vs v2 |" in text
    assert "SNIPS (the arm's own rows) (arm's own, " in text
    html = page.read_text()
    assert html.index("<h2>Gate</h2>") < html.index("</body>") and "<td>DR (every arm&#x27;s, 300)</td>" in html
