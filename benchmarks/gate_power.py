"""The monthly gate's error rates: how often it passes a challenger whose true expected-CTR difference over its
champion is known, for the gate the preset runs and for the gate before the off-policy decision, in one run.

Challengers of known strength are mixtures of two of the bootstrap's own policies, scored by the simulator's Eq. H1
(abpo.sim.headroom: CTR(pi) = (1/R) sum_r sum_a pi(a|r) p_r(a) on the month's requests, no click noise), which is
linear in pi:

    H, L        the better and the worse of pi_init (the LLM arm's version 1) and the first ML-retrain fit (ALS),
                by Eq. H1; when their gap G = CTR(H) - CTR(L) is below the largest |delta| asked, L is ALS mixed
                with the popularity ranker at the weight that makes G 5% above it
    M(x)        (1 - x) L + x H: on every request, exposure (1 - x) pi_L + x pi_H; offline, each gate user's
                target rank is H's with probability x, else L's (a request-level mixture of the two versions)
    delta       champion M(0.5 - delta / 2G), challenger M(0.5 + delta / 2G): true difference exactly delta

pi_init and ALS have about equal offline HR@5 and different CTR (the loop's situation: an update that moves CTR
without moving HR@5), so both halves of the gate are tried on what each sees. Each simulated month draws, by the
seed fixed below: every user's arm by report.arm_shares (the LLM arms and the holdback serve the champion, ML-retrain
ALS, popularity its ranker), each request's exposed item from its arm's exposures (e0 = that probability, as
logged) and its click ~ Bernoulli(p_r(a)), and each gate user's component for both versions. Then the whole gate
runs on it as the monthly step runs it (abpo.monthly.gate: ope_estimates_on_rows, ope_numbers, gate_verdict on the
users' ranks; only the scoring and the registry are replaced by the numbers above):

    gate        the preset's: arms.gate_primary, the off-policy half on the rows arms.gate_ope_rows names (every arm's
                rows of the held-out users, arms.gate_holdout_fraction, by default), arms.gate_ope_margin, the
                offline guardrail at arms.gate_guardrail_margin
    before      the gate before the off-policy decision: the offline paired HR@5 test at margin 0.02 and the
                off-policy half on every row of the month at margin 0.05, both must pass

``--fractions`` also measures the redesign (arms.gate_primary = ope on the held-out users' rows, margin 0.5 points,
or the preset's margins when it runs that design) at each held-out share on the same draws (the design's choice).
Today's defaults are the redesign; ``--set arms.gate_primary=offline --set arms.gate_ope_rows=all --set
arms.gate_ope_margin=0.05`` makes the preset's gate the former one.
The simulator's truth stays here: the gate reads logs and ranks only. Mixture stand-ins never saw the month's logs,
so they cannot show the in-sample optimism of a gate that reads the rows its challenger trained on (docs/gate.md
"In-sample") .

    .venv/bin/python benchmarks/gate_power.py [--config demo] [--series validation|reported] [--set KEY=VALUE ...]
        [--months-per-delta 200] [--deltas -2,-1,-0.5,0,0.5,1,2] [--fractions 0.1,0.25,0.5] [--json OUT] [--smoke]

The state: ``ABPO_STATE`` (or --set paths.root=DIR) when its arms are bootstrapped, else the arms are bootstrapped
there first (minutes). ``--smoke`` bootstraps a throw-away state at benchmarks/headroom.py's smoke sizes and runs 3
months per delta with 100 resamples (seconds; the figures mean nothing). OUT is ``{"preset", "tau", "series",
"gate": G, "before": G, "fractions": {share: G}}`` with G ``{"rows": [{"delta_pp", "months", "pass_rate",
"offline_pass_rate", "ope_pass_rate"}], "size", "power_at_1pp"}``: ``size`` the largest pass rate at any delta <=
-0.5 points, ``power_at_1pp`` the pass rate at +1. The last line is exactly
`gate power: size <s> power at +1pp <p> (before: size <s0> power <p0>)`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ope_coverage  # noqa: E402  (benchmarks/: the month's matrices)

# Fixed before the redesign was scored: the grid of true differences (CTR points), the months per delta, the seed
# of every draw, and the validation series the design is chosen on (docs/gate.md "Error rates").
DELTAS_PP = (-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0)
MONTHS_PER_DELTA = 200
SEED = 20261202
VALIDATION = ["seed=1", "sim.salt=validation-series"]
FRACTIONS = (0.1, 0.25, 0.5)
# the gate before the off-policy decision (today's defaults), and the redesign the --fractions rows measure
BEFORE = {"primary": "offline", "margin": 0.02, "ope_margin": 0.05, "rows": "all"}
REDESIGN = {"primary": "ope", "margin": 0.02, "ope_margin": 0.005}


def ranks_from_scores(scores: np.ndarray, target: int) -> int:
    """1-based rank of candidate ``target`` by ``scores`` (higher first), ties after the candidates listed before
    it (the candidates are a seeded shuffle)."""
    s = scores[target]
    return int(1 + np.sum(scores > s) + np.sum(scores[:target] == s))


def components(cfg, ds, reqs, gate_set):
    """{name: (exposures (R, K) zero-padded, offline ranks (U,))} of pi_init, ALS (ml_retrain) and popularity."""
    from headroom import pi_init_arm

    from abpo.arms import versions
    from abpo.monthly.gate import offline_scores

    examples, _, _ = gate_set
    k = max(len(r.candidates) for r in reqs)
    served = [(r.user_id, list(r.history), list(r.candidates)) for r in reqs]
    offline = [(e.user_id, list(e.history), list(e.candidates)) for e in examples]
    out = {}
    llm = pi_init_arm(cfg, ds)
    arms = {"pi_init": llm, "als": versions.load_arm(cfg, "ml_retrain", ds), "popularity": None}
    arms["popularity"] = versions.load_arm(cfg, "popularity", ds)
    for name, arm in arms.items():
        e = np.zeros((len(reqs), k))
        for i, p in enumerate(arm.propensities(served)):
            e[i, : len(p)] = p
        if name == "pi_init":
            _, ranks = offline_scores(cfg, llm.name, "1", gate_set=gate_set)
        else:
            ranks = [
                ranks_from_scores(np.asarray(p, dtype=np.float64), list(ex.candidates).index(ex.positive))
                for p, ex in zip(arm.propensities(offline), examples, strict=True)
            ]
        out[name] = (e, np.asarray(ranks, dtype=np.int64))
    return out


def true_ctr(e: np.ndarray, p: np.ndarray) -> float:
    """Eq. H1 of abpo.sim.headroom on the month's requests."""
    return float((e * p).sum(axis=1).mean())


