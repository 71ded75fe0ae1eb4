"""Paired statistics of the experiment's table: one row against a reference row on the same users and candidates.

Units. Every seed scores the same evaluation users on the same candidate sets, so a comparison is paired per
(seed, user). Seeds re-train everything (pi_init, D_bandit, updates), but a user's outcomes across seeds are
correlated (the same history and target), so the intervals and the minimum detectable effect treat the **user**
as the independent unit:

    d_u = mean over seeds s of ( m_a(s, u) - m_b(s, u) )        m = HR@5 hit (0/1) or NDCG@5 of the target
    Δ   = mean over users of d_u                                 (= the difference of the rows' means)
    SE  = sd(d_u) / sqrt(n_users)

- ``bootstrap_interval``: a percentile interval of Δ from resampling users with replacement (all seeds of a drawn
  user move together: a cluster bootstrap), ``experiment.bootstrap_samples`` draws, seeded.
- ``minimum_detectable_effect`` (Eq. MDE): (z_{1-α/2} + z_{power}) · SE, the smallest true Δ this design detects
  with probability ``power`` in a two-sided test at level α (normal approximation of the paired test).
- ``non_inferiority`` (one-sided, margin δ > 0): H0 Δ <= -δ against H1 Δ > -δ; z = (Δ + δ) / SE,
  p = 1 - Φ(z). The row is non-inferior when p < α (equivalently, the one-sided (1 - α) lower bound of Δ is above
  -δ).
- The exact tests the table always printed stay: McNemar's exact test on the HR@5 hits and Wilcoxon's signed-rank
  test on NDCG@5, both over (seed, user) units.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def hits_and_gains(ranks: Sequence[int], k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """HR@k hits (0/1) and NDCG@k gains (1/log2(rank+1) inside the top k) of the target's 1-based ranks."""
    r = np.asarray(ranks, dtype=np.float64)
    return (r <= k).astype(np.float64), np.where(r <= k, 1.0 / np.log2(r + 1.0), 0.0)


def paired_matrix(cells_a: Sequence[Mapping], cells_b: Sequence[Mapping], k: int = 5):
    """(hits_a, hits_b, gains_a, gains_b) as (seeds x users) arrays over the seeds both rows have; raises if a
    seed's two cells were scored on different users."""
    by_seed_b = {int(c["seed"]): c for c in cells_b}
    ha, hb, ga, gb = [], [], [], []
    for ca in sorted(cells_a, key=lambda c: int(c["seed"])):
        cb = by_seed_b.get(int(ca["seed"]))
        if cb is None:
            continue
        if list(ca["users"]) != list(cb["users"]):
            raise ValueError(f"seed {ca['seed']}: rows {ca['row']} and {cb['row']} were scored on different users")
        if ha and len(ca["ranks"]) != ha[0].size:
            raise ValueError(f"seed {ca['seed']}: row {ca['row']} has {len(ca['ranks'])} users, another seed "
                             f"{ha[0].size}; rule: every seed scores the same evaluation users")
        h1, g1 = hits_and_gains(ca["ranks"], k)
        h2, g2 = hits_and_gains(cb["ranks"], k)
        ha.append(h1), hb.append(h2), ga.append(g1), gb.append(g2)
    return tuple(np.asarray(x) for x in (ha, hb, ga, gb))


def user_differences(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """d_u: each user's difference a - b averaged over seeds (a, b: seeds x users)."""
    return (np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).mean(axis=0)


def standard_error(d_u: np.ndarray) -> float:
    """SE of Δ = mean(d_u): sd(d_u) / sqrt(n_users) (0 for fewer than two users)."""
    d_u = np.asarray(d_u, dtype=np.float64)
    return float(d_u.std(ddof=1) / np.sqrt(d_u.size)) if d_u.size > 1 else 0.0


def bootstrap_interval(d_u: np.ndarray, *, samples: int, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of mean(d_u) from ``samples`` user resamples (the cluster bootstrap of the module
    docstring), seeded."""
    d_u = np.asarray(d_u, dtype=np.float64)
    if d_u.size == 0 or samples < 1:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng([int(seed), 0xB007])
    means = np.empty(samples)
    for i in range(0, samples, 256):  # chunks: bounded memory for many users
        n = min(256, samples - i)
        idx = rng.integers(0, d_u.size, size=(n, d_u.size))
        means[i:i + n] = d_u[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def minimum_detectable_effect(se: float, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Eq. MDE: (z_{1-alpha/2} + z_{power}) * SE, two-sided level alpha."""
    from scipy.stats import norm

    if not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"alpha={alpha}, power={power}; rule: both in (0, 1)")
    return float((norm.ppf(1 - alpha / 2) + norm.ppf(power)) * se)


def non_inferiority(delta: float, se: float, margin: float, *, alpha: float = 0.05) -> dict[str, float | bool]:
    """One-sided test of H0 Δ <= -margin (module docstring): z, p and the verdict at level alpha."""
    from scipy.stats import norm

    if not margin > 0:
        raise ValueError(f"experiment.noninferiority_margin={margin}; rule: > 0 (an absolute HR@5 difference)")
    if se <= 0:
        p = 0.0 if delta > -margin else 1.0
        return {"z": float("inf") if p == 0.0 else float("-inf"), "p": p, "non_inferior": p < alpha}
    z = (delta + margin) / se
    p = float(1 - norm.cdf(z))
    return {"z": float(z), "p": p, "non_inferior": bool(p < alpha)}


def paired_comparison(
    cells_a: Sequence[Mapping], cells_b: Sequence[Mapping], *, bootstrap_samples: int = 2000, alpha: float = 0.05,
    power: float = 0.8, margin: float | None = None, seed: int = 0,
) -> dict[str, float | int | bool]:
    """Row a against row b (module docstring): Δ, exact tests, bootstrap intervals and MDE for HR@5 and NDCG@5,
    and, with ``margin``, the non-inferiority test of HR@5. Differences are a minus b."""
    from scipy.stats import binomtest, wilcoxon

    ha, hb, ga, gb = paired_matrix(cells_a, cells_b)
    if ha.size == 0:
        return {}
    h1, h2 = ha.ravel() > 0, hb.ravel() > 0
    wins, losses = int((h1 & ~h2).sum()), int((~h1 & h2).sum())
    dg = (ga - gb).ravel()
    out: dict[str, float | int | bool] = {
        "units": int(h1.size), "users": int(ha.shape[1]), "seeds": int(ha.shape[0]),
        "hr5_wins": wins, "hr5_losses": losses,
        "p_mcnemar_HR@5": float(binomtest(min(wins, losses), wins + losses, 0.5).pvalue) if wins + losses else 1.0,
        "p_wilcoxon_NDCG@5": float(wilcoxon(dg).pvalue) if np.any(dg != 0) else 1.0,
    }
    for name, a, b in (("HR@5", ha, hb), ("NDCG@5", ga, gb)):
        d_u = user_differences(a, b)
        se = standard_error(d_u)
        lo, hi = bootstrap_interval(d_u, samples=bootstrap_samples, level=1 - alpha, seed=seed)
        out.update({f"d{name}": float(d_u.mean()), f"se_{name}": se, f"ci_low_{name}": lo, f"ci_high_{name}": hi,
                    f"mde_{name}": minimum_detectable_effect(se, alpha=alpha, power=power)})
    if margin is not None:
        ni = non_inferiority(float(out["dHR@5"]), float(out["se_HR@5"]), margin, alpha=alpha)
        out.update({"ni_margin": float(margin), "ni_p": ni["p"], "non_inferior": ni["non_inferior"]})
    return out
