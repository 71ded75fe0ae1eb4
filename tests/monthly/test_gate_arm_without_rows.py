"""An LLM arm that served nothing in a month (issue 59, point 2) does not wedge the pipeline. With the default
``arms.update_logs = all`` the arm still updates, on the other arms' rows, and registers a challenger; its gate then
raised ``ValueError: off-policy gate abpo v2: no logged rows of arm abpo in 2026-01`` as a traceback, every rerun
failed the same way and the next month was refused. Now the gate reads every arm's rows as for any arm (SNIPS on the
arm's own rows recorded as not computed), its verdict says the arm served none of them, the month completes, a rerun
changes nothing, and the next month may start.

The whole month (`abpo arms month --simulate`'s run_month) on the tiny preset, shrunk (tests/sizes.py's RERUN_MONTH:
abpo and popularity, the champion adopted, 2 update steps): abpo's share is 5e-5, below every user's assignment
hash (the smallest of the bundled MovieLens' 610 users is 9.6e-5), so the simulated serve routes no user to it.
Real simulator, DuckDB, GX and MLflow; slow because the update trains."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest

from tests.sizes import RERUN_MONTH, without

SERVED_NOTHING = [
    *without(RERUN_MONTH, "arms.update_logs", "report.arm_shares"),
    "report.arm_shares={abpo: 0.00005, popularity: 0.99995}",  # the first arm's interval of the hash: [0, 5e-5)
]


@pytest.mark.slow
def test_an_llm_arm_that_served_nothing_is_gated_and_the_month_completes(tmp_path, build_tiny_model):
    from abpo.arms import versions as arm_versions
    from abpo.config import load_config
    from abpo.monthly.adopt import adopt_model
    from abpo.monthly.common import dataset_and_splits
    from abpo.monthly.month import run_month
    from abpo.monthly.report import month_completed, require_previous_month
    from abpo.warehouse import open_warehouse

    cfg = load_config("tiny", [f"paths.root={tmp_path / 'state'}", *SERVED_NOTHING])
    assert cfg.arms.update_logs == "all"  # the default: an arm updates on every arm's rows
    ds, _ = dataset_and_splits(cfg)
    adopt_model(cfg, "abpo", build_tiny_model(cfg.policy, ds.titles()))  # the first champion, without SFT

    first = run_month(cfg, "2026-01").to_json()
    with open_warehouse(cfg, read_only=True) as wh:
        pos, neg = wh.strata(["2026-01"])
    arms = set(pos.column("arm").to_pylist()) | set(neg.column("arm").to_pylist())
    assert arms == {"popularity"}, arms  # abpo served nothing
    n = pos.num_rows + neg.num_rows

    abpo = first["abpo"]
    assert abpo["update"]["parent_version"] == "1" and abpo["register"]["version"] == "2", abpo  # it updated
    gate = abpo["gate"]
    assert gate["off_policy"]["own_rows"] == 0 and gate["off_policy"]["n"] == n, gate["off_policy"]
    assert f"on {n} every arm's rows, none of them the arm's own" in gate["reason"], gate["reason"]
    assert gate["off_policy"]["estimates"]["snips"]["n"] == 0
    assert gate["passed"] is True  # tests/sizes.py's GATE_PASSES: the margins admit it
    assert abpo["promote"]["promoted"], abpo["promote"]
    tags = arm_versions.get_version(cfg, "abpo", "2").tags
    assert tags["gate.verdict"] == "pass" and "none of them the arm's own" in tags["gate.reason"]
    assert month_completed(cfg, "2026-01")

    again = run_month(cfg, "2026-01").to_json()  # a rerun: every step found completed, the same verdict
    assert again["abpo"]["gate"]["reason"] == gate["reason"]
    require_previous_month(cfg, "2026-02")  # the next month is not refused
    assert pc.sum(pos.column("clicked")).as_py() > 0