def build_pair(comps, p, max_delta_pp: float):
    """(H, L, G, CTRs): H and L as lists of (weight, component name), their Eq. H1 gap G (CTR points), and every
    component's CTR. H and L are the better and the worse of pi_init and ALS; when G is below 1.05 x the largest
    |delta|, popularity is mixed into the side it extends (L when it is worse than both, H when better) at the
    weight that makes G 1.05 x that; None when no such mixture spans it."""
    v = {n: true_ctr(e, p) * 100 for n, (e, _) in comps.items()}
    hi, lo = sorted(("pi_init", "als"), key=lambda n: -v[n])
    gap, want = v[hi] - v[lo], 1.05 * max_delta_pp
    high, low = [(1.0, hi)], [(1.0, lo)]
    if gap < want:
        pop = v["popularity"]
        reach = max(v[hi] - pop, pop - v[lo]) - gap
        if reach <= 0 or gap + reach < want:
            return None, None, gap, v
        w = (want - gap) / reach
        if pop < v[lo]:
            low = [(1.0 - w, lo), (w, "popularity")]
        else:
            high = [(1.0 - w, hi), (w, "popularity")]
        gap = want
    return high, low, gap, v


def values_gap(values: dict) -> float:
    """The widest gap between pi_init or ALS and another component (what a mixture can span)."""
    return max(abs(values[a] - values[b]) for a in ("pi_init", "als") for b in values if b != a)


def mixture(parts, comps):
    return sum(w * comps[n][0] for w, n in parts)


def draw_ranks(rng, x: float, high, low, comps) -> np.ndarray:
    """Each gate user's rank under M(x): H's with probability x, else one of L's parts by its weights."""
    names = [n for _, n in high] + [n for _, n in low]
    probs = [x * w for w, _ in high] + [(1 - x) * w for w, _ in low]
    pick = rng.choice(len(names), size=comps[names[0]][1].size, p=np.asarray(probs) / sum(probs))
    stack = np.stack([comps[n][1] for n in names])
    return stack[pick, np.arange(stack.shape[1])]


def draw_month(rng, reqs, p, mask, exposures_by_arm: dict, shares: dict):
    """One simulated month of logs: (arm per row, logged index, e0, clicked, users)."""
    users = np.array([r.user_id for r in reqs])
    uniq, inv = np.unique(users, return_inverse=True)
    names = list(shares)
    arm_of_user = rng.choice(len(names), size=uniq.size, p=np.array([shares[a] for a in names]))
    arm = arm_of_user[inv]
    e = np.stack([exposures_by_arm[a] for a in names])[arm, np.arange(len(reqs))]
    cum = np.cumsum(e, axis=1)
    logged = np.minimum((rng.random(len(reqs))[:, None] > cum).sum(axis=1), mask.sum(axis=1) - 1)
    rows = np.arange(len(reqs))
    e0 = e[rows, logged]
    clicked = (rng.random(len(reqs)) < p[rows, logged]).astype(np.int64)
    return np.array(names)[arm], logged, e0, clicked, users


