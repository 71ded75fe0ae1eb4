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


# issue 60's yardsticks: served HR@5, and Eq. H1 at the arm's own, a common and a greedy exposure


def request(rid, user, candidates, next_item):
    from abpo.sim.simulator import SimRequest

    return SimRequest(rid, user, [1, 2], list(candidates), next_item, [], 0)


def test_served_hr_counts_a_next_item_the_retrieval_stage_missed_as_a_miss(bench):
    reqs = [
        request("a", 7, [10, 11, 12, 13, 14, 15], 12),  # next item ranked 3rd: a hit at 5
        request("b", 7, [10, 11, 12, 13, 14, 15], 10),  # ranked 6th: a miss
        request("c", 8, [10, 11, 12, 13, 14, 15], 99),  # not served: a miss, still counted
        request("d", 8, [10, 11, 12, 13, 14, 15], 15),  # tied with 4 others for 2nd: ties count against it
    ]
    p = np.array([0.05, 0.3, 0.25, 0.2, 0.15, 0.05])
    tied = np.array([0.5, 0.1, 0.1, 0.1, 0.1, 0.1])
    hits = bench.served_hits_at(5, reqs, [p, p, p, tied])
    assert hits.tolist() == [1.0, 0.0, 0.0, 0.0]  # rank of d's 15: 1 above + 5 tied - 1 = 5, not < 5
    assert hits.mean() == pytest.approx(0.25)  # over all 4 requests, the unserved one included
    assert bench.coverage(reqs) == pytest.approx(0.75)
    assert bench.served_hits_at(6, reqs, [p, p, p, tied]).tolist() == [1.0, 1.0, 0.0, 1.0]
    assert bench.user_means([r.user_id for r in reqs], hits).tolist() == [0.5, 0.0]  # users 7, 8
    with pytest.raises(ValueError, match="request b: 5 probabilities for 6 candidates"):
        bench.served_hits_at(5, reqs, [p, p[:5], p, p])
    with pytest.raises(ValueError, match="3 exposure distributions for 4 requests"):
        bench.served_hits_at(5, reqs, [p, p, p])


def test_an_exposure_re_tempered_is_the_softmax_of_the_arms_scores_at_the_new_temperature(bench):
    import torch

    from abpo.baselines import softmax_propensities
    from abpo.policy.scoring import candidate_propensities

    scores = np.array([2.0, -1.0, 0.5, 0.5, 3.0])
    p = softmax_propensities(scores, 0.1)  # a ranker at T = 0.1
    for t in (1.0, 0.25, 0.1, 3.0):
        np.testing.assert_allclose(bench.exposure_at(p, 0.1, t), softmax_propensities(scores, t), rtol=1e-9)
    np.testing.assert_allclose(bench.exposure_at(p, 0.1, 0.1), p, rtol=1e-12)
    # an LLM arm's float32 e_p at tau 1 (abpo.arms.llm): s_p's softmax at t = 0.25, to float32 precision
    s_p = torch.tensor([-3.2, -7.9, -1.1, -12.5, -4.0], dtype=torch.float32)
    e = candidate_propensities(s_p, 1.0).double().numpy()
    want = softmax_propensities(s_p.double().numpy(), 0.25)
    np.testing.assert_allclose(bench.exposure_at(e, 1.0, 0.25), want, rtol=1e-5)
    # the top choice: all mass on the best candidate, shared by ties; the limit of a small t
    assert bench.top_choice(p).tolist() == [0, 0, 0, 0, 1]
    assert bench.top_choice(np.array([0.4, 0.1, 0.4, 0.1])).tolist() == [0.5, 0, 0.5, 0]
    np.testing.assert_allclose(bench.exposure_at(p, 0.1, 1e-3), bench.top_choice(p), atol=1e-12)
    with pytest.raises(ValueError, match="every probability > 0"):
        bench.exposure_at(np.array([1.0, 0.0]), 1.0, 0.5)
    with pytest.raises(ValueError, match="both > 0"):
        bench.exposure_at(p, 0.1, 0.0)


def test_expected_ctr_at_a_common_temperature_and_by_top_choice_on_a_hand_computed_case(bench):
    click = [np.array([0.1, 0.5, 0.2]), np.array([0.3, 0.0, 0.6])]
    # an arm exposing at its own T = 0.5 with scores s: p = softmax(s / 0.5); at t = 1 it exposes softmax(s)
    s = [np.array([0.0, np.log(3.0), 0.0]), np.array([np.log(2.0), 0.0, np.log(2.0)])]
    p = [np.exp(x / 0.5) / np.exp(x / 0.5).sum() for x in s]
    at1 = [np.array([0.2, 0.6, 0.2]), np.array([0.4, 0.2, 0.4])]
    want1 = (0.2 * 0.1 + 0.6 * 0.5 + 0.2 * 0.2 + 0.4 * 0.3 + 0.2 * 0.0 + 0.4 * 0.6) / 2
    assert bench.expected_ctr_at(click, p, 0.5, 1.0) == pytest.approx(want1)
    assert bench.expected_ctr_at(click, at1, 1.0, 1.0) == pytest.approx(want1)  # the same arm exposing at t = 1
    own = sum(float(a @ b) for a, b in zip(p, click, strict=True)) / 2
    assert bench.expected_ctr_at(click, p, 0.5, 0.5) == pytest.approx(own) and own != pytest.approx(want1)
    assert bench.expected_ctr_at(click, p, 0.5, None) == pytest.approx((0.5 + (0.3 + 0.6) / 2) / 2)  # top choices


