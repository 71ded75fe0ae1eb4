"""Arms served by a ranker, for the tests that simulate a month without an LLM (tests/sim/test_simulator.py,
tests/monthly/test_series.py)."""

from __future__ import annotations


def popularity_served_arms(cfg, movielens, splits) -> dict:
    """Every LLM and ranker arm (abpo, grpo, ml_retrain, popularity) served by a popularity ranker fitted on the
    interactions before ``sim.start_month``: fast, and the contract does not care what served."""
    from abpo.arms.rankers import RankerArm
    from abpo.sim.simulator import interactions_to_date

    seqs = interactions_to_date(cfg, splits, cfg.sim.start_month)
    items = movielens.item_ids().tolist()
    return {
        a: RankerArm(a, RankerArm.make_ranker("popularity", cfg).fit(seqs, items), 0.5, "1")
        for a in ("abpo", "grpo", "ml_retrain", "popularity")
    }
