"""Arms: exact propensities (empirical exposure frequencies within 3 standard errors of the stated ones), rankers
that survive saving and loading, and the DAG's static arm lists agreeing with abpo.arms."""

from __future__ import annotations

import numpy as np
import pytest


def _popularity_arm(temperature=0.5):
    from abpo.arms.rankers import RankerArm
    from abpo.baselines.popularity import PopularityRanker

    r = PopularityRanker().fit({1: [10, 11, 12, 10], 2: [10, 12, 13], 3: [10, 14]}, [10, 11, 12, 13, 14, 15])
    return RankerArm("popularity", r, temperature, "7")


def test_exposure_frequencies_match_the_stated_propensities():
    from abpo.arms.base import expose

    arm = _popularity_arm()
    req = (5, [11], [15, 13, 12, 10])
    (p,) = arm.propensities([req])
    assert np.all(p > 0) and p.sum() == pytest.approx(1.0)
    n = 40000
    u = np.random.default_rng(12345).random(n)  # one fixed draw; P(any of 4 items beyond 3 SE) ~ 1%
    out = expose(arm, [req] * n, u.tolist())
    stated = {e.item_id: e.propensity for e in out}
    assert stated == pytest.approx(dict(zip(req[2], p)))  # the propensity logged is the item's exact probability
    assert {e.model_version for e in out} == {"7"} and out[0].logging_policy.startswith("softmax(")
    for item, prob in zip(req[2], p):
        freq = np.mean([e.item_id == item for e in out])
        assert abs(freq - prob) <= 3 * np.sqrt(prob * (1 - prob) / n), (item, freq, prob)


def test_expose_refuses_a_distribution_with_a_zero():
    from abpo.arms.base import expose

    class Broken:
        name, model_version, logging_policy = "x", "1", "rule"

        def propensities(self, requests):
            return [np.array([1.0, 0.0]) for _ in requests]

    with pytest.raises(ValueError, match="probability > 0"):
        expose(Broken(), [(1, [], [1, 2])], [0.5])


@pytest.mark.parametrize("name", ["popularity", "ml_retrain"])
def test_rankers_round_trip_through_their_files(tmp_path, name):
    from abpo.arms.rankers import RankerArm
    from abpo.config import load_config

    cfg = load_config("tiny", ["arms.ml_retrain.iterations=3", "arms.popularity.temperature=0.25"])
    rng = np.random.default_rng(0)
    seqs = {u: rng.choice(np.arange(1, 41), size=8, replace=False).tolist() for u in range(30)}
    arm = RankerArm.refresh(name, cfg, sequences=seqs, item_ids=list(range(1, 41)))
    assert arm.temperature == {"popularity": 0.25, "ml_retrain": 0.1}[name]  # the arm's own config block
    if name == "ml_retrain":
        assert arm.ranker.params["iterations"] == 3
    back = RankerArm.load(name, arm.save(tmp_path / name), model_version="4")
    assert back.temperature == arm.temperature and back.model_version == "4"
    assert back.logging_policy == arm.logging_policy
    reqs = [(0, [1, 2, 3], [4, 5, 6, 7]), (1, [9], [10, 20, 30])]
    for a, b in zip(arm.propensities(reqs), back.propensities(reqs)):
        np.testing.assert_allclose(a, b)


def test_ranker_pyfunc_serves_propensities(tmp_path):
    import json

    import pandas as pd

    from abpo.arms.serving import _load_pyfunc

    arm = _popularity_arm(temperature=0.5)
    d = arm.save(tmp_path / "p")
    assert json.loads((d / "arm.json").read_text()) == {"arm": "popularity", "temperature": 0.5}
    out = _load_pyfunc(str(d)).predict(pd.DataFrame({"history_item_ids": [[11]], "candidate_ids": [[15, 13, 12, 10]]}))
    np.testing.assert_allclose(out["propensities"][0], arm.propensities([(0, [11], [15, 13, 12, 10])])[0])
    assert out["ranked_item_ids"][0][0] == 10


def test_dag_arm_lists_agree_with_the_package():
    import ast
    from pathlib import Path

    from abpo.arms.names import ARMS, HOLDBACK_ARMS, LLM_ARMS, RANKER_ARMS, arm_class

    tree = ast.parse((Path(__file__).resolve().parents[2] / "dags" / "abpo_monthly.py").read_text())
    imported = {
        a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "abpo.arms.names" for a in n.names
    }
    assert "ARMS" in imported  # the DAG takes its arms from the one registry
    assert not any(
        isinstance(n, ast.Assign) and any(getattr(t, "id", "") in ("LLM_ARMS", "RANKER_ARMS") for t in n.targets)
        for n in tree.body
    )  # and spells none
    for name, e in ARMS.items():  # every registered arm names a class of its kind
        assert arm_class(name).kind == e.kind and (name in LLM_ARMS) == (e.kind == "llm")
    assert set(LLM_ARMS) | set(RANKER_ARMS) | set(HOLDBACK_ARMS) == set(ARMS) and HOLDBACK_ARMS == ("holdback",)


