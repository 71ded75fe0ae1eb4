"""Is the simulated A/B valid? The four arms' current models (their champions in the registry: run `make demo`
first, or name another config's state with --config/--set) ranked two ways on the same users:

    offline HR@5      each split user's held-out target x_{T+N} among data.eval_candidates candidates (the
                      offline construction, abpo.data.candidates.build_eval_examples), ranked by the arm's
                      exposure distribution (the same scores that serve; ties count against the target)
    simulated CTR     every arm serves every user the same month's requests (abpo.sim.simulate_month with that
                      arm at share 1: same candidates, same pre-drawn uniforms, same click model), nothing landed

and the Kendall rank correlation (tau-b) between the two orders. The goal (issue: a production A/B worth reading)
is tau >= 0.67, at most one swapped pair of four, by construction of the simulator, not by tuning the arms.

Then the robustness table (docs/simulator.md): the same arms' simulated CTR under each ground truth, the config's
``sim.oracle`` (the mixture by default) and each pure component (als, knn, sequential), with the tau against the
offline order under each, as a markdown table. Each arm serves once: its exposures do not depend on the oracle
(the same requests and pre-drawn uniforms), only the clicks do.

    .venv/bin/python benchmarks/simulate.py [--config demo] [--month 2026-02] [--oracles mixture,als,knn,sequential]
                                            [--set key=value ...] [--smoke]

The last line is exactly `Kendall tau offline HR@5 vs simulated CTR: <v>`, for the config's ``sim.oracle``
(`nan` when either order is constant).

``--smoke`` runs the same path in seconds (tests/benchmarks/test_smoke.py) without `make demo`: in a throw-away state
directory, on 12 users and a smaller tiny model, it bootstraps every arm first (abpo.monthly.bootstrap.bootstrap_arms:
pi_init by 4 SFT steps, the rankers fitted), then ranks their champions as above (the figures mean nothing at that
size).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

# --smoke: the arms bootstrapped on 12 users with a smaller tiny model (overrides before the command line's --set)
SMOKE = [
    "data.max_users=12",
    "data.sup_examples_per_user=4",
    "data.train_candidates=8",
    "data.eval_candidates=10",
    "policy.tiny_hidden_size=32",
    "policy.tiny_layers=1",
    "policy.tiny_heads=2",
    "policy.tiny_intermediate_size=64",
    "policy.tiny_vocab_size=2048",
    "policy.max_history=3",
    "sft.pretrain_epochs=0",
    "sft.max_steps=4",
    "sft.batch_size=8",
    "sft.eval_max_users=4",
    "sft.eval_generation=false",
    "arms.gate_max_users=4",
]


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


ORACLES = ("mixture", "als", "knn", "sequential")


class ServedOnce:
    """``arm`` whose exposure distributions are computed once per request list: serving the same month under
    another oracle reuses them (the arm's output does not depend on the oracle, which only the clicks read)."""

    def __init__(self, arm):
        self.arm = arm
        self.name, self.model_version, self.logging_policy = arm.name, arm.model_version, arm.logging_policy
        self._memo: dict[tuple, list] = {}

    def propensities(self, requests):
        key = tuple((int(u), tuple(h), tuple(c)) for u, h, c in requests)
        if key not in self._memo:
            self._memo[key] = self.arm.propensities(requests)
        return self._memo[key]


def simulated_ctr_by_oracle(cfg, month: str, name: str, arm, *, dataset, splits, oracles=ORACLES) -> dict[str, dict]:
    """Arm ``name``'s per-arm result (impressions, clicks, ctr) of ``month`` with ``arm`` at share 1, under each
    ground truth in ``oracles`` (``sim.oracle`` set to it; everything else as ``cfg``)."""
    from abpo.sim.simulator import simulate_month

    served = ServedOnce(arm)
    out = {}
    for oracle in oracles:
        one = dataclasses.replace(
            cfg,
            report=dataclasses.replace(cfg.report, arm_shares={name: 1.0}),
            sim=dataclasses.replace(cfg.sim, oracle=oracle),
        )
        out[oracle] = simulate_month(one, month, {name: served}, dataset=dataset, splits=splits, write=False).per_arm[
            name
        ]
    return out


def kendall_tau(x, y) -> float:
    """Kendall's tau-b of two orders (nan when either is constant)."""
    from scipy.stats import kendalltau

    return float(kendalltau(list(x), list(y)).statistic)


def robustness_table(
    hit_rates: dict[str, float], ctr: dict[str, dict[str, float]], oracles=ORACLES
) -> tuple[list[str], dict[str, float]]:
    """The markdown robustness table (one row per arm: offline HR@5 and the simulated CTR under each oracle; a last
    row with Kendall's tau of each oracle's CTR order against the HR@5 order) and the taus by oracle."""
    arms = list(hit_rates)
    taus = {o: kendall_tau([hit_rates[a] for a in arms], [ctr[a][o] for a in arms]) for o in oracles}
    lines = [
        "| arm | offline HR@5 | " + " | ".join(f"sim CTR {o}" for o in oracles) + " |",
        "|---|---:|" + "---:|" * len(oracles),
    ]
    for a in arms:
        lines.append(f"| {a} | {hit_rates[a]:.4f} | " + " | ".join(f"{ctr[a][o]:.4f}" for o in oracles) + " |")
    lines.append("| Kendall tau vs HR@5 | | " + " | ".join(f"{taus[o]:.2f}" for o in oracles) + " |")
    return lines, taus


def main(argv=None) -> int:
    from abpo.logs import progress_bars_only_on_a_terminal

    progress_bars_only_on_a_terminal()  # no progress-bar redraws in a piped or logged run (one line each)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="demo", help="preset whose registry holds the champions (default demo)")
    ap.add_argument(
        "--month",
        default="",
        help="the month whose requests are served (default: the last month the "
        "config's data.update_steps // sim.window allows)",
    )
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    ap.add_argument(
        "--oracles",
        default=",".join(ORACLES),
        help="ground truths of the robustness table, comma separated (the config's sim.oracle is always first)",
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="bootstrap the arms of a tiny throw-away state first and rank them (seconds; the figures mean nothing)",
    )
    args = ap.parse_args(argv)

    import tempfile

    from abpo.arms import versions
    from abpo.arms.names import ARMS
    from abpo.config import load_config
    from abpo.data.candidates import build_eval_examples
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users
    from abpo.months import Month
    from abpo.sim.simulator import months_available

    if args.smoke:
        state = tempfile.mkdtemp(prefix="abpo-bench-simulate-")
        cfg = load_config(args.config, [*SMOKE, f"paths.root={state}", *args.set])
        from abpo.logs import quiet
        from abpo.monthly.bootstrap import bootstrap_arms

        with quiet():
            bootstrap_arms(cfg)
        print(f"--smoke: every arm bootstrapped in {state} (removed at the end)")
    else:
        cfg = load_config(args.config, args.set)
    ds = load_dataset(cfg.data)
    splits, _ = split_users(ds, cfg.data)
    month = args.month or str(Month(cfg.sim.start_month).plus(months_available(cfg) - 1))
    examples = build_eval_examples(splits, ds, cfg.data)
    default = cfg.sim.oracle
    oracles = [default, *[o for o in (x.strip() for x in args.oracles.split(",")) if o and o != default]]
    rows = []
    ctr: dict[str, dict[str, float]] = {}
    for name in ARMS:
        arm = versions.load_arm(cfg, name, ds)
        t = time.perf_counter()
        hr = hit_rate_at(5, arm, examples)
        by_oracle = simulated_ctr_by_oracle(cfg, month, name, arm, dataset=ds, splits=splits, oracles=oracles)
        ctr[name] = {o: r["ctr"] for o, r in by_oracle.items()}
        a = by_oracle[default]
        rows.append((name, arm.model_version, hr, a["ctr"], a["impressions"], time.perf_counter() - t))
    print(
        f"{len(examples)} users; offline: M = {cfg.data.eval_candidates} (hard-negative fraction "
        f"{cfg.data.eval_hard_negative_fraction}); simulated month {month}: {rows[0][4]} requests per arm, "
        f"candidates {cfg.sim.candidates} (M = {cfg.sim.candidate_count})"
    )
    print(f"{'arm':<11} {'version':>7} {'HR@5':>7} {'sim CTR':>8} {'seconds':>8}   (sim CTR: sim.oracle = {default})")
    for name, v, hr, c, _, sec in rows:
        print(f"{name:<11} {v:>7} {hr:>7.4f} {c:>8.4f} {sec:>8.1f}")
    lines, taus = robustness_table({r[0]: r[2] for r in rows}, ctr, oracles)
    print(f"\nRobustness: simulated CTR under each ground truth (sim.oracle; {default} is the config's)\n")
    print("\n".join(lines))
    print()
    if args.smoke:
        import shutil

        shutil.rmtree(state, ignore_errors=True)
    print(f"Kendall tau offline HR@5 vs simulated CTR: {taus[default]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
