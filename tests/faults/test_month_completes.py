"""A month with an arm at 0 clicks (and one at every click) completes (issue 18, item 1): the cycle's last step,
report_to_date (what `abpo arms month` and the DAG's report task run), writes the report from the warehouse and marks
the month complete, so the next month is not refused. Before, the plot's negative error bar failed the report and
every later month stayed blocked."""

from __future__ import annotations

from abpo.arms.cycle import require_previous_month, report_to_date
from abpo.config import load_config
from abpo.data.schemas import write_impressions
from abpo.data.synthetic import synthetic_impressions
from abpo.warehouse import ingest_with_config


def test_a_month_with_a_zero_click_and_an_all_click_arm_completes(state):
    cfg = load_config("tiny")
    ctr = {"abpo": 0.0, "grpo": 1.0, "ml_retrain": 0.2, "popularity": 0.1}
    for month in ("2026-01", "2026-02"):
        table, _ = synthetic_impressions(800, month, seed=3, violation_rate=0.0, ctr=ctr, n_users=300)
        write_impressions(table, cfg.paths.resolve("landing"), month, part="sim")
        report, _ = ingest_with_config(cfg, month)
        assert report.rows_quarantined == 0 and report.audit.success
        out = report_to_date(cfg, month, echo=lambda *_: None)
        assert out["months"][-1] == month
        for key in ("html", "markdown", "png"):
            assert out[key] and __import__("pathlib").Path(out[key]).is_file()
    require_previous_month(cfg, "2026-03")  # nothing blocks the next month
    assert (cfg.paths.resolve("root") / "cycle" / "2026-02.json").is_file()
