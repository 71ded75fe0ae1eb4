"""Is the simulated A/B valid? The four arms' current models (their champions in the registry: run `make demo`
first, or name another config's state with --config/--set) ranked two ways on the same users:

    offline HR@5      each split user's held-out target x_{T+N} among data.eval_candidates candidates (the
                      offline construction, abpo.data.candidates.build_eval_examples), ranked by the arm's
                      exposure distribution (the same scores that serve; ties count against the target)
    simulated CTR     every arm serves every user the same month's requests (abpo.sim.simulate_month with that
                      arm at share 1: same candidates, same pre-drawn uniforms, same click model), nothing landed

and the Kendall rank correlation (tau-b) between the two orders. The goal (issue: a production A/B worth reading)
is tau >= 0.67, at most one swapped pair of four, by construction of the simulator, not by tuning the arms.

    .venv/bin/python benchmarks/simulate.py [--config demo] [--month 2026-02] [--set key=value ...]

The last line is exactly `Kendall tau offline HR@5 vs simulated CTR: <v>`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402


def hit_rate_at(k: int, arm, examples) -> float:
    """HR@k of ``arm`` on ``examples``: the target's rank by exposure probability, ties counted against it."""
    probs = arm.propensities([(e.user_id, e.history, e.candidates) for e in examples])
    hits = 0
    for e, p in zip(examples, probs, strict=True):
        p = np.asarray(p)
        j = e.candidates.index(e.positive)
        rank = int(np.sum(p > p[j])) + int(np.sum(p == p[j])) - 1
        hits += rank < k
    return hits / len(examples)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="demo", help="preset whose registry holds the champions (default demo)")
    ap.add_argument("--month", default="", help="the month whose requests are served (default: the last month the "
                    "config's data.update_steps // sim.window allows)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    args = ap.parse_args(argv)

    from scipy.stats import kendalltau

    from abpo.arms import versions
    from abpo.arms.names import ARMS
    from abpo.config import load_config
    from abpo.data.candidates import build_eval_examples
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users
    from abpo.months import Month
    from abpo.sim.simulator import months_available, simulate_month

    cfg = load_config(args.config, args.set)
    ds = load_dataset(cfg.data)
    splits, _ = split_users(ds, cfg.data)
    month = args.month or str(Month(cfg.sim.start_month).plus(months_available(cfg) - 1))
    examples = build_eval_examples(splits, ds, cfg.data)
    rows = []
    for name in ARMS:
        arm = versions.load_arm(cfg, name, ds)
        t = time.perf_counter()
        hr = hit_rate_at(5, arm, examples)
        one = dataclasses.replace(cfg, report=dataclasses.replace(cfg.report, arm_shares={name: 1.0}))
        res = simulate_month(one, month, {name: arm}, dataset=ds, splits=splits, write=False)
        a = res.per_arm[name]
        rows.append((name, arm.model_version, hr, a["ctr"], a["impressions"], time.perf_counter() - t))
    print(f"{len(examples)} users; offline: M = {cfg.data.eval_candidates} (hard-negative fraction "
          f"{cfg.data.eval_hard_negative_fraction}); simulated month {month}: {rows[0][4]} requests per arm, "
          f"candidates {cfg.sim.candidates} (M = {cfg.sim.candidate_count})")
    print(f"{'arm':<11} {'version':>7} {'HR@5':>7} {'sim CTR':>8} {'seconds':>8}")
    for name, v, hr, ctr, _, sec in rows:
        print(f"{name:<11} {v:>7} {hr:>7.4f} {ctr:>8.4f} {sec:>8.1f}")
    tau = kendalltau([r[2] for r in rows], [r[3] for r in rows]).statistic
    print(f"Kendall tau offline HR@5 vs simulated CTR: {tau:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
