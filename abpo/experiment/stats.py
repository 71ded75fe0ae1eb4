"""Paired statistics of the experiment's table: one row against a reference row on the same users and candidates.

Units. Every seed scores the same evaluation users on the same candidate sets, so a comparison is paired per
(seed, user): d(s, u) = m_a(s, u) - m_b(s, u), m = HR@5 hit (0/1) or NDCG@5 of the target, and
Δ = mean over seeds and users of d(s, u) (= the difference of the rows' means). Seeds re-train everything
(pi_init, D_bandit, updates), so a seed is a random draw of the whole training pipeline: a seed-level shift moves
every user of that seed together, and an interval that only resamples users misses that variance.

- ``two_stage_bootstrap`` (Eq. TS): the reported interval and p-value. Each replicate draws S seeds with
  replacement, then, inside each drawn seed, U users with replacement, and averages d over the S x U draws:
  Δ* = (1/(S U)) sum_{i, j} d(s*_i, u*_ij). The interval is the percentile interval of Δ*; the two-sided p-value
  inverts it (percentile inversion): p = min(1, 2 min(P*(Δ* <= 0), P*(Δ* >= 0))), so p < α exactly when the
  (1-α) percentile interval excludes 0 (up to the replicates' granularity, p >= 2/samples when nonzero);
  SE = sd(Δ*), the two-stage standard error.
- ``minimum_detectable_effect`` (Eq. MDE): (z_{1-α/2} + z_{power}) · SE with the two-stage SE, the smallest true
  Δ this design detects with probability ``power`` in a two-sided test at level α (normal approximation).
- ``bootstrap_non_inferiority`` (one-sided, level ``experiment.noninferiority_alpha`` = 0.025): H0 Δ <= -δ against
  H1 Δ > -δ, p = P*(Δ* <= -δ), non-inferior when p < α (equivalently the one-sided (1-α) lower percentile bound of
  Δ is above -δ). Run twice: δ = the absolute margin (``experiment.noninferiority_margin``) and δ = the relative
  margin ρ · mean of the reference (``experiment.noninferiority_relative_margin`` = ρ).
- ``holm``: Holm's step-down adjustment of a family of p-values (the table's secondary contrasts; the pre-registered
  primary contrast ``experiment.primary_contrast`` is reported unadjusted).
- ``round_slopes`` / ``trend_comparison``: the trend test across rounds. Per (seed, user) the least-squares slope
  of the metric over rounds r = 1..R (Eq. SL), then the same two-stage bootstrap of a row's mean slope (against 0)
  and of the paired slope difference against another row.
- Kept as extra, labelled columns (not the reported p): McNemar's exact test on the HR@5 hits and Wilcoxon's
  signed-rank test on NDCG@5 over (seed, user) pairs (they treat the S x U pairs as independent), the user-only
  cluster SE ``se_users_*`` and its interval ``bootstrap_interval`` (users resampled, seeds fixed), which the
  simulation in tests/experiment/test_stats.py shows under-covering when seeds shift.
- ``non_inferiority``: the normal-approximation version of the one-sided test (z = (Δ + δ) / SE), kept for callers.
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
    ha: list[np.ndarray] = []
    hb: list[np.ndarray] = []
    ga: list[np.ndarray] = []
    gb: list[np.ndarray] = []
    for ca in sorted(cells_a, key=lambda c: int(c["seed"])):
        cb = by_seed_b.get(int(ca["seed"]))
        if cb is None:
            continue
        if list(ca["users"]) != list(cb["users"]):
            raise ValueError(f"seed {ca['seed']}: rows {ca['row']} and {cb['row']} were scored on different users")
        if ha and len(ca["ranks"]) != ha[0].size:
            raise ValueError(
                f"seed {ca['seed']}: row {ca['row']} has {len(ca['ranks'])} users, another seed "
                f"{ha[0].size}; rule: every seed scores the same evaluation users"
            )
        h1, g1 = hits_and_gains(ca["ranks"], k)
        h2, g2 = hits_and_gains(cb["ranks"], k)
        ha.append(h1)
        hb.append(h2)
        ga.append(g1)
        gb.append(g2)
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
        means[i : i + n] = d_u[idx].mean(axis=1)
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


def two_stage_replicates(d: np.ndarray, *, samples: int, seed: int = 0) -> np.ndarray:
    """Eq. TS: ``samples`` replicates Δ* of the mean of d (..., S seeds, U users), each drawing S seeds with
    replacement and then U users with replacement inside every drawn seed. Leading axes of d (e.g. HR@5 and NDCG@5
    stacked) share the same draws. Returns (..., samples); seeded. Empty d or samples < 1 gives NaNs."""
    d = np.asarray(d, dtype=np.float64)
    if d.ndim < 2:
        raise ValueError(
            f"abpo.experiment.stats.two_stage_replicates: d has shape {d.shape}; rule: (..., seeds, users)"
        )
    lead, (n_s, n_u) = d.shape[:-2], d.shape[-2:]
    if n_s == 0 or n_u == 0 or samples < 1:
        return np.full((*lead, max(samples, 0)), np.nan)
    rng = np.random.default_rng([int(seed), 0x2571])
    out = np.empty((*lead, samples))
    chunk = max(1, 2_000_000 // (n_s * n_u))  # replicates per batch: bounded memory for many users
    for i in range(0, samples, chunk):
        n = min(chunk, samples - i)
        si = rng.integers(0, n_s, size=(n, n_s))  # stage 1: seeds with replacement
        ui = rng.integers(0, n_u, size=(n, n_s, n_u))  # stage 2: users with replacement inside each drawn seed
        out[..., i : i + n] = d[..., si[:, :, None], ui].mean(axis=(-2, -1))  # Δ* = mean over the S x U draws
    return out


def percentile_p_value(replicates: np.ndarray, null: float = 0.0) -> float:
    """Two-sided p by percentile inversion (Eq. TS): min(1, 2 min(P*(Δ* <= null), P*(Δ* >= null)))."""
    r = np.asarray(replicates, dtype=np.float64)
    r = r[np.isfinite(r)]
    if r.size == 0:
        return float("nan")
    return float(min(1.0, 2.0 * min(float(np.mean(r <= null)), float(np.mean(r >= null)))))


def two_stage_bootstrap(
    d: np.ndarray,
    *,
    samples: int,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """Eq. TS on a (seeds x users) matrix of paired differences: the mean ``diff``, the two-stage ``se``,
    the percentile interval ``ci_low``/``ci_high`` at ``level`` and the two-sided percentile-inversion ``p``."""
    d = np.asarray(d, dtype=np.float64)
    rep = two_stage_replicates(d, samples=samples, seed=seed)
    if not np.isfinite(rep).any():
        return {
            "diff": float("nan"),
            "se": float("nan"),
            "ci_low": float("nan"),
            "ci_high": float("nan"),
            "p": float("nan"),
        }
    lo, hi = np.quantile(rep, [(1 - level) / 2, 1 - (1 - level) / 2])
    return {
        "diff": float(d.mean()),
        "se": float(rep.std(ddof=1)) if rep.size > 1 else 0.0,
        "ci_low": float(lo),
        "ci_high": float(hi),
        "p": percentile_p_value(rep),
    }


def bootstrap_non_inferiority(
    replicates: np.ndarray, margin: float, *, alpha: float = 0.025
) -> dict[str, float | bool]:
    """One-sided test of H0 Δ <= -margin from the two-stage replicates (module docstring): p = P*(Δ* <= -margin),
    non-inferior when p < alpha."""
    if not margin > 0:
        raise ValueError(f"abpo.experiment.stats: non-inferiority margin {margin}; rule: > 0")
    if not 0 < alpha < 1:
        raise ValueError(f"experiment.noninferiority_alpha={alpha}; rule: in (0, 1)")
    r = np.asarray(replicates, dtype=np.float64)
    r = r[np.isfinite(r)]
    if r.size == 0:
        return {"p": float("nan"), "non_inferior": False}
    p = float(np.mean(r <= -margin))
    return {"p": p, "non_inferior": bool(p < alpha)}


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment: with the m finite p-values sorted p_(1) <= ... <= p_(m),
    adj_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)); returned in the input order. NaN stays NaN and does not count
    in m."""
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = ok.size
    running = 0.0
    for rank, i in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


