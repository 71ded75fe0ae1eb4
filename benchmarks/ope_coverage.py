"""The off-policy gate's estimators against the truth: bias, RMSE and 95% interval coverage of
the CTR difference challenger - champion, over replicated simulated months whose true difference is known.

One month of the simulator (the demo's month 2026-01 by default: abpo.sim.simulator.month_requests, 610 users x 12
requests, 20 retrieval candidates each) and its click model (abpo.sim.headroom.candidate_click_probabilities) give
every candidate a of request r its click probability p_r(a). Cheap policies whose exposures are known exactly:

    champion      pi_c  = softmax(s_1 / tau)         s_k = logit p_r(a) + sigma (e_k(a) + n_k(r, a)) / sqrt 2, a
                                                     model's view of the truth with per-item and per-request
                                                     errors (e, n ~ N(0, 1), fixed by the seed per policy k;
                                                     sigma = 2, tau = 2: a top candidate's exposure ~0.25)
    challenger    pi_n  = softmax((s_1 + lam s_2) / tau)   the champion plus a second noisy view, lam set (by bisection,
                                                     before any replication) so that CTR(pi_n) - CTR(pi_c) is about
                                                     the MDE of DR on a pilot draw (below)
    logging arms  the demo's six arms by its shares: abpo (the champion, 24%), grpo and grpo_cr (s_3, s_4: 24%
                  each), holdback (s_5 with twice the noise: 20%), ml_retrain and popularity (softmax(log(1 +
                  count) / T) at T 0.1 and 0.5: 4% each); a user's requests all go to one arm

The truth is Eq. H1 of abpo.sim.headroom on the month's requests: CTR(pi) = (1/R) sum_r sum_a pi(a|r) p_r(a), with no
click noise. Each replication draws the users' arms, every request's exposed item from its arm's exposures (e0 =
that probability, as logged) and its click ~ Bernoulli(p_r(a)), then runs what the gate runs
(abpo.monthly.gate.ope_estimates_on_rows): SNIPS on the champion arm's own rows (compare_snips, the gate's
the former estimator, interval over rows: ``snips``), and DM, IPS, SNIPS, DR, SNDR and Switch-DR on every
arm's rows (compare_ope_on_logs: the reward model cross-fitted over 5 folds of users, a paired percentile
bootstrap over users), each with a 95% interval. Per estimator, over the replications: bias = mean(estimate) -
truth, RMSE, coverage = the share of intervals containing the truth (its binomial SE beside it), and the mean
interval width. The MDE the pilot sizes the difference to: (z_0.975 + z_0.8) x the bootstrap SE of the DR
difference on one pilot draw with the challenger at lam = 1 (not one of the replications).

    .venv/bin/python benchmarks/ope_coverage.py [--config demo] [--month 2026-01] [--reps 200] [--n-boot 2000]
                                                [--users 0] [--seed 0] [--tau 1] [--json out.json] [--smoke]

The last line is exactly `coverage of the true difference at nominal 95%: best <name> <c.ccc>; dr <c.ccc>; snips
<c.ccc>`. ``--smoke``: 40 users, 3 replications, 200 resamples (seconds; the figures mean nothing)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from statistics import NormalDist

import numpy as np

SHARES = {"abpo": 0.24, "grpo": 0.24, "grpo_cr": 0.24, "holdback": 0.2, "ml_retrain": 0.04, "popularity": 0.04}
CHAMPION_ARM = "abpo"


def _softmax(s: np.ndarray, mask: np.ndarray) -> np.ndarray:
    s = np.where(mask, s, -np.inf)
    s = s - s.max(axis=1, keepdims=True)
    e = np.where(mask, np.exp(s), 0.0)
    return e / e.sum(axis=1, keepdims=True)


def month(cfg, month_name: str, users: int):
    """(requests, click probabilities (R, K) zero-padded, mask (R, K), item ids (R, K), training popularity)."""
    from abpo.monthly.common import dataset_and_splits
    from abpo.sim.headroom import candidate_click_probabilities
    from abpo.sim.simulator import month_requests

    ds, splits = dataset_and_splits(cfg)
    if users:
        splits = sorted(splits, key=lambda s: s.user_id)[:users]
    reqs = month_requests(cfg, ds, splits, month_name)
    probs, _ = candidate_click_probabilities(cfg, ds, reqs)
    k = max(len(r.candidates) for r in reqs)
    p = np.zeros((len(reqs), k))
    mask = np.zeros((len(reqs), k), dtype=bool)
    items = np.zeros((len(reqs), k), dtype=np.int64)
    for i, (r, pr) in enumerate(zip(reqs, probs, strict=True)):
        p[i, : len(pr)], mask[i, : len(pr)], items[i, : len(pr)] = pr, True, r.candidates
    counts: dict[int, int] = {}
    for s in splits:
        for it in s.history:
            counts[int(it)] = counts.get(int(it), 0) + 1
    return reqs, p, mask, items, counts


TAU, SIGMA = 2.0, 2.0  # the LLM stand-ins' temperature and noise: a top candidate's exposure ~0.25 on average


def policies(p, mask, items, counts, seed: int, tau: float = TAU, sigma: float = SIGMA):
    """The module docstring's exposures: (scores s_k per policy, logging arms' exposures, champion pi_c)."""
    rng = np.random.default_rng([seed, 7])
    logit = np.log(np.clip(p, 1e-6, 1 - 1e-6) / (1 - np.clip(p, 1e-6, 1 - 1e-6)))
    n_items = int(items.max()) + 1

    def view(noise: float) -> np.ndarray:
        per_item = rng.standard_normal(n_items)[items]
        per_request = rng.standard_normal(p.shape)
        return logit + noise * (per_item + per_request) / math.sqrt(2.0)

    s = {k: view(sigma) for k in (1, 2, 3, 4)}
    s[5] = view(2 * sigma)
    logpop = np.log1p(np.vectorize(lambda a: counts.get(int(a), 0))(items).astype(np.float64))
    arms = {
        "abpo": _softmax(s[1] / tau, mask),
        "grpo": _softmax(s[3] / tau, mask),
        "grpo_cr": _softmax(s[4] / tau, mask),
        "holdback": _softmax(s[5] / tau, mask),
        "ml_retrain": _softmax(logpop / 0.1, mask),
        "popularity": _softmax(logpop / 0.5, mask),
    }
    return s, arms


def challenger(s, lam: float, mask, tau: float = TAU) -> np.ndarray:
    return _softmax((s[1] + lam * s[2]) / tau, mask)


def true_ctr(pi: np.ndarray, p: np.ndarray) -> float:
    """Eq. H1 of abpo.sim.headroom on the month's requests."""
    return float((pi * p).sum(axis=1).mean())