def test_the_yardstick_table_orders_and_checks_clear_pairs_under_each_yardstick(bench):
    ys = ["offline HR@5", "served HR@5", "E[CTR] t=1", "E[CTR] top choice"]
    values = {
        "abpo": {"offline HR@5": 0.35, "served HR@5": 0.10, "E[CTR] t=1": 0.09, "E[CTR] top choice": 0.15},
        "ml_retrain": {"offline HR@5": 0.34, "served HR@5": 0.14, "E[CTR] t=1": 0.07, "E[CTR] top choice": 0.18},
        "popularity": {"offline HR@5": 0.12, "served HR@5": 0.12, "E[CTR] t=1": 0.05, "E[CTR] top choice": 0.15},
    }
    P = bench.ClearPair
    offline = [P("abpo", "popularity", 0.23, 0.02), P("ml_retrain", "popularity", 0.22, 0.02)]
    served = [P("ml_retrain", "abpo", 0.04, 0.01)]
    own = {"abpo": 1.0, "ml_retrain": 0.1, "popularity": 1.0}
    lines, conc = bench.yardstick_table(values, ys, {"offline HR@5": offline, "served HR@5": served}, own)
    assert lines[0] == "| arm | own T | offline HR@5 | served HR@5 | E[CTR] t=1 | E[CTR] top choice |"
    assert lines[2] == "| abpo | 1 | 0.3500 | 0.1000 | 0.0900 | 0.1500 |"
    assert lines[3] == "| ml_retrain | 0.1 | 0.3400 | 0.1400 | 0.0700 | 0.1800 |"
    assert lines[5] == "| Kendall tau vs offline HR@5 | | | -0.33 | 1.00 | 0.00 |"
    # the offline pairs: served HR@5 keeps ml_retrain > popularity and reverses abpo > popularity; the top choice
    # ties abpo and popularity
    assert lines[6] == "| offline HR@5 clear pairs (2) kept / reversed | | - | 1 / 1 | 2 / 0 | 1 / 0 (1 tied) |"
    assert lines[7] == "| served HR@5 clear pairs (1) kept / reversed | | 0 / 1 | - | 0 / 1 | 1 / 0 |"
    assert len(lines) == 8 and all(line.count("|") == len(ys) + 3 for line in lines)
    assert [(p.better, p.worse) for p in conc[("offline HR@5", "served HR@5")][1]] == [("abpo", "popularity")]
    assert ("offline HR@5", "offline HR@5") not in conc
    rev = bench.reversed_lines(conc, values)
    assert "  offline HR@5 abpo > popularity (+0.2300, SE 0.0200) but served HR@5 0.1000 < 0.1200" in rev
    assert len(rev) == 1 + 2  # offline under served; served under offline and under t=1


def test_exposure_temperatures_are_parsed_or_refused_in_one_line(bench):
    assert bench.parse_temperatures("") == []
    assert bench.parse_temperatures("1, 0.25") == [1.0, 0.25]
    for bad in ("0", "-1", "x", "nan", "inf"):
        with pytest.raises(SystemExit, match="rule: comma-separated numbers > 0"):
            bench.parse_temperatures(bad)


def test_a_ranker_arms_yardsticks_on_a_served_month_are_its_own_scoring_and_eq_h1(bench, make_cfg, movielens):
    """On a real month's retrieval requests: E[CTR] own T is abpo.sim.headroom's Eq. H1 row of the arm, E[CTR]
    t=<t> is Eq. H1 of softmax(the ranker's scores / t), and served HR@5 ranks the next item by those scores."""
    from abpo.arms.rankers import RankerArm
    from abpo.baselines import softmax_propensities
    from abpo.data.splits import split_users
    from abpo.sim.headroom import candidate_click_probabilities, expected_ctr, month_headroom
    from abpo.sim.simulator import interactions_to_date, month_requests

    cfg = make_cfg(*SIXTY_USERS, "sim.requests_per_user=2")
    splits, _ = split_users(movielens, cfg.data)
    seqs = interactions_to_date(cfg, splits, "2026-02")
    ranker = RankerArm.make_ranker("ml_retrain", cfg).fit(seqs, movielens.item_ids().tolist())
    arm = bench.ServedOnce(RankerArm("ml_retrain", ranker, 0.1, "1"))
    reqs = month_requests(cfg, movielens, splits, "2026-02")
    triples = [(r.user_id, r.history, r.candidates) for r in reqs]
    click, _ = candidate_click_probabilities(cfg, movielens, reqs)
    y, per_user = bench.arm_yardsticks(reqs, arm.propensities(triples), click, arm.temperature, [1.0])
    assert arm.temperature == 0.1
    assert y["E[CTR] own T"] == pytest.approx(
        month_headroom(cfg, "2026-02", {"m": arm.arm}, dataset=movielens, splits=splits).row("m").ctr
    )
    scores = ranker.score(triples)
    assert y["E[CTR] t=1"] == pytest.approx(expected_ctr(click, [softmax_propensities(s, 1.0) for s in scores]))
    assert y["E[CTR] t=1"] != pytest.approx(y["E[CTR] own T"])
    top = [np.eye(len(s))[int(np.argmax(s))] for s in scores]
    assert y["E[CTR] top choice"] == pytest.approx(expected_ctr(click, top))
    ranked = [
        r.next_item in r.candidates and sorted(s, reverse=True).index(s[r.candidates.index(r.next_item)]) < 5
        for r, s in zip(reqs, scores, strict=True)
    ]
    assert y["served HR@5"] == pytest.approx(np.mean(ranked)) and 0 < y["served HR@5"] < bench.coverage(reqs) <= 1
    assert len(per_user) == len({r.user_id for r in reqs}) and per_user.mean() == pytest.approx(y["served HR@5"])
