"""Offline evaluation speed: users scored per second at M = 100 on the tiny model, the batched scorer against the
previous one-prompt-at-a-time path, side by side in one run (same model, users and candidates).

    .venv/bin/python benchmarks/evaluate.py [--users 60] [--threads 1 2] [--model DIR]

    old      score_candidates per user: one prompt, its candidates packed behind it (the path before batching)
    batched  abpo.policy.scoring.score_examples: batch tokenization, prompt groups, packed answer rows, only the
             answer positions through the LM head, in-place logsumexp (what evaluation, the bandit log and e_old use)

Prints users/s of both, the ratio, and the largest |s_new - s_old| (they must agree to float error). The model is
the tiny preset's pi_init when `--model` names it (var/models/pi_init after `abpo sft`), else the untrained tiny
model (the cost of scoring does not depend on the weights).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=60, help="held-out users scored by each path")
    ap.add_argument("--threads", type=int, nargs="+", default=[1], help="torch thread counts to measure")
    ap.add_argument("--model", default="", help="model directory (default: the untrained tiny model)")
    ap.add_argument("--config", default="tiny")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from abpo.config import load_config
    from abpo.data.candidates import build_eval_examples
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users
    from abpo.policy.model import build_tiny
    from abpo.policy.prompt import example_prompt
    from abpo.policy.scoring import candidate_answers, score_candidates, score_examples

    cfg = load_config(args.config)
    ds = load_dataset(cfg.data)
    titles = ds.titles()
    model_dir = args.model or build_tiny(cfg.policy, cfg.paths, titles, seed=cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    splits, _ = split_users(ds, cfg.data)
    examples = build_eval_examples(splits, ds, cfg.data)[: args.users]
    m = len(examples[0].candidates)
    print(f"{len(examples)} users, M = {m} candidates, model {model_dir}")
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        old = [
            score_candidates(model, tok, example_prompt(e, titles, tok, cfg.policy).text,
                             candidate_answers(e.candidates, titles), batch_tokens=cfg.policy.scoring_batch_tokens)
            for e in examples
        ]
        t_old = time.perf_counter() - t0
        t0 = time.perf_counter()
        new = score_examples(model, tok, examples, titles, cfg.policy)
        t_new = time.perf_counter() - t0
        diff = max(float((a - b.scores).abs().max()) for a, b in zip(old, new))
        rows.append((threads, len(examples) / t_old, len(examples) / t_new, diff))
        print(f"threads {threads}: old {rows[-1][1]:.2f} users/s, batched {rows[-1][2]:.2f} users/s", flush=True)
    print()
    print(f"{'threads':>7} {'old users/s':>12} {'batched users/s':>16} {'ratio':>6} {'max |diff|':>11}")
    for threads, o, n, d in rows:
        print(f"{threads:>7} {o:>12.2f} {n:>16.2f} {n / o:>6.2f} {d:>11.1e}")
    base = rows[0][1]
    best = max(n for _, _, n, _ in rows)
    print(f"best batched vs old at {rows[0][0]} thread(s): {best / base:.2f}x (goal: 4x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
