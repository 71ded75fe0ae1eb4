"""Simulator throughput: impressions per second served (exposure + click + the Parquet row) for the popularity arm
and for the tiny LLM arm, side by side in one run on the same month's requests.

    .venv/bin/python benchmarks/simulate_throughput.py [--config demo] [--requests 600] [--model DIR] [--smoke]

Every request of the month goes through `abpo.sim.simulate_month` twice, once with every user routed to a
popularity arm and once to an LLM arm (the untrained tiny model unless --model names a checkpoint: the cost of
scoring does not depend on the weights). Prints impressions/s of both and their ratio; nothing is landed. The last
line is exactly `popularity / tiny LLM: <r>x`.

``--smoke`` runs the same path in seconds (tests/benchmarks/test_smoke.py): 20 requests and a smaller tiny model
(the ratio means nothing at that size).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# --smoke: the same path on 20 requests and a smaller tiny model
SMOKE = [
    "policy.tiny_hidden_size=32",
    "policy.tiny_layers=1",
    "policy.tiny_heads=2",
    "policy.tiny_intermediate_size=64",
    "policy.tiny_vocab_size=2048",
]
SMOKE_REQUESTS = 20


def main(argv=None) -> int:
    from abpo.logs import progress_bars_only_on_a_terminal

    progress_bars_only_on_a_terminal()  # no progress-bar redraws in a piped or logged run (one line each)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="demo")
    ap.add_argument("--requests", type=int, default=600, help="requests served by each arm (2 per user)")
    ap.add_argument("--model", default="", help="LLM checkpoint directory (default: the untrained tiny model)")
    ap.add_argument("--smoke", action="store_true", help="the smallest sizes that run the same path (seconds)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.requests = min(args.requests, SMOKE_REQUESTS)

    from abpo.arms.llm import LLMArm
    from abpo.arms.rankers import RankerArm
    from abpo.config import load_config
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users
    from abpo.policy.model import build_tiny
    from abpo.sim.simulator import interactions_to_date, simulate_month

    users = max(args.requests // 2, 1)
    cfg = load_config(
        args.config,
        [
            f"data.max_users={users}",
            "sim.requests_per_user=2",
            "report.arm_shares={bench: 1.0}",
            *(SMOKE if args.smoke else []),
        ],
    )
    ds = load_dataset(cfg.data)
    splits, _ = split_users(ds, cfg.data)
    month = cfg.sim.start_month
    pop = RankerArm(
        "bench",
        RankerArm.make_ranker("popularity", cfg).fit(interactions_to_date(cfg, splits, month), ds.item_ids().tolist()),
        cfg.arms.popularity.temperature,
        "1",
    )
    model_dir = args.model or build_tiny(cfg.policy, cfg.paths, ds.titles(), seed=cfg.seed)
    llm = LLMArm.from_dir("bench", model_dir, cfg, ds, "1")
    rates = {}
    m = cfg.sim.candidate_count if cfg.sim.candidates == "retrieval" else cfg.data.train_candidates
    for label, arm in (("popularity", pop), ("tiny LLM", llm)):
        t = time.perf_counter()
        res = simulate_month(cfg, month, {"bench": arm}, dataset=ds, splits=splits, write=False)
        dt = time.perf_counter() - t
        rates[label] = res.table.num_rows / dt
        print(
            f"{label:<11} {res.table.num_rows} impressions in {dt:.2f}s: {rates[label]:,.0f} impressions/s "
            f"(M = {m}, CTR {res.per_arm['bench']['ctr']:.3f})"
        )
    print(f"popularity / tiny LLM: {rates['popularity'] / rates['tiny LLM']:.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
