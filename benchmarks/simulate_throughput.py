"""Simulator throughput: what a simulated month costs, set-up apart from serving.

    .venv/bin/python benchmarks/simulate_throughput.py [--config demo] [--requests-per-user N] [--model DIR]
                                                       [--threads T] [--smoke]

On the config's users and month (the demo preset: 610 users x 12 requests = 7,320 requests over retrieval
candidates, M = 20), each part is timed on its own:

- set-up, paid once per process (or month): loading and splitting the data, fitting the ground truth (each oracle
  component, then the mixture's standardisation), fitting the retrieval model, fitting the popularity ranker, and
  loading the LLM (the untrained tiny model unless --model names a checkpoint: the cost of scoring does not depend
  on the weights);
- steady state, per request: the retrieval stage's candidates (building the month's requests less the retrieval
  fit), the users' side (the oracle's z of every candidate: what the click needs), and per arm the arm's exposures of
  every request of the month (abpo.arms.base.expose: propensities over the candidates and the draw), after a
  warm-up call; impressions/s = requests / seconds;
- a whole warm month per arm (abpo.sim.simulator.simulate_month, nothing landed): requests rebuilt, oracle z,
  exposures, clicks and the Parquet table;

and the compute per request against the machine's measured matmul rate (fp32 torch.mm at 1024, the config's
policy.num_threads): the LLM's forward FLOPs per request counted by torch.utils.flop_counter on the scoring call
itself, and the oracle's arithmetic per request estimated from its settings (ALS dot products, co-occurrence and
transition look-ups, standardisation). The last line is exactly
`steady state: popularity <n> impressions/s, tiny LLM <n> impressions/s (<r>x); set-up <s> s; month of <N> requests`.

``--smoke`` runs the same path in seconds (tests/benchmarks/test_smoke.py): 20 users, 2 requests each, a smaller tiny
model (the figures mean nothing at that size).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# --smoke: the same path on 40 requests and a smaller tiny model
SMOKE = [
    "data.max_users=20",
    "sim.requests_per_user=2",
    "sim.oracle_iterations=2",
    "policy.tiny_hidden_size=32",
    "policy.tiny_layers=1",
    "policy.tiny_heads=2",
    "policy.tiny_intermediate_size=64",
    "policy.tiny_vocab_size=2048",
]
WARM_UP = 32  # requests scored before the timed call (lazy initialisation, first kernels)


def matmul_rate(threads: int, n: int = 1024, reps: int = 5) -> float:
    """FLOP/s of fp32 torch.mm of two n x n matrices on ``threads`` threads: 2 n^3 / the best of ``reps`` runs."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2.0 * n**3 / best


