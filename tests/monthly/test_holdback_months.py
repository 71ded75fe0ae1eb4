"""Two months of the loop (abpo arms month) with the holdback and updates from all traffic (issue 30, points 1 and
2), on the shrunken tiny config of tests/arms/test_cycle.py: the holdback is served with its share, its registered
version never changes and its champion stays pi_init; the LLM arms train on every arm's rows (the holdback's and
the rankers' included) and log the share by logging arm and the first step's SNIPS weights."""

from __future__ import annotations

import pytest

from tests.sizes import FIVE_ARMS, GATE_PASSES, HOLDBACK_ARMS, LIKELY_CLICKS, MONTH

SMALL = [*MONTH, *LIKELY_CLICKS, *GATE_PASSES, "arms.update_max_examples=48", *HOLDBACK_ARMS]


@pytest.mark.slow
def test_two_months_the_holdback_stays_pi_init_and_updates_read_all_traffic(tmp_path, pi_init_state):
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.arms import versions as arm_versions
    from abpo.config import load_config
    from abpo.monthly.month import run_month

    # a gate every challenger passes: the LLM arms' champions move, the holdback's must not
    cfg = load_config("tiny", [f"paths.root={tmp_path}", *SMALL])
    assert cfg.arms.update_logs == "all"  # the default
    pi_init_state(cfg)  # pi_init trained once per session at these sizes (tests/conftest.py)
    registry.configure(cfg)
    holdback = []
    for month in ("2026-01", "2026-02"):
        m = run_month(cfg, month).to_json()
        assert m["serve"]["per_arm"]["holdback"]["impressions"] > 0  # served, with its own share
        assert [s for s in m["ran"] if s.startswith("holdback.")] == ["holdback.hold"]  # never trains
        assert m["holdback"]["hold"]["reason"].startswith(f"holdback: not updated in {month}; champion stays pi_init")
        champ = arm_versions.get_version(cfg, "holdback", "champion")
        holdback.append(str(champ.version))
        assert champ.tags["source"] == "pi_init" and not champ.tags["parent_version"] and champ.tags["months"] == ""
        assert arm_versions.get_version(cfg, "holdback", "challenger") is None  # never registered an update
        versions = MlflowClient().search_model_versions(f"name = '{arm_versions.model_name('holdback')}'")
        assert [v.version for v in versions] == [champ.version]
        served = m["serve"]["per_arm"]
        for arm in ("abpo", "grpo"):
            up = m[arm]["update"]
            assert up["update_logs"] == "all" and set(up["logged_by"]) == set(FIVE_ARMS)  # every arm's rows
            total = sum(served[a]["impressions"] for a in FIVE_ARMS)
            assert up["logged_by"]["holdback"] == pytest.approx(served["holdback"]["impressions"] / total)
            assert up["first_step_w"]["rows"] == 48 and up["first_step_w"]["ess"] <= 48
            run = MlflowClient().get_run(up["run_id"])
            assert run.data.tags["abpo.update_logs"] == "all"
            assert float(run.data.params["logged_by.holdback"]) == pytest.approx(up["logged_by"]["holdback"], 1e-5)
            assert run.data.metrics["first_step_w/ess"] == pytest.approx(up["first_step_w"]["ess"])
        assert m["abpo"]["promote"]["promoted"]  # the updated arms' champions do move
    assert holdback == [holdback[0]] * 2
    assert m["report"]["months"] == ["2026-01", "2026-02"]