def one_gate(cfg, *, rows_mask, arm, logged, e0, clicked, users, reqs, items, mask, pi_new, pi_old, ranks, how, seed):
    """The gate's verdict (abpo.monthly.gate_verdict.GateVerdict) on the rows of ``rows_mask``."""
    from abpo.monthly.gate import ope_estimates_on_rows, ope_numbers
    from abpo.monthly.gate_verdict import gate_verdict

    idx = np.flatnonzero(rows_mask)
    a = cfg.arms
    est = ope_estimates_on_rows(
        candidates=[list(items[i, mask[i]]) for i in idx],
        logged_items=items[idx, logged[idx]].tolist(),
        history_lengths=[len(reqs[i].history) for i in idx],
        clicked=clicked[idx],
        e0=e0[idx],
        challenger=[pi_new[i, mask[i]] for i in idx],
        champion=[pi_old[i, mask[i]] for i in idx],
        users=users[idx].tolist(),
        own=arm[idx] == "abpo",
        n_boot=a.gate_ope_bootstrap,
        seed=seed,
        switch_lambda=a.gate_ope_switch_lambda,
        top_fraction=a.gate_top_weight_fraction,
    )
    ope = ope_numbers(est, a.gate_ope_estimator)
    return gate_verdict(
        metric=a.gate_metric,
        challenger_ranks=ranks[1].tolist(),
        champion_ranks=ranks[0].tolist(),
        margin=how["margin"],
        alpha=a.gate_alpha,
        power=a.gate_power,
        challenger_version="challenger",
        champion_version="champion",
        ope=ope,
        ope_margin=how["ope_margin"],
        min_ess=a.gate_min_ess,
        max_top_share=a.gate_max_top_weight_share,
        primary=how["primary"],
        guardrail_margin=a.gate_guardrail_margin,
    )


def mixed_pair(c_pp: float, l_pp: float, delta: float) -> tuple[float, float]:
    """(x, y) for challenger (1 - x) C + x L and champion (1 - y) pi_init + y L whose Eq. H1 difference
    (1 - x) c + x l - y l is exactly ``delta`` (CTR points), given C - pi_init = ``c_pp`` = c and L - pi_init =
    ``l_pp`` = l: between c and l the challenger is moved towards L (y = 0), else the champion is (x = 0, the
    challenger keeps all of C); (nan, nan) where neither reaches ``delta`` (:func:`mixed_span`)."""
    lo, hi = sorted((c_pp, l_pp))
    if lo <= delta <= hi and hi > lo:
        return (delta - c_pp) / (l_pp - c_pp), 0.0
    y = (c_pp - delta) / l_pp if l_pp else math.nan
    return (0.0, y) if 0.0 <= y <= 1.0 else (math.nan, math.nan)


def mixed_span(c_pp: float, l_pp: float) -> tuple[float, float]:
    """The deltas :func:`mixed_pair` reaches: from the smallest to the largest of c, l and c - l."""
    return min(c_pp, l_pp, c_pp - l_pp), max(c_pp, l_pp, c_pp - l_pp)