def draw_logs(rng, reqs, p, arms, mask):
    """One simulated month of logs: each user's arm by SHARES, each request's exposed item from its arm's
    exposures (e0), its click ~ Bernoulli(p)."""
    users = np.array([r.user_id for r in reqs])
    uniq, inv = np.unique(users, return_inverse=True)
    names = list(SHARES)
    arm_of_user = rng.choice(len(names), size=uniq.size, p=np.array([SHARES[a] for a in names]))
    arm = arm_of_user[inv]
    e = np.stack([arms[a] for a in names])[arm, np.arange(len(reqs))]  # (R, K) the serving arm's exposures
    cum = np.cumsum(e, axis=1)
    logged = (rng.random(len(reqs))[:, None] > cum).sum(axis=1)
    logged = np.minimum(logged, mask.sum(axis=1) - 1)
    rows = np.arange(len(reqs))
    e0 = e[rows, logged]
    clicked = (rng.random(len(reqs)) < p[rows, logged]).astype(np.int64)
    return np.array(names)[arm], logged, e0, clicked, users


def replicate(rng_seed: int, reqs, p, mask, items, arms, pi_new, pi_champ, n_boot: int, switch_lambda: float):
    from abpo.monthly.gate import ope_estimates_on_rows

    rng = np.random.default_rng(rng_seed)
    arm, logged, e0, clicked, users = draw_logs(rng, reqs, p, arms, mask)
    rows = np.arange(len(reqs))
    cands = [list(items[i, mask[i]]) for i in rows]
    return ope_estimates_on_rows(
        candidates=cands,
        logged_items=items[rows, logged].tolist(),
        history_lengths=[len(r.history) for r in reqs],
        clicked=clicked,
        e0=e0,
        challenger=[pi_new[i, mask[i]] for i in rows],
        champion=[pi_champ[i, mask[i]] for i in rows],
        users=users,
        own=arm == CHAMPION_ARM,
        n_boot=n_boot,
        seed=rng_seed,
        switch_lambda=switch_lambda,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--config", default="demo")
    ap.add_argument("--month", default="2026-01")
    ap.add_argument("--reps", type=int, default=200, help="simulated months (replications of the logs)")
    ap.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples per interval (the gate's default)")
    ap.add_argument("--users", type=int, default=0, help="the first N users (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--tau",
        type=float,
        default=1.0,
        help="the loop's exposure temperature policy.tau: the LLM stand-ins expose at "
        f"softmax(s / ({TAU:g} x tau)), so tau 0.5 is twice as sharp as the default (1: a top candidate ~0.25)",
    )
    ap.add_argument("--json", default="")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args(argv)
    if a.smoke:
        a.users, a.reps, a.n_boot = 40, 3, 200
    if not (math.isfinite(a.tau) and a.tau > 0):
        raise SystemExit(f"--tau {a.tau}: rule: a positive, finite temperature")
    tau = TAU * a.tau
    from abpo.config import load_config

    t0 = time.time()
    cfg = load_config(a.config)
    switch_lambda = cfg.arms.gate_ope_switch_lambda
    reqs, p, mask, items, counts = month(cfg, a.month, a.users)
    s, arms = policies(p, mask, items, counts, a.seed, tau=tau)
    pi_c = arms[CHAMPION_ARM]
    pilot = replicate(
        10_000 + a.seed, reqs, p, mask, items, arms, challenger(s, 1.0, mask, tau), pi_c, a.n_boot, switch_lambda
    )
    z = NormalDist().inv_cdf
    mde = (z(0.975) + z(0.8)) * pilot["dr"]["boot_se"]
    lo, hi = 0.0, 4.0
    for _ in range(40):  # CTR(pi_n) - CTR(pi_c) increases with lam
        lam = 0.5 * (lo + hi)
        lo, hi = (lam, hi) if true_ctr(challenger(s, lam, mask, tau), p) - true_ctr(pi_c, p) < mde else (lo, lam)
    pi_n = challenger(s, lam, mask, tau)
    truth = true_ctr(pi_n, p) - true_ctr(pi_c, p)
    print(
        f"{a.config} month {a.month}, tau {a.tau:g} (stand-ins at {tau:g}): {len(reqs)} requests of {len({r.user_id for r in reqs})} users, "
        f"{mask.sum(axis=1).max()} candidates; true CTR champion {true_ctr(pi_c, p):.4f}, challenger "
        f"{true_ctr(pi_n, p):.4f} (lam {lam:.3f}): difference {truth:+.5f} = the pilot's DR MDE {mde:.5f}; "
        f"logging arms' CTR " + ", ".join(f"{k} {true_ctr(v, p):.4f}" for k, v in arms.items())
    )
    est: dict[str, list[tuple[float, float, float]]] = {}
    for r in range(a.reps):
        out = replicate(a.seed * 100_003 + r, reqs, p, mask, items, arms, pi_n, pi_c, a.n_boot, switch_lambda)
        for name, o in out.items():
            est.setdefault(name, []).append((o["diff"], o["ci_low"], o["ci_high"]))
        if (r + 1) % 25 == 0:
            print(f"  {r + 1}/{a.reps} replications, {time.time() - t0:.0f}s", flush=True)
    rows = []
    for name, vals in est.items():
        v = np.array(vals)
        ok = np.isfinite(v).all(axis=1)
        d, lo_, hi_ = v[ok, 0], v[ok, 1], v[ok, 2]
        cover = float(np.mean((lo_ <= truth) & (truth <= hi_)))
        rows.append(
            {
                "estimator": name,
                "bias": float(d.mean() - truth),
                "rmse": float(np.sqrt(np.mean((d - truth) ** 2))),
                "sd": float(d.std(ddof=1)) if d.size > 1 else math.nan,
                "coverage": cover,
                "coverage_se": math.sqrt(max(cover * (1 - cover), 1e-12) / max(d.size, 1)),
                "width": float(np.mean(hi_ - lo_)),
                "finite": int(ok.sum()),
            }
        )
    print(f"\n{a.reps} simulated months, true difference {truth:+.5f}, {a.n_boot} resamples per interval")
    print("| estimator | rows | bias | RMSE | SD | 95% coverage (SE) | mean width |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        scope = "champion arm's own" if r["estimator"] == "snips" else "every arm's"
        print(
            f"| {r['estimator']} | {scope} | {r['bias']:+.5f} | {r['rmse']:.5f} | {r['sd']:.5f} | "
            f"{r['coverage']:.3f} ({r['coverage_se']:.3f}) | {r['width']:.5f} |"
        )
    wall = time.time() - t0
    print(f"wall time {wall:.0f}s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {"tau": a.tau, "truth": truth, "mde": mde, "lam": lam, "reps": a.reps, "rows": rows, "wall_s": wall}, f
            )
    best = min(rows, key=lambda r: (abs(r["coverage"] - 0.95), r["rmse"]))
    by = {r["estimator"]: r["coverage"] for r in rows}
    print(
        f"coverage of the true difference at nominal 95%: best {best['estimator']} {best['coverage']:.3f}; "
        f"dr {by['dr']:.3f}; snips {by['snips']:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