def round_slopes(per_round: np.ndarray) -> np.ndarray:
    """Eq. SL: the least-squares slope over rounds r = 1..R of each (seed, user)'s metric,
    sum_r (r - r_bar)(m_r - m_bar) / sum_r (r - r_bar)^2, for per_round of shape (R, seeds, users). Needs R >= 2."""
    m = np.asarray(per_round, dtype=np.float64)
    if m.ndim != 3 or m.shape[0] < 2:
        raise ValueError(f"abpo.experiment.stats.round_slopes: shape {m.shape}; rule: (rounds >= 2, seeds, users)")
    r = np.arange(1, m.shape[0] + 1, dtype=np.float64)
    rc = r - r.mean()
    return np.tensordot(rc, m, axes=(0, 0)) / float(rc @ rc)


def round_matrices(cells: Sequence[Mapping], k: int = 5) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(seeds, hits, gains) of one row's cells over every round: hits and gains (R, seeds, users), rounds 1..R in
    order, over the seeds that have every round; raises when a seed's rounds were scored on different users."""
    by_seed: dict[int, dict[int, Mapping]] = {}
    for c in cells:
        by_seed.setdefault(int(c["seed"]), {})[int(c["round"])] = c
    rounds = sorted({r for rs in by_seed.values() for r in rs})
    seeds = sorted(s for s, rs in by_seed.items() if all(r in rs for r in rounds))
    hits = np.empty((len(rounds), len(seeds), 0))
    gains = hits
    if seeds:
        users = list(by_seed[seeds[0]][rounds[0]]["users"])
        h, g = [], []
        for r in rounds:
            hr, gr = [], []
            for s in seeds:
                c = by_seed[s][r]
                if list(c["users"]) != users:
                    raise ValueError(
                        f"row {c['row']} seed {s} round {r}: scored on other users than seed "
                        f"{seeds[0]} round {rounds[0]}; rule: every round and seed scores the same users"
                    )
                h1, g1 = hits_and_gains(c["ranks"], k)
                hr.append(h1)
                gr.append(g1)
            h.append(hr)
            g.append(gr)
        hits, gains = np.asarray(h), np.asarray(g)
    return seeds, hits, gains