def in_sample_probe(cfg, ds, splits, n: int, fraction: float, deltas=DELTAS_PP, *, span: bool = False) -> dict:
    """Challengers trained on a month's logs the way the loop trains them, scored by the off-policy half on the rows
    each trained on (today's gate: every row of the month) and on rows it never saw (the redesign: the held-out
    users', which its twin's update left out). Replicate r >= 1 is the month under sim.replicate = r (other
    assignment, candidates, exposures and clicks on the same data and pi_init): every LLM arm serves pi_init, the
    rankers their first fits (abpo.sim.simulator.simulate_month, nothing landed). Two updates from pi_init with the
    `wll` arm's settings (abpo.arms.llm: arms.update_max_examples rows, section update, the arm's update_by_arm
    entry): one on every row (the loop today), one without the held-out users' rows. Truth: Eq. H1 of each
    challenger minus pi_init on the month's requests (every row's candidate_click_prob).

    Error rates at each ``delta``: from each trained challenger C (C - pi_init = c by Eq. H1) and the popularity
    ranker L (L - pi_init = l < 0), the challenger (1 - x) C + x L against the champion (1 - y) pi_init + y L
    (:func:`mixed_pair`; a row-level mixture of exposures, offline each gate user's rank drawn from the parts at
    their weights), so the true difference is exactly delta and the challenger keeps the trained part's optimism on
    its own rows. The whole gate runs on the replicate's month as the monthly step runs it: "before" on every row,
    its challenger trained on every row, at the former margins; "gate" on the held-out users' rows, its challenger
    trained without them, at the preset's. ``span`` (the smoke's untrained policies) maps the grid linearly into
    what each replicate's mixtures reach (:func:`mixed_span`) instead of skipping the deltas they do not. Each design's estimators' coverage of the truth (out of sample for
    "gate") over every (replicate, delta). Returns per-replicate rows, each design's mean error (estimate - truth)
    with its standard error, in CTR points, and G tables (:func:`summary`) per design."""
    import dataclasses

    import pyarrow as pa
    import pyarrow.compute as pc
    from headroom import pi_init_arm, served_month_strata

    from abpo.arms import versions
    from abpo.arms.names import LLM, arm_class, entry
    from abpo.monthly.common import arms_of
    from abpo.monthly.gate import gate_rows, offline_scores, ope_estimates_on_rows, ope_numbers
    from abpo.monthly.gate_users import dataset_gate_examples
    from abpo.monthly.gate_verdict import gate_verdict
    from abpo.policy.evaluate import evaluate_policy
    from abpo.policy.model import load_policy
    from abpo.sim.headroom import candidate_click_probabilities
    from abpo.sim.simulator import month_requests
    from abpo.train.runs import UpdateRun
    from abpo.train.update import run_update

    month = cfg.sim.start_month
    arm = "wll" if "wll" in cfg.arms.names else next(a for a in arms_of(cfg) if entry(a).kind == LLM)
    pi0 = pi_init_arm(cfg, ds)
    pop = versions.load_arm(cfg, "popularity", ds)
    gate_set = dataset_gate_examples(cfg)
    examples, popularity, _ = gate_set
    offline = [(e.user_id, list(e.history), list(e.candidates)) for e in examples]
    ranks0 = np.asarray(offline_scores(cfg, pi0.name, "1", gate_set=gate_set)[1], dtype=np.int64)
    ranks_pop = np.asarray(
        [
            ranks_from_scores(np.asarray(p, dtype=np.float64), list(ex.candidates).index(ex.positive))
            for p, ex in zip(pop.propensities(offline), examples, strict=True)
        ],
        dtype=np.int64,
    )
    a_ = cfg.arms
    designs = {
        "before": BEFORE,
        "gate": {"primary": a_.gate_primary, "margin": a_.gate_margin, "ope_margin": a_.gate_ope_margin},
    }
    out, cells = [], {d: [] for d in designs}
    for r in range(1, n + 1):
        t = time.perf_counter()
        c = dataclasses.replace(cfg, sim=dataclasses.replace(cfg.sim, replicate=r))
        reqs = month_requests(c, ds, splits, month)
        probs, _ = candidate_click_probabilities(c, ds, reqs)
        served = {
            a: pi0 if entry(a).kind == LLM or a == "holdback" else versions.load_arm(c, a, ds) for a in c.arms.names
        }
        pos, neg = served_month_strata(c, month, served, dataset=ds, splits=splits, requests=reqs, probs=probs)
        rows = pa.concat_tables([pos, neg])
        held = gate_rows(rows, c.seed, fraction)
        held_users = pa.array(sorted(set(held.column("user_id").to_pylist())), pa.int64())

        def kept(t_, users=held_users):
            return t_.filter(pc.invert(pc.is_in(t_.column("user_id"), value_set=users)))

        reqs_rows = list(
            zip(
                rows.column("user_id").to_pylist(),
                rows.column("history").to_pylist(),
                rows.column("candidates").to_pylist(),
            )
        )
        p_click = [np.asarray(x, dtype=np.float64) for x in rows.column("candidate_click_prob").to_pylist()]
        e_old = [np.asarray(x, dtype=np.float64) for x in pi0.propensities(reqs_rows)]
        e_pop = [np.asarray(x, dtype=np.float64) for x in pop.propensities(reqs_rows)]

        def h1(e_a, e_b, q_=p_click):  # Eq. H1 difference, CTR points, on the month's requests
            return 100 * float(np.mean([((x - y) * q).sum() for x, y, q in zip(e_a, e_b, q_, strict=True)]))

        l_pp = h1(e_pop, e_old)
        col = {k: rows.column(k).to_pylist() for k in ("candidates", "item_id", "history", "clicked", "user_id")}
        e0_all = np.asarray(rows.column("propensity").to_pylist(), dtype=np.float64)
        own_all = np.asarray([x == arm for x in rows.column("arm").to_pylist()], dtype=bool)
        u = c.arms.update_settings(arm, dataclasses.replace(c.update, resume=False, save_merged=True))
        row = {"replicate": r, "popularity_pp": l_pp}
        for design, strata, scored in (
            ("before", (pos, neg), rows),
            ("gate", (kept(pos), kept(neg)), held),
        ):
            run = UpdateRun(
                variant=entry(arm).refreshed_by,
                arm=arm,
                months=(month,),
                init_model=versions.local_dir(c, pi0.name, "1"),
                output=Path("gate-power") / f"replicate-{r}" / design,
            )
            res = run_update(dataclasses.replace(c, update=u), run, progress=False, strata=strata, log_mlflow=False)
            new = arm_class(arm).load(arm, res.model_dir, c, dataset=ds, model_version=f"{design}-r{r}")
            e_new = [np.asarray(x, dtype=np.float64) for x in new.propensities(reqs_rows)]
            truth = h1(e_new, e_old)
            model, tok = load_policy(dataclasses.replace(c.policy, model=str(res.model_dir)), c.paths, dataset=ds)
            ranks_c = np.asarray(
                evaluate_policy(
                    model, tok, examples, ds.titles(), c.policy, popularity=popularity, progress=False
                ).ranks,
                dtype=np.int64,
            )
            ids = set(scored.column("request_id").to_pylist())
            sel = [i for i, rid in enumerate(rows.column("request_id").to_pylist()) if rid in ids]

            def estimate(challenger, champion, seed, sel=sel, col=col, e0_all=e0_all, own_all=own_all, c=c):
                return ope_estimates_on_rows(
                    candidates=[col["candidates"][i] for i in sel],
                    logged_items=[col["item_id"][i] for i in sel],
                    history_lengths=[len(col["history"][i] or ()) for i in sel],
                    clicked=[col["clicked"][i] for i in sel],
                    e0=e0_all[sel],
                    challenger=[challenger[i] for i in sel],
                    champion=[champion[i] for i in sel],
                    users=[col["user_id"][i] for i in sel],
                    own=own_all[sel],
                    n_boot=c.arms.gate_ope_bootstrap,
                    seed=seed,
                    switch_lambda=c.arms.gate_ope_switch_lambda,
                    top_fraction=c.arms.gate_top_weight_fraction,
                )

            ope = ope_numbers(estimate(e_new, e_old, c.seed + r), c.arms.gate_ope_estimator)
            row[design] = {
                "rows_trained": strata[0].num_rows + strata[1].num_rows,
                "rows_scored": len(sel),
                "truth_pp": truth,
                "estimate_pp": 100 * float(ope["diff"]),
                "ci_low_pp": 100 * float(ope["ci_low"]),
                "ci_high_pp": 100 * float(ope["ci_high"]),
                "hr_at_5": float(np.mean(ranks_c <= 5)),
            }
            how = designs[design]
            grid = deltas
            if span:
                lo, hi = mixed_span(truth, l_pp)
                d0, d1 = min(deltas), max(deltas)
                grid = [lo + (hi - lo) * (0.05 + 0.9 * (d - d0) / ((d1 - d0) or 1.0)) for d in deltas]
            for di, delta in enumerate(grid):
                x, y = mixed_pair(truth, l_pp, delta)
                if math.isnan(x):
                    continue
                challenger = [(1 - x) * a + x * b for a, b in zip(e_new, e_pop, strict=True)]
                champion = [(1 - y) * a + y * b for a, b in zip(e_old, e_pop, strict=True)]
                got = h1(challenger, champion)
                assert abs(got - delta) < 1e-6, (got, delta)
                seed = SEED + 100_000 + 1000 * r + di
                rng = np.random.default_rng(seed)
                ranks_new = np.where(rng.random(ranks_c.size) < x, ranks_pop, ranks_c)
                ranks_old = np.where(rng.random(ranks0.size) < y, ranks_pop, ranks0)
                est = estimate(challenger, champion, seed)
                numbers = ope_numbers(est, c.arms.gate_ope_estimator)
                v = gate_verdict(
                    metric=a_.gate_metric,
                    challenger_ranks=ranks_new.tolist(),
                    champion_ranks=ranks_old.tolist(),
                    margin=how["margin"],
                    alpha=a_.gate_alpha,
                    power=a_.gate_power,
                    challenger_version="challenger",
                    champion_version="champion",
                    ope=numbers,
                    ope_margin=how["ope_margin"],
                    min_ess=a_.gate_min_ess,
                    max_top_share=a_.gate_max_top_weight_share,
                    primary=how["primary"],
                    guardrail_margin=a_.gate_guardrail_margin,
                )
                cover = {
                    name: bool(100 * e["ci_low"] <= delta <= 100 * e["ci_high"])
                    for name, e in est.items()
                    if e.get("n") and not math.isnan(e["ci_low"])
                }
                cells[design].append(
                    {
                        "replicate": r,
                        "delta_pp": delta,
                        "x": x,
                        "y": y,
                        "passed": v.passed,
                        "offline_passed": v.offline_passed,
                        "ope_passed": v.ope_passed,
                        "estimate_pp": 100 * float(numbers["diff"]),
                        "ci_low_pp": 100 * float(numbers["ci_low"]),
                        "covered": cover,
                    }
                )
        out.append(row)
        b, g = row["before"], row["gate"]
        print(
            f"  in-sample replicate {r}: trained on every row: truth {b['truth_pp']:+.2f}, estimate on its own rows "
            f"{b['estimate_pp']:+.2f} [{b['ci_low_pp']:+.2f}, {b['ci_high_pp']:+.2f}]; trained without the held-out "
            f"users: truth {g['truth_pp']:+.2f}, estimate on their {g['rows_scored']} rows {g['estimate_pp']:+.2f} "
            f"[{g['ci_low_pp']:+.2f}, {g['ci_high_pp']:+.2f}]; passed at "
            + "; ".join(
                f"{d_} " + "".join("P" if x["passed"] else "." for x in cells[d_] if x["replicate"] == r)
                for d_ in designs
            )
            + " (P passed, . refused, by delta ascending)"
            + f" ({time.perf_counter() - t:.0f}s)",
            flush=True,
        )
    summary_ = {}
    for design in designs:
        err = np.array([x[design]["estimate_pp"] - x[design]["truth_pp"] for x in out])
        cover = np.mean([x[design]["ci_low_pp"] <= x[design]["truth_pp"] <= x[design]["ci_high_pp"] for x in out])
        names = sorted({k for x in cells[design] for k in x["covered"]})
        summary_[design] = {
            "mean_error_pp": float(err.mean()),
            "error_se_pp": float(err.std(ddof=1) / math.sqrt(err.size)) if err.size > 1 else math.nan,
            "coverage": float(cover),
            "mean_truth_pp": float(np.mean([x[design]["truth_pp"] for x in out])),
            "coverage_by_estimator": {
                k: float(np.mean([x["covered"][k] for x in cells[design] if k in x["covered"]])) for k in names
            },
        }

    def table(design: str) -> dict:
        rows_ = []
        for delta in sorted({x["delta_pp"] for x in cells[design]}):
            t_ = [x for x in cells[design] if x["delta_pp"] == delta]
            if t_:
                rows_.append(
                    {
                        "delta_pp": delta,
                        "months": len(t_),
                        "pass_rate": float(np.mean([x["passed"] for x in t_])),
                        "offline_pass_rate": float(np.mean([x["offline_passed"] for x in t_])),
                        "ope_pass_rate": float(np.mean([x["ope_passed"] for x in t_])),
                        "mean_error_pp": float(np.mean([x["estimate_pp"] - delta for x in t_])),
                    }
                )
        return summary(rows_)

    return {
        "arm": arm,
        "month": month,
        "fraction": fraction,
        "replicates": out,
        "summary": summary_,
        "gate": table("gate"),
        "before": table("before"),
        "cells": cells,
    }