def forward_flops(arm, requests) -> float:
    """FLOPs of the arm's scoring of ``requests`` (torch.utils.flop_counter: matmuls, attention), per request."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        arm.propensities(requests)
    return counter.get_total_flops() / max(len(requests), 1)


def oracle_operations(sc, m: int) -> dict[str, int]:
    """Arithmetic operations of one request's z over ``m`` candidates, per component of the mixture (an estimate
    from the settings, abpo.sim.oracles): als m (2 f + 2) (a dot product of f factors, standardised); knn m (R + 3)
    (R co-occurrence look-ups summed, log1p, standardised); sequential m (4 K + 3) (K smoothed transition terms,
    log, standardised); the mixture 2 m per component."""
    ops = {
        "als": m * (2 * sc.oracle_factors + 2),
        "knn": m * (sc.oracle_knn_recent + 3),
        "sequential": m * (4 * sc.oracle_markov_order + 3),
    }
    return {k: v for k, v in ops.items() if sc.oracle == "mixture" or sc.oracle == k} | {
        "mixture": 2 * m * (3 if sc.oracle == "mixture" else 1)
    }


def main(argv=None) -> int:
    from abpo.logs import progress_bars_only_on_a_terminal

    progress_bars_only_on_a_terminal()  # no progress-bar redraws in a piped or logged run (one line each)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="demo")
    ap.add_argument(
        "--requests-per-user",
        type=int,
        default=0,
        help="requests per user in the month (default: the config's sim.requests_per_user; demo: 12)",
    )
    ap.add_argument("--model", default="", help="LLM checkpoint directory (default: the untrained tiny model)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: the config's policy.num_threads)")
    ap.add_argument("--smoke", action="store_true", help="the smallest sizes that run the same path (seconds)")
    args = ap.parse_args(argv)

    import numpy as np

    from abpo.arms.base import expose
    from abpo.arms.llm import LLMArm
    from abpo.arms.rankers import RankerArm
    from abpo.config import load_config
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users
    from abpo.policy.model import build_tiny
    from abpo.sim import simulator as simr
    from abpo.sim.oracles import reference_users
    from abpo.sim.preference import oracle_weights
    from abpo.sim.retrieval import CooccurrenceRetrieval

    sets = ["report.arm_shares={bench: 1.0}", *(SMOKE if args.smoke else [])]
    if args.threads:
        sets.append(f"policy.num_threads={args.threads}")
    if args.requests_per_user:
        sets.append(f"sim.requests_per_user={args.requests_per_user}")
    cfg = load_config(args.config, sets)
    month = cfg.sim.start_month
    setup: dict[str, float] = {}

    t = time.perf_counter()
    ds = load_dataset(cfg.data)
    splits, _ = split_users(ds, cfg.data)
    setup["data load + split"] = time.perf_counter() - t

    reference = reference_users(ds.sequences, cfg.sim.oracle_reference_users, cfg.seed)
    for name in oracle_weights(cfg.sim):
        t = time.perf_counter()
        simr._component(cfg, ds, name, reference)  # fitted once per process, as simulate_month's first call does
        setup[f"oracle fit: {name}"] = time.perf_counter() - t
    t = time.perf_counter()
    oracle = simr.ground_truth(cfg, ds)  # the mixture's standardisation over the reference users
    setup["oracle: mixture moments"] = time.perf_counter() - t

    to_date = simr.interactions_to_date(cfg, splits, month)
    items = ds.item_ids().tolist()
    t = time.perf_counter()
    CooccurrenceRetrieval(window=cfg.sim.retrieval_window, recent=cfg.sim.retrieval_recent).fit(to_date, items)
    setup["retrieval fit"] = time.perf_counter() - t
    t = time.perf_counter()
    requests = simr.month_requests(cfg, ds, splits, month)  # the retrieval fit again, then every request's draws
    candidates_s = max(time.perf_counter() - t - setup["retrieval fit"], 1e-9)

    t = time.perf_counter()
    pop = RankerArm(
        "bench",
        RankerArm.make_ranker("popularity", cfg).fit(to_date, items),
        cfg.arms.popularity.temperature,
        "1",
    )
    setup["popularity fit"] = time.perf_counter() - t
    t = time.perf_counter()
    model_dir = args.model or build_tiny(cfg.policy, cfg.paths, ds.titles(), seed=cfg.seed)
    built = time.perf_counter() - t  # the untrained model's one-off build (cached on disk): not a serving cost
    t = time.perf_counter()
    llm = LLMArm.from_dir("bench", model_dir, cfg, ds, "1")
    setup["LLM load"] = time.perf_counter() - t

    n = len(requests)
    m = len(requests[0].candidates) if requests else 0
    triples = [(r.user_id, r.history, r.candidates) for r in requests]
    uniforms = np.random.default_rng(0).random(n).tolist()
    threads = int(cfg.policy.num_threads) or 1
    print(
        f"month {month}: {n:,} requests ({len(splits)} users x {cfg.sim.requests_per_user}), M = {m} candidates, "
        f"config {cfg.name}, {threads} torch thread(s)"
    )
    total_setup = sum(setup.values())
    print(f"set-up {total_setup:.1f} s: " + ", ".join(f"{k} {v:.2f} s" for k, v in setup.items()))
    if not args.model:
        print(f"  (the untrained tiny model's build, cached on disk, not counted: {built:.2f} s)")

    print(
        f"retrieval stage (candidates of each request): {n / candidates_s:,.0f} requests/s, "
        f"{1e3 * candidates_s / max(n, 1):.2f} ms per request ({candidates_s:.1f} s for the month)"
    )
    # the users' side: the oracle's z of every candidate (the click model's input), arm-independent
    t = time.perf_counter()
    for r in requests:
        oracle.z(r.user_id, r.candidates, history=r.history)
    user_side = time.perf_counter() - t
    ops = oracle_operations(cfg.sim, m)
    print(
        f"users' side (the oracle's z of {m} candidates): {n / user_side:,.0f} requests/s, "
        f"{1e6 * user_side / max(n, 1):.0f} us per request for ~{sum(ops.values()):,} arithmetic operations ("
        + ", ".join(f"{k} {v:,}" for k, v in ops.items())
        + ")"
    )

    rates: dict[str, float] = {}
    flops: dict[str, float] = {}
    for label, arm in (("popularity", pop), ("tiny LLM", llm)):
        expose(arm, triples[:WARM_UP], uniforms[:WARM_UP])  # warm-up: lazy initialisation, first kernels
        t = time.perf_counter()
        expose(arm, triples, uniforms)
        dt = time.perf_counter() - t
        rates[label] = n / dt
        t = time.perf_counter()
        res = simr.simulate_month(cfg, month, {"bench": arm}, dataset=ds, splits=splits, write=False)
        month_s = time.perf_counter() - t
        line = (
            f"{label:<11} steady state {n:,} impressions in {dt:.2f} s: {rates[label]:,.0f} impressions/s; whole "
            f"warm month {month_s:.1f} s (CTR {res.per_arm['bench']['ctr']:.3f})"
        )
        if isinstance(arm, LLMArm):
            flops[label] = forward_flops(arm, triples[: min(n, 256)])
            line += f"; forward {flops[label] / 1e6:,.2f} MFLOP per request"
        print(line)

    import os

    peak = matmul_rate(threads)
    llm_flops = flops["tiny LLM"] * rates["tiny LLM"]
    print(
        f"matmul rate: {peak / 1e9:,.1f} GFLOP/s (fp32 torch.mm 1024, {threads} thread(s)); the tiny LLM serves "
        f"{llm_flops / 1e9:,.2f} GFLOP/s of forward FLOPs = {100 * llm_flops / peak:.1f}% of it; the users' side "
        f"{sum(ops.values()) * n / user_side / 1e6:,.2f} M operations/s = "
        f"{100 * sum(ops.values()) * n / user_side / peak:.3f}% of it"
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"(wall time on a machine with {os.cpu_count()} cores, load average now {load})")
    print(
        f"steady state: popularity {rates['popularity']:,.0f} impressions/s, tiny LLM {rates['tiny LLM']:,.0f} "
        f"impressions/s ({rates['popularity'] / rates['tiny LLM']:,.1f}x); set-up {total_setup:.1f} s; month of "
        f"{n:,} requests"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