def test_the_holdback_is_never_refreshed_adopted_updated_or_promoted(make_cfg):
    """The holdback serves like an LLM arm (its class is an LLMArm) but every step that would change its model refuses
    it, naming the arm and the rule."""
    from abpo.arms import promotion, promotion_lock
    from abpo.arms.llm import HoldbackArm, LLMArm
    from abpo.arms.names import arm_class, entry
    from abpo.monthly.adopt import ModelRefused, adopt_model
    from abpo.monthly.hold import hold
    from abpo.monthly.update import update

    cfg = make_cfg()
    assert arm_class("holdback") is HoldbackArm and issubclass(HoldbackArm, LLMArm)
    assert entry("holdback").refreshed_by == "none"  # variant (A): no update
    with pytest.raises(RuntimeError, match="a holdback arm is never refreshed"):
        HoldbackArm.refresh("holdback", cfg)
    with pytest.raises(ValueError, match="'holdback' is a holdback arm; rule: one of"):
        update(cfg, "holdback", "2026-01")
    with pytest.raises(ModelRefused, match="'holdback' is a holdback arm; rule: adopt takes an LLM arm"):
        adopt_model(cfg, "holdback", "/nonexistent")
    with pytest.raises(
        promotion_lock.HoldbackNeverPromoted, match="arm holdback is a holdback; rule: its champion stays pi_init"
    ):
        promotion.promote(cfg, "holdback", "2")
    with pytest.raises(ValueError, match="'abpo' is a llm arm; rule: one of \\['holdback'\\]"):
        hold(cfg, "abpo", "2026-01")


def test_promote_refuses_a_race_and_rollback_restores_the_previous_champion(tmp_path):
    from abpo.arms import promotion, promotion_lock, versions as arm_versions
    from abpo.config import load_config
    from abpo.monthly.refit import refit

    cfg = load_config("tiny", [f"paths.root={tmp_path}", "data.max_users=40"])
    assert refit(cfg, "popularity", None).version == "1"
    other = load_config("tiny", [f"paths.root={tmp_path}", "data.max_users=40", "seed=1"])  # another config: a new fit
    assert refit(other, "popularity", None).version == "2"
    champ = arm_versions.get_version(cfg, "popularity", "champion")
    assert str(champ.version) == "2" and champ.tags["promoted_from"] == "1"
    # a retried promote task (its first attempt moved the alias) is a no-op, not a race
    assert promotion.promote(cfg, "popularity", "2", expected_champion="1")["champion"] == "2"
    with pytest.raises(promotion_lock.PromotionRace, match="not the expected v1"):
        promotion.promote(cfg, "popularity", "1", expected_champion="1")
    assert str(arm_versions.get_version(cfg, "popularity", "champion").version) == "2"  # the race changed nothing
    out = promotion.rollback(cfg, "popularity", reason="bad CTR")
    assert out == {"arm": "popularity", "champion": "1", "previous": "2"}
    v2 = arm_versions.get_version(cfg, "popularity", "2")
    assert v2.tags["rolled_back_to"] == "1" and v2.tags["rolled_back_reason"] == "bad CTR"
    assert str(arm_versions.get_version(cfg, "popularity", "champion").version) == "1"
    with pytest.raises(LookupError, match="no previous champion"):
        promotion.rollback(cfg, "popularity")


def test_a_month_whose_predecessor_never_finished_refuses_to_start(tmp_path):
    from abpo.config import load_config
    from abpo.data.schemas import write_impressions
    from abpo.data.synthetic import synthetic_impressions
    from abpo.monthly.report import PreviousMonthIncomplete, mark_month_complete, require_previous_month
    from abpo.warehouse import Warehouse

    cfg = load_config("tiny", [f"paths.root={tmp_path}"])
    require_previous_month(cfg, "2026-01")  # nothing ingested yet: fine
    table, _ = synthetic_impressions(50, "2026-01", seed=0)
    write_impressions(table, cfg.paths.resolve("landing"), "2026-01", part="a")
    with Warehouse(cfg.paths.resolve("warehouse")) as wh:
        wh.ingest_month(cfg.paths.resolve("landing"), "2026-01", cfg.data.known_arms)
    with pytest.raises(PreviousMonthIncomplete, match=r"\['2026-01'\].*rerun abpo_monthly for 2026-01"):
        require_previous_month(cfg, "2026-02")
    require_previous_month(cfg, "2026-01")  # rerunning the unfinished month itself is allowed
    mark_month_complete(cfg, "2026-01", {"report": "x"})
    require_previous_month(cfg, "2026-02")


