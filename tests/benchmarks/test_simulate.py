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


def test_clear_pairs_on_a_hand_made_case(bench):
    n = 100
    # a: 40 hits; b: a's hits less 5 users (paired d = 1 on 5 users: delta 0.05 >= gap, se small);
    # c: a's hits with 2 users moved (delta 0.02 < gap; d = +1 on 2, 0 elsewhere: se = sd/10 ~ 0.0141, 2 se 0.028);
    # d: a's hits with 30 users swapped both ways and 2 net (delta 0.02, se large): within noise
    a = np.zeros(n)
    a[:40] = 1
    b = a.copy()
    b[:5] = 0
    c = a.copy()
    c[:2] = 0
    d = a.copy()
    d[:16] = 0
    d[40:54] = 1
    pairs = {(p.better, p.worse): p for p in bench.clear_pairs({"a": a, "b": b, "c": c, "d": d})}
    assert ("a", "b") in pairs and pairs[("a", "b")].delta == pytest.approx(0.05)
    diff = a - b
    assert pairs[("a", "b")].se == pytest.approx(diff.std(ddof=1) / np.sqrt(n))
    assert ("a", "c") not in pairs  # 0.02 is < 0.03 and < 2 SE (0.0281)
    assert ("a", "d") not in pairs  # 0.02 with many swaps: noise
    assert ("c", "b") in pairs and pairs[("c", "b")].delta == pytest.approx(0.03)  # exactly the gap: clear
    # 2 SE alone makes a pair clear: 20 users all one way, at n = 2000 (delta 0.01, se ~ 0.0022)
    big_a = np.zeros(2000)
    big_a[:20] = 1
    (only,) = bench.clear_pairs({"x": np.zeros(2000), "y": big_a})
    assert (only.better, only.worse) == ("y", "x") and only.delta == pytest.approx(0.01) and only.delta > 2 * only.se
    # identical arms are never a clear pair; unequal user counts are refused
    assert bench.clear_pairs({"x": a, "y": a.copy()}) == []
    with pytest.raises(ValueError, match="different numbers of users"):
        bench.clear_pairs({"x": a, "y": a[:50]})
    # concordance: which clear pairs keep, reverse or tie their order in one oracle's CTR
    ps = bench.clear_pairs({"a": a, "b": b, "c": c, "d": d})
    kept, rev, tied = bench.concordance(ps, {"a": 0.08, "b": 0.07, "c": 0.06, "d": 0.075})
    assert [(p.better, p.worse) for p in rev] == [("c", "b")]  # c is clear above b offline, below it simulated
    assert [(p.better, p.worse) for p in kept] == [("a", "b"), ("d", "b")] and tied == []
    lines = bench.concordance_lines(
        ps, {k: {"als": v} for k, v in {"a": 0.08, "b": 0.07, "c": 0.06, "d": 0.075}.items()}, ["als"], {"als": 0.4}
    )
    assert lines[-1].startswith(f"concordance als: tau 0.40; clear pairs kept {len(kept)}/{len(ps)}, reversed 1")
    assert "reversed: c > b offline (+0.0300) but sim CTR 0.0600 < 0.0700" in lines[-1]