def print_in_sample(probe: dict) -> None:
    """The in-sample probe's pass-rate table (trained challengers, one month each per delta) and errors."""
    deltas = [r["delta_pp"] for r in probe["gate"]["rows"]]
    print("\n| trained challengers | " + " | ".join(f"{d:+g}" for d in deltas) + " | size | power at +1 |")
    print("|---|" + "---|" * (len(deltas) + 2))
    for name in ("gate", "before"):
        g = probe[name]
        cells = " | ".join(f"{r['pass_rate']:.2f}" for r in g["rows"])
        print(f"| {name} ({g['rows'][0]['months'] if g['rows'] else 0} months per delta) | {cells} | {g['size']:.2f} "
              f"| {g['power_at_1pp']:.2f} |")  # fmt: skip
    m = probe["summary"]
    print(
        f"in-sample error of the off-policy estimate: on the rows it trained on {m['before']['mean_error_pp']:+.2f} "
        f"(SE {m['before']['error_se_pp']:.2f}) points; on held-out rows {m['gate']['mean_error_pp']:+.2f} "
        f"(SE {m['gate']['error_se_pp']:.2f}); coverage on held-out rows "
        + ", ".join(f"{k} {v:.2f}" for k, v in m["gate"]["coverage_by_estimator"].items()),
        flush=True,
    )


