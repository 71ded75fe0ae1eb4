"""pi_init quality (issue 3, "Done when"): after SFT on the bundled MovieLens data with the tiny preset, HR@5 of
pi_init on held-out users is significantly above the random baseline K/M.

Slow (the full `abpo sft` of the tiny preset: about 5-8 minutes on 2 free CPU cores): `pytest -m slow`.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_pi_init_hr5_beats_random_baseline(tmp_path):
    from scipy.stats import binomtest

    from abpo.config import load_config
    from abpo.policy.sft import train_sft

    # the tiny preset as shipped (all of D_sup, one epoch; 300 held-out users at M_eval = data.eval_candidates);
    # state under tmp_path, no MLflow, no generation (the ranking by s_p is what HR@5 measures)
    cfg = load_config("tiny", [f"paths.root={tmp_path / 'var'}", "sft.eval_generation=false"])
    res = train_sft(cfg, log_mlflow=False, register=False, echo=print)

    m = res.metrics
    k_over_m = m["random_HR@5"]
    assert k_over_m == pytest.approx(5 / cfg.data.eval_candidates)
    assert res.losses and res.losses[-1][1] < res.losses[0][1] / 2, res.losses
    n = res.metrics["n_users"]
    hits = round(m["HR@5"] * n)
    p = binomtest(hits, int(n), k_over_m, alternative="greater").pvalue
    print(f"pi_init HR@5 = {m['HR@5']:.4f} ({hits}/{int(n)}) vs K/M = {k_over_m:.4f}, one-sided binomial p = {p:.2g}")
    assert n >= 300
    assert p < 0.01, f"HR@5 {m['HR@5']:.4f} on {int(n)} users is not significantly above K/M = {k_over_m:.4f} (p={p:.3g})"
