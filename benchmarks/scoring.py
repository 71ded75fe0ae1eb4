"""Candidates per second: shared-prefix scoring (abpo.policy.scoring.score_candidates) against the naive one
forward per candidate (score_candidates_naive), side by side in one run.

    .venv/bin/python benchmarks/scoring.py [--m 20 200] [--reps 3] [--threads 2] [--device cpu|cuda|auto]
                                           [--model tiny] [--naive-candidates 40] [--smoke]

For each candidate-set size M: real D_bandit requests of the bundled MovieLens (abpo.data: splits and candidate
sets of size M), prompts fitted by abpo.policy.prompt (history up to policy.max_history), and the `tiny` preset's
model (policy.tiny_*, untrained: speed does not depend on the weights) or --model (smollm2-135m / a directory).
Both scorers run on the same prompts, alternating, --reps times; the first prompt's scores are checked equal
(max |diff|). The naive scorer's cost is linear in the candidates (one independent forward each), so it is
timed on the first --naive-candidates of each set (all of them when M is smaller); shared-prefix always scores
the whole set. Prints candidates/second of each and the ratio (goal: >= 5x at M = 200); the last line is the table's
last row, `<M> <prompt tokens> <shared cand/s> <naive cand/s> <ratio>x <max|diff|>`.

``--smoke`` runs the same path in seconds (tests/benchmarks/test_smoke.py): M = 10, one prompt, one repetition, the
naive scorer on 4 candidates, a smaller tiny model (the figures mean nothing at that size).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# --smoke: the same path on one small prompt and a smaller tiny model
SMOKE = [
    "data.max_users=12",
    "policy.tiny_hidden_size=32",
    "policy.tiny_layers=1",
    "policy.tiny_heads=2",
    "policy.tiny_intermediate_size=64",
    "policy.tiny_vocab_size=2048",
]
SMOKE_ARGS = {"m": [10], "prompts": 1, "reps": 1, "naive_candidates": 4}


def main(argv: list[str] | None = None) -> int:
    from abpo.logs import progress_bars_only_on_a_terminal

    progress_bars_only_on_a_terminal()  # no progress-bar redraws in a piped or logged run (one line each)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--m", type=int, nargs="+", default=[20, 200], help="Candidate-set sizes.")
    ap.add_argument("--prompts", type=int, default=2, help="Prompts (requests) per M.")
    ap.add_argument("--reps", type=int, default=3, help="Alternating repetitions; the median is reported.")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads.")
    ap.add_argument("--device", default="auto", help="cpu | cuda | auto (cuda when available).")
    ap.add_argument("--model", default=None, help="policy.model override (default: the config's).")
    ap.add_argument("--naive-candidates", type=int, default=40, help="Candidates per set the naive scorer times.")
    ap.add_argument("--batch-tokens", type=int, default=None, help="policy.scoring_batch_tokens override.")
    ap.add_argument("--smoke", action="store_true", help="the smallest sizes that run the same path (seconds)")
    args = ap.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE_ARGS)

    import torch

    from abpo.config import load_config
    from abpo.config.paths import PathsConfig
    from abpo.data.candidates import build_bandit_requests
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users
    from abpo.policy.model import load_policy
    from abpo.policy.prompt import example_prompt
    from abpo.policy.scoring import candidate_answers, score_candidates, score_candidates_naive

    torch.set_num_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    cfg = load_config(args.config, SMOKE if args.smoke else [])
    if args.model:
        cfg.policy.model = args.model
    if args.batch_tokens:
        cfg.policy.scoring_batch_tokens = args.batch_tokens
    cfg.policy.max_prompt_tokens = max(cfg.policy.max_prompt_tokens, 16384)  # M = 200 prompts are ~4.5k tokens
    # shared-prefix scoring is the text prompt's s_p (the answer mean); item-token models score one position
    cfg.policy.prompt_style, cfg.policy.max_history = "text", 10
    ds = load_dataset(cfg.data)
    with tempfile.TemporaryDirectory(prefix="abpo-bench-scoring-") as tmp:
        paths = PathsConfig(root=tmp) if cfg.policy.model == "tiny" else cfg.paths
        model, tok = load_policy(cfg.policy, paths, dataset=ds, seed=cfg.seed)
        model.to(device)
        n_params = model.num_parameters()
        print(
            f"model: {cfg.policy.model} ({n_params / 1e6:.2f}M parameters, {cfg.policy.dtype}) on {device}; "
            f"threads {args.threads}; scoring_batch_tokens {cfg.policy.scoring_batch_tokens}"
        )
        titles = ds.titles()
        splits, _ = split_users(ds, cfg.data)
        rows = []
        for m in args.m:
            data_cfg = dataclasses.replace(cfg.data, train_candidates=m)
            reqs = build_bandit_requests(splits[: args.prompts], ds, data_cfg)[: args.prompts]
            prompts = [example_prompt(r, titles, tok, cfg.policy) for r in reqs]
            answers = [candidate_answers(r.candidates, titles) for r in reqs]
            k_naive = min(m, args.naive_candidates)
            # equality on the first prompt (the subset the naive scorer covers)
            s = score_candidates(model, tok, prompts[0].text, answers[0], batch_tokens=cfg.policy.scoring_batch_tokens)
            n = score_candidates_naive(model, tok, prompts[0].text, answers[0][:k_naive])
            diff = (s[:k_naive] - n).abs().max().item()
            t_shared, t_naive = [], []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                for p, a in zip(prompts, answers):
                    score_candidates(model, tok, p.text, a, batch_tokens=cfg.policy.scoring_batch_tokens)
                if device == "cuda":
                    torch.cuda.synchronize()
                t_shared.append((time.perf_counter() - t0) / (len(prompts) * m))
                t0 = time.perf_counter()
                for p, a in zip(prompts, answers):
                    score_candidates_naive(model, tok, p.text, a[:k_naive])
                if device == "cuda":
                    torch.cuda.synchronize()
                t_naive.append((time.perf_counter() - t0) / (len(prompts) * k_naive))
            cs_shared = 1.0 / statistics.median(t_shared)
            cs_naive = 1.0 / statistics.median(t_naive)
            rows.append((m, statistics.mean(p.n_tokens for p in prompts), cs_shared, cs_naive, diff))
        print(
            f"{'M':>5} {'prompt tokens':>14} {'shared cand/s':>14} {'naive cand/s':>13} {'ratio':>7} {'max|diff|':>10}"
        )
        for m, L, a, b, d in rows:
            print(f"{m:>5} {L:>14.0f} {a:>14.1f} {b:>13.1f} {a / b:>6.1f}x {d:>10.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