def trend_comparison(
    cells_a: Sequence[Mapping],
    cells_b: Sequence[Mapping] | None = None,
    *,
    bootstrap_samples: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict[str, float | int]:
    """The trend test across rounds (module docstring): for row a (cells of every round) the mean per-(seed, user)
    slope of HR@5 and NDCG@5 over rounds (Eq. SL) with its two-stage interval and p against 0
    (``slope_*``, ``slope_ci_low_*``, ``slope_ci_high_*``, ``slope_p_*``) and, with row b, the paired slope
    difference a - b on the seeds both have (``dslope_*`` ...). Empty when a has fewer than two rounds."""
    seeds_a, ha, ga = round_matrices(cells_a)
    if ha.shape[0] < 2 or ha.size == 0:
        return {}
    out: dict[str, float | int] = {"trend_rounds": int(ha.shape[0]), "trend_seeds": len(seeds_a)}
    for name, m in (("HR@5", ha), ("NDCG@5", ga)):
        t = two_stage_bootstrap(round_slopes(m), samples=bootstrap_samples, level=1 - alpha, seed=seed)
        out.update(
            {
                f"slope_{name}": t["diff"],
                f"slope_ci_low_{name}": t["ci_low"],
                f"slope_ci_high_{name}": t["ci_high"],
                f"slope_p_{name}": t["p"],
            }
        )
    if cells_b:
        seeds_b, hb, gb = round_matrices(cells_b)
        common = [s for s in seeds_a if s in seeds_b]
        if hb.shape[0] != ha.shape[0] or not common:
            return out
        ia, ib = [seeds_a.index(s) for s in common], [seeds_b.index(s) for s in common]
        if hb.shape[2] != ha.shape[2]:
            raise ValueError("trend_comparison: the two rows were scored on different numbers of users")
        for name, a, b in (("HR@5", ha, hb), ("NDCG@5", ga, gb)):
            d = round_slopes(a[:, ia]) - round_slopes(b[:, ib])
            t = two_stage_bootstrap(d, samples=bootstrap_samples, level=1 - alpha, seed=seed)
            out.update(
                {
                    f"dslope_{name}": t["diff"],
                    f"dslope_ci_low_{name}": t["ci_low"],
                    f"dslope_ci_high_{name}": t["ci_high"],
                    f"dslope_p_{name}": t["p"],
                }
            )
    return out


def paired_comparison(
    cells_a: Sequence[Mapping],
    cells_b: Sequence[Mapping],
    *,
    bootstrap_samples: int = 2000,
    alpha: float = 0.05,
    power: float = 0.8,
    margin: float | None = None,
    relative_margin: float | None = None,
    ni_alpha: float = 0.025,
    seed: int = 0,
) -> dict[str, float | int | bool]:
    """Row a against row b (module docstring), differences a minus b, for HR@5 and NDCG@5: Δ (``d*``), the
    two-stage bootstrap SE, interval and two-sided p (``se_*``, ``ci_low_*``, ``ci_high_*``, ``p_*``), the MDE from
    the two-stage SE (``mde_*``); the extra, labelled columns McNemar / Wilcoxon over (seed, user) pairs and the
    user-only SE ``se_users_*``. With ``margin`` (absolute HR@5) and/or ``relative_margin`` (a share of row b's mean
    HR@5): the one-sided bootstrap non-inferiority tests of HR@5 at level ``ni_alpha``."""
    from scipy.stats import binomtest, wilcoxon

    ha, hb, ga, gb = paired_matrix(cells_a, cells_b)
    if ha.size == 0:
        return {}
    h1, h2 = ha.ravel() > 0, hb.ravel() > 0
    wins, losses = int((h1 & ~h2).sum()), int((~h1 & h2).sum())
    dg = (ga - gb).ravel()
    out: dict[str, float | int | bool] = {
        "units": int(h1.size),
        "users": int(ha.shape[1]),
        "seeds": int(ha.shape[0]),
        "hr5_wins": wins,
        "hr5_losses": losses,
        "p_mcnemar_HR@5": float(binomtest(min(wins, losses), wins + losses, 0.5).pvalue) if wins + losses else 1.0,
        "p_wilcoxon_NDCG@5": float(wilcoxon(dg).pvalue) if np.any(dg != 0) else 1.0,
    }
    d = np.stack([ha - hb, ga - gb])  # (metric, seeds, users)
    reps = two_stage_replicates(d, samples=bootstrap_samples, seed=seed)  # the same draws for both metrics
    for j, name in enumerate(("HR@5", "NDCG@5")):
        rep = reps[j]
        lo, hi = np.quantile(rep, [alpha / 2, 1 - alpha / 2])
        se = float(rep.std(ddof=1)) if rep.size > 1 else 0.0
        out.update(
            {
                f"d{name}": float(d[j].mean()),
                f"se_{name}": se,
                f"ci_low_{name}": float(lo),
                f"ci_high_{name}": float(hi),
                f"p_{name}": percentile_p_value(rep),
                f"mde_{name}": minimum_detectable_effect(se, alpha=alpha, power=power),
                f"se_users_{name}": standard_error(user_differences(*((ha, hb) if j == 0 else (ga, gb)))),
            }
        )
    if margin is not None:
        ni = bootstrap_non_inferiority(reps[0], margin, alpha=ni_alpha)
        out.update({"ni_margin": float(margin), "ni_p": ni["p"], "non_inferior": ni["non_inferior"]})
    if relative_margin is not None:
        if not relative_margin > 0:
            raise ValueError(
                f"experiment.noninferiority_relative_margin={relative_margin}; rule: > 0 (a share of "
                "the reference's mean HR@5)"
            )
        ref_mean = float(hb.mean())
        out.update({"ni_rel_share": float(relative_margin), "ni_rel_margin": relative_margin * ref_mean})
        if relative_margin * ref_mean > 0:
            ni = bootstrap_non_inferiority(reps[0], relative_margin * ref_mean, alpha=ni_alpha)
            out.update({"ni_rel_p": ni["p"], "non_inferior_rel": ni["non_inferior"]})
    return out
