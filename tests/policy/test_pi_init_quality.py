"""pi_init quality: after both stages of `abpo sft` on the bundled MovieLens data with the tiny preset (next-item
pre-training, then the answer-format SFT on every D_sup pair), HR@5 of pi_init on held-out users is significantly
above the random baseline K/M and at least twice the popularity ranker's on the same candidates
(`benchmarks/policy_quality.py` measures the same against ML-retrain on the experiment's test users).

Slow (the full `abpo sft` of the tiny preset: about 6 minutes on one thread): `pytest -m slow`.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_pi_init_hr5_beats_random_and_popularity(tmp_path):
    from scipy.stats import binomtest

    from abpo.baselines import make_ranker
    from abpo.config import load_config
    from abpo.data.candidates import build_eval_examples, training_popularity
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users
    from abpo.experiment.evaluation import metrics_from_scores
    from abpo.policy.sft import seeded_subsample, train_sft

    # the tiny preset as shipped; state under tmp_path, no MLflow, no generation (the ranking by s_p is what HR@5
    # measures)
    cfg = load_config("tiny", [f"paths.root={tmp_path / 'var'}", "sft.eval_generation=false"])
    res = train_sft(cfg, validation_fraction=cfg.experiment.validation_fraction, log_mlflow=False, register=False)
    assert set(res.stage_seconds) == {"pretrain", "sft"}

    m = res.metrics
    k_over_m = m["random_HR@5"]
    assert k_over_m == pytest.approx(5 / cfg.data.eval_candidates)
    assert res.losses and res.losses[-1][1] < res.losses[0][1], res.losses
    n = res.metrics["n_users"]
    hits = round(m["HR@5"] * n)
    p = binomtest(hits, int(n), k_over_m, alternative="greater").pvalue
    print(f"pi_init HR@5 = {m['HR@5']:.4f} ({hits}/{int(n)}) vs K/M = {k_over_m:.4f}, one-sided binomial p = {p:.2g}")
    assert n >= 300
    assert p < 1e-6, (
        f"HR@5 {m['HR@5']:.4f} on {int(n)} users is not significantly above K/M = {k_over_m:.4f} (p={p:.3g})"
    )

    # the same held-out users and candidates train_sft evaluated on, ranked by popularity fitted on x_{1:T}
    ds = load_dataset(cfg.data)
    splits, _ = split_users(ds, cfg.data)
    ev = seeded_subsample(build_eval_examples(splits, ds, cfg.data), cfg.sft.eval_max_users, cfg.seed)
    pop = make_ranker("popularity", seed=cfg.seed).fit({s.user_id: s.history for s in splits}, ds.item_ids().tolist())
    pop_m = metrics_from_scores(
        ev,
        [list(map(float, s)) for s in pop.score([(e.user_id, e.history, e.candidates) for e in ev])],
        training_popularity(splits, ds),
    )
    print(f"popularity HR@5 = {pop_m['HR@5']:.4f} on the same users")
    assert m["HR@5"] >= 2.0 * pop_m["HR@5"], (m["HR@5"], pop_m["HR@5"])
