"""benchmarks/simulate.py's robustness table: the markdown and taus on a hand-built case, and every oracle's CTR
of one arm served once (the first table's figure unchanged: the config's oracle at share 1)."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tests.sizes import SIXTY_USERS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_simulate", ROOT / "benchmarks" / "simulate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_robustness_table_orders_each_oracle_against_the_offline_one(bench):
    hr = {"abpo": 0.35, "grpo": 0.34, "ml_retrain": 0.30, "popularity": 0.11}
    ctr = {
        "abpo": {"mixture": 0.07, "als": 0.05, "knn": 0.08},
        "grpo": {"mixture": 0.06, "als": 0.06, "knn": 0.08},
        "ml_retrain": {"mixture": 0.05, "als": 0.07, "knn": 0.06},
        "popularity": {"mixture": 0.04, "als": 0.08, "knn": 0.05},
    }
    lines, taus = bench.robustness_table(hr, ctr, ("mixture", "als", "knn"))
    assert taus["mixture"] == pytest.approx(1.0) and taus["als"] == pytest.approx(-1.0)
    assert 0.8 < taus["knn"] < 1.0  # one tie (abpo = grpo) among the CTRs: tau-b
    assert lines[0] == "| arm | offline HR@5 | sim CTR mixture | sim CTR als | sim CTR knn |"
    assert lines[1] == "|---|---:|---:|---:|---:|"
    assert lines[2] == "| abpo | 0.3500 | 0.0700 | 0.0500 | 0.0800 |"
    assert lines[-1] == "| Kendall tau vs HR@5 | | 1.00 | -1.00 | 0.91 |"
    assert len(lines) == 2 + 4 + 1 and all(line.count("|") == 6 for line in lines)
    _, flat = bench.robustness_table({"a": 0.1, "b": 0.1}, {"a": {"als": 0.1}, "b": {"als": 0.2}}, ("als",))
    assert np.isnan(flat["als"])  # a constant order has no tau


class CountingArm:
    name = "popularity"
    model_version = "1"
    logging_policy = "softmax"

    def __init__(self, arm):
        self.arm = arm
        self.calls = 0

    def propensities(self, requests):
        self.calls += 1
        return self.arm.propensities(requests)


def test_each_oracle_clicks_the_same_exposures_of_an_arm_served_once(bench, make_cfg, movielens):
    from abpo.arms.rankers import RankerArm
    from abpo.data.splits import split_users
    from abpo.sim.simulator import interactions_to_date, simulate_month

    cfg = make_cfg(*SIXTY_USERS)
    splits, _ = split_users(movielens, cfg.data)
    seqs = interactions_to_date(cfg, splits, cfg.sim.start_month)
    ranker = RankerArm.make_ranker("popularity", cfg).fit(seqs, movielens.item_ids().tolist())
    arm = CountingArm(RankerArm("popularity", ranker, 0.5, "1"))
    got = bench.simulated_ctr_by_oracle(cfg, "2026-02", "popularity", arm, dataset=movielens, splits=splits)
    assert list(got) == list(bench.ORACLES) and arm.calls == 1  # served once, clicked four ways
    assert len({v["impressions"] for v in got.values()}) == 1
    assert len({v["clicks"] for v in got.values()}) > 1
    one = dataclasses.replace(cfg, report=dataclasses.replace(cfg.report, arm_shares={"popularity": 1.0}))
    direct = simulate_month(one, "2026-02", {"popularity": arm.arm}, dataset=movielens, splits=splits, write=False)
    assert direct.per_arm["popularity"]["ctr"] == got[cfg.sim.oracle]["ctr"]  # the first table's figure
