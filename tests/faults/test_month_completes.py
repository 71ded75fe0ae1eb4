"""A month with an arm at 0 clicks (and one at every click) completes (issue 18, item 1): the cycle's last step,
report (what `abpo arms month` and the DAG's report task run), writes the report from the warehouse and marks
the month complete, so the next month is not refused. Before, the plot's negative error bar failed the report and
every later month stayed blocked."""

from __future__ import annotations

import pytest

from abpo.config import load_config
from abpo.data.schemas import write_impressions
from abpo.data.synthetic import synthetic_impressions
from abpo.monthly.report import report, require_previous_month
from abpo.warehouse import config_catalog, ingest_with_config
from tests.sizes import MONTH


def test_a_month_with_a_zero_click_and_an_all_click_arm_completes(state):
    cfg = load_config("tiny")
    ctr = {"abpo": 0.0, "grpo": 1.0, "ml_retrain": 0.2, "popularity": 0.1}
    for month in ("2026-01", "2026-02"):
        table, _ = synthetic_impressions(
            800, month, seed=3, violation_rate=0.0, ctr=ctr, n_users=300, item_ids=config_catalog(cfg)
        )
        write_impressions(table, cfg.paths.resolve("landing"), month, part="sim")
        landed, _ = ingest_with_config(cfg, month)
        assert landed.rows_quarantined == 0 and landed.audit.success
        out = report(cfg, month)
        assert out.months[-1] == month
        for path in (out.html, out.markdown, out.png):
            assert path and __import__("pathlib").Path(path).is_file()
    require_previous_month(cfg, "2026-03")  # nothing blocks the next month
    assert (cfg.paths.resolve("root") / "cycle" / "2026-02.json").is_file()


ZERO_CLICK_MONTH = [
    *MONTH,
    "sim.click_next=0.0",
    "sim.click_soon=0.0",
    "sim.base_ctr=0.0",
]


@pytest.mark.slow
def test_a_simulated_month_where_no_arm_gets_a_click_completes(tmp_path, pi_init_state):
    """The whole cycle (`abpo arms month --simulate`'s run_month: bootstrap, serve, ingest, updates, refits, report)
    on a month in which every arm is at 0 clicks: the LLM updates are skipped for want of positive feedback, the
    report is written, the month is marked complete and the next month is not refused."""
    from abpo.monthly.month import run_month

    cfg = load_config("tiny", [f"paths.root={tmp_path / 'var'}", *ZERO_CLICK_MONTH])
    pi_init_state(cfg)  # pi_init trained once per session at these sizes (tests/conftest.py)
    out = run_month(cfg, "2026-01").to_json()
    per_arm = out["serve"]["per_arm"]
    assert per_arm and all(v["clicks"] == 0 for v in per_arm.values()), per_arm
    assert all("skipped" in out[a] for a in ("abpo", "grpo")), {a: out[a] for a in ("abpo", "grpo")}
    assert __import__("pathlib").Path(out["report"]["html"]).is_file()
    require_previous_month(cfg, "2026-02")