def summary(rows: list[dict]) -> dict:
    """G of the module docstring from its rows."""
    size = max((r["pass_rate"] for r in rows if r["delta_pp"] <= -0.5), default=math.nan)
    at1 = [r["pass_rate"] for r in rows if abs(r["delta_pp"] - 1.0) < 1e-9]
    return {"rows": rows, "size": size, "power_at_1pp": at1[0] if at1 else math.nan}


def main(argv=None) -> int:
    from abpo.logs import progress_bars_only_on_a_terminal

    progress_bars_only_on_a_terminal()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="demo")
    ap.add_argument("--series", choices=("validation", "reported"), default="validation")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--months-per-delta", type=int, default=MONTHS_PER_DELTA)
    ap.add_argument("--deltas", default=",".join(f"{d:g}" for d in DELTAS_PP))
    ap.add_argument("--fractions", default=",".join(f"{f:g}" for f in FRACTIONS))
    ap.add_argument(
        "--in-sample",
        type=int,
        default=0,
        metavar="N",
        help="also train N pairs of wll challengers on replicated months (one on every row, one without the held-out "
        "users), measure the off-policy half's error on the rows each trained on and on rows it never saw, and run "
        "the whole gate (both designs) on each at every delta (the challenger mixed with popularity)",
    )
    ap.add_argument("--only-in-sample", action="store_true", help="skip the mixtures' error rates")
    ap.add_argument("--json", default="")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    deltas = [float(x) for x in args.deltas.split(",") if x.strip()]
    fractions = [float(x) for x in args.fractions.split(",") if x.strip()]

    import tempfile

    from abpo.config import load_config
    from abpo.data.holdout import in_holdout
    from abpo.monthly.common import dataset_and_splits
    from abpo.monthly.gate_users import dataset_gate_examples

    t0 = time.perf_counter()
    series = VALIDATION if args.series == "validation" else []
    months, extra = args.months_per_delta, []
    if args.smoke:
        from headroom import SMOKE

        state = tempfile.mkdtemp(prefix="abpo-bench-gate-power-")
        extra = [*SMOKE, f"paths.root={state}", "arms.gate_ope_bootstrap=100"]
        months = 3
    cfg = load_config(args.config, [*series, *extra, *args.set])
    from abpo.arms import versions

    if versions.get_version(cfg, "popularity") is None or versions.get_version(cfg, cfg.arms.names[0], "1") is None:
        from abpo.logs import quiet
        from abpo.monthly.bootstrap import bootstrap_arms

        print(f"bootstrapping the arms in {cfg.paths.resolve('root')} (no bootstrapped state there)", flush=True)
        with quiet():
            bootstrap_arms(cfg)
    ds, splits = dataset_and_splits(cfg)
    if args.only_in_sample:
        probe = in_sample_probe(
            cfg, ds, splits, args.in_sample, cfg.arms.gate_holdout_fraction, deltas, span=args.smoke
        )
        if args.json:
            Path(args.json).write_text(
                json.dumps({"preset": args.config, "series": args.series, "tau": cfg.policy.tau, "in_sample": probe})
            )
        print_in_sample(probe)
        return 0
    month = cfg.sim.start_month
    # the month's requests and click probabilities as (R, K) matrices, as benchmarks/ope_coverage.py builds them
    reqs, p, mask, items, _ = ope_coverage.month(cfg, month, 0)
    k = p.shape[1]
    gate_set = dataset_gate_examples(cfg)
    comps = components(cfg, ds, reqs, gate_set)
    high, low, gap, values = build_pair(comps, p, max(abs(d) for d in deltas))
    if high is None and args.smoke:  # a smoke state's policies are untrained: the grid scaled into their span
        deltas = [d * values_gap(values) / (1.05 * max(abs(x) for x in deltas)) for d in deltas]
        high, low, gap, values = build_pair(comps, p, max(abs(d) for d in deltas))
    if high is None:
        raise SystemExit(
            f"gate_power: Eq. H1 CTR (points) {values}: no mixture of the bootstrap's policies spans +-"
            f"{max(abs(d) for d in deltas):g} points; rule: pi_init and ALS, or one of them and popularity, at "
            "least that far apart"
        )
    hr5 = {n: float(np.mean(r <= 5)) for n, (_, r) in comps.items()}
    shares = {a: float(s) for a, s in cfg.report.arm_shares.items() if a in cfg.arms.names}
    print(
        f"{cfg.name} ({args.series} series), month {month}: {len(reqs)} requests of {len(splits)} users, {k} "
        f"candidates, tau {cfg.policy.tau:g}, {len(gate_set[0])} gate users; Eq. H1 CTR (points) "
        + ", ".join(f"{n} {v:.2f}" for n, v in values.items())
        + "; offline HR@5 "
        + ", ".join(f"{n} {v:.3f}" for n, v in hr5.items())
        + f"; H = {high}, L = {low}, gap {gap:.2f} points; {months} months per delta",
        flush=True,
    )
    user_ids = np.array([r.user_id for r in reqs])
    held = {f: np.array([in_holdout(int(u), cfg.seed, f) for u in user_ids]) for f in fractions}
    preset_fraction = cfg.arms.gate_holdout_fraction
    if preset_fraction not in held:
        held[preset_fraction] = np.array([in_holdout(int(u), cfg.seed, preset_fraction) for u in user_ids])
    how_gate = {
        "primary": cfg.arms.gate_primary,
        "margin": cfg.arms.gate_margin,
        "ope_margin": cfg.arms.gate_ope_margin,
    }
    tallies: dict[str, dict[float, list[tuple[bool, bool, bool]]]] = {}
    for di, delta in enumerate(deltas):
        a, b = 0.5 - delta / (2 * gap), 0.5 + delta / (2 * gap)
        pi_old = a * mixture(high, comps) + (1 - a) * mixture(low, comps)
        pi_new = b * mixture(high, comps) + (1 - b) * mixture(low, comps)
        truth = (true_ctr(pi_new, p) - true_ctr(pi_old, p)) * 100
        assert abs(truth - delta) < 1e-6, (truth, delta)
        by_arm = {x: pi_old for x in shares}
        by_arm["ml_retrain"], by_arm["popularity"] = comps["als"][0], comps["popularity"][0]
        for j in range(months):
            seed = SEED + 1000 * di + j
            rng = np.random.default_rng(seed)
            arm, logged, e0, clicked, users = draw_month(rng, reqs, p, mask, by_arm, shares)
            ranks = (draw_ranks(rng, a, high, low, comps), draw_ranks(rng, b, high, low, comps))
            common = dict(
                arm=arm, logged=logged, e0=e0, clicked=clicked, users=users, reqs=reqs, items=items, mask=mask,
                pi_new=pi_new, pi_old=pi_old, ranks=ranks, seed=seed,
            )  # fmt: skip
            runs = {"before": (np.ones(len(reqs), dtype=bool), BEFORE)}
            rows = held[preset_fraction] if cfg.arms.gate_ope_rows == "heldout" else np.ones(len(reqs), dtype=bool)
            runs["gate"] = (rows, how_gate)
            for f in fractions:
                runs[f"fraction {f:g}"] = (held[f], how_gate if how_gate["primary"] == "ope" else REDESIGN)
            for name, (rows_mask, how) in runs.items():
                if name != "gate" and name.startswith("fraction") and f"{preset_fraction:g}" == name.split()[1]:
                    if cfg.arms.gate_ope_rows == "heldout" and how_gate["primary"] == "ope":
                        tallies.setdefault(name, {}).setdefault(delta, []).append(tallies["gate"][delta][-1])
                        continue
                v = one_gate(cfg, rows_mask=rows_mask, how=how, **common)
                tallies.setdefault(name, {}).setdefault(delta, []).append((v.passed, v.offline_passed, v.ope_passed))
        line = "; ".join(
            f"{name} {np.mean([t[0] for t in by[delta]]):.3f}" for name, by in tallies.items() if delta in by
        )
        print(
            f"  delta {delta:+.1f} points ({months} months, {time.perf_counter() - t0:.0f}s): pass rate {line}",
            flush=True,
        )

    def table(name: str) -> dict:
        rows = []
        for delta in deltas:
            t = tallies[name][delta]
            rows.append(
                {
                    "delta_pp": delta,
                    "months": len(t),
                    "pass_rate": float(np.mean([x[0] for x in t])),
                    "offline_pass_rate": float(np.mean([x[1] for x in t])),
                    "ope_pass_rate": float(np.mean([x[2] for x in t])),
                }
            )
        return summary(rows)

    out = {
        "preset": args.config,
        "series": args.series,
        "tau": cfg.policy.tau,
        "month": month,
        "gap_pp": gap,
        "ctr_pp": values,
        "hr_at_5": hr5,
        "gate_settings": {**how_gate, "rows": cfg.arms.gate_ope_rows, "holdout_fraction": preset_fraction},
        "gate": table("gate"),
        "before": table("before"),
        "fractions": {f"{f:g}": table(f"fraction {f:g}") for f in fractions},
        "wall_s": time.perf_counter() - t0,
    }
    if args.in_sample:
        out["in_sample"] = in_sample_probe(
            cfg, ds, splits, args.in_sample, cfg.arms.gate_holdout_fraction, deltas, span=args.smoke
        )
        print_in_sample(out["in_sample"])
    print("\n| gate | " + " | ".join(f"{d:+g}" for d in deltas) + " | size | power at +1 |")
    print("|---|" + "---|" * (len(deltas) + 2))
    for name, g in [("gate (preset)", out["gate"]), ("before", out["before"])] + [
        (f"ope on held-out {f}", g) for f, g in out["fractions"].items()
    ]:
        cells = " | ".join(f"{r['pass_rate']:.3f}" for r in g["rows"])
        print(f"| {name} | {cells} | {g['size']:.3f} | {g['power_at_1pp']:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    if args.smoke:
        import shutil

        shutil.rmtree(cfg.paths.resolve("root"), ignore_errors=True)
    g, b0 = out["gate"], out["before"]
    print(
        f"gate power: size {g['size']:.3f} power at +1pp {g['power_at_1pp']:.3f} "
        f"(before: size {b0['size']:.3f} power {b0['power_at_1pp']:.3f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