def test_a_retried_register_reuses_the_version_its_run_registered(tmp_path):
    import json

    from abpo import registry
    from abpo.arms import versions as arm_versions
    from abpo.config import load_config

    cfg = load_config("tiny", [f"paths.root={tmp_path}"])
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with registry.start_run(cfg, arm_versions.EXPERIMENT, "update") as run:
        uri = arm_versions.log_arm_model(cfg, "abpo", ckpt)
    a = arm_versions.register_version(cfg, "abpo", uri, run.info.run_id, {"source": "update"}, alias="challenger")
    b = arm_versions.register_version(cfg, "abpo", uri, run.info.run_id, {"source": "update"}, alias="challenger")
    assert str(a.version) == str(b.version) == "1"
    from mlflow import MlflowClient

    assert len(MlflowClient().search_model_versions("name='abpo-arm-abpo'")) == 1


def test_a_rerun_refit_reuses_its_completed_run_and_version(tmp_path, caplog):
    """Same data, same config: the second refit finds the first one's completed MLflow run (task key) and returns its
    version; nothing is fitted, logged or registered twice."""
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.arms import versions as arm_versions
    from abpo.config import load_config
    from abpo.monthly.refit import refit

    cfg = load_config("tiny", [f"paths.root={tmp_path}", "data.max_users=40"])
    with caplog.at_level("INFO", logger="abpo"):
        first = refit(cfg, "popularity", None)
        again = refit(cfg, "popularity", None)
    assert (first.version, first.months) == (again.version, again.months) and first.version == "1"
    assert first.moved and not again.moved  # only the first one moved the champion (the DAG's Asset event)
    assert any("completed before" in r.getMessage() for r in caplog.records)
    client = MlflowClient()
    assert len(client.search_model_versions("name='abpo-arm-popularity'")) == 1
    exp = client.get_experiment_by_name(arm_versions.EXPERIMENT)
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`abpo.arm` = 'popularity'")
    assert [r.info.status for r in runs] == ["FINISHED"] and runs[0].data.tags[registry.TASK_DONE_TAG] == "true"


def test_register_version_leaves_the_champion_to_the_promotion_lock():
    """The champion moves only under the arm's promotion lock (abpo.arms.promotion.register_champion): asked to set
    it, register_version refuses before it registers anything."""
    from abpo.arms import versions as arm_versions
    from abpo.config import load_config

    with pytest.raises(ValueError, match=r"alias='champion'.*abpo\.arms\.promotion\.register_champion"):
        arm_versions.register_version(load_config("tiny"), "abpo", "runs:/0/model", "0", {}, alias="champion")


def test_an_llm_arms_propensities_at_several_temperatures_come_from_one_scoring(build_tiny_model):
    """LLMArm.propensities_at (benchmarks/budget_curve.py's exposures at tau 1, 0.5, 0.25): softmax(s_p / tau) of
    the same scores at each tau, the arm's own tau giving exactly LLMArm.propensities."""
    from abpo.arms.llm import LLMArm
    from abpo.config import load_config
    from abpo.data.loaders import load_dataset

    cfg = load_config("tiny", ["data.max_users=10"])
    ds = load_dataset(cfg.data)
    arm = LLMArm.load("abpo", build_tiny_model(cfg.policy, ds.titles()), cfg, dataset=ds, model_version="1")
    items = sorted(ds.titles())[:12]
    reqs = [(1, items[:3], items[3:8]), (2, items[5:6], items[8:12])]
    at = arm.propensities_at(reqs, [1.0, 0.5, cfg.policy.tau])
    for a, b in zip(at[cfg.policy.tau], arm.propensities(reqs), strict=True):
        np.testing.assert_array_equal(a, b)
    for p1, p05 in zip(at[1.0], at[0.5], strict=True):
        assert p1.sum() == pytest.approx(1.0) and p05.sum() == pytest.approx(1.0)
        # the same scores s at both: softmax(s / 0.5) is softmax(s)^2 renormalised
        np.testing.assert_allclose(p05, p1**2 / (p1**2).sum(), rtol=1e-6)  # the softmax runs in float32
