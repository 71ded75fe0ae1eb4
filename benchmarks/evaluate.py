"""Offline evaluation speed: users scored per second at M = 100 on the tiny model, the paper's text prompt against
the item-token prompt, side by side in one run (same model weights, users and candidates).

    .venv/bin/python benchmarks/evaluate.py [--users 100] [--threads 1] [--model DIR] [--config tiny] [--smoke]

    text         policy.prompt_style=text, policy.max_history=10 (the prompt before the item-token policy):
                 history titles, candidate lines <item_id>ID</item_id><item>TITLE</item> (~1,800 tokens at M = 100),
                 s_p = the mean log-prob over each answer (batched shared-prefix scoring, packed answer rows)
    item_tokens  the preset's prompt_style=item_tokens and max_history (200 in tiny): the candidates and the history
                 as item tokens (~330 tokens), s_p = the item token's log-prob: one forward per prompt group, the LM
                 head at the last position only

Both go through abpo.policy.scoring.score_examples (what evaluation, the bandit log, the arms and e_old use). The
model is `--model` (e.g. var/models/pi_init after `abpo sft`) or the untrained tiny model of the preset: the cost of
scoring does not depend on the weights. Each path scores the users twice and the faster pass counts (the first
warms caches). The last line is exactly `users/s item_tokens/text = <r>x` (goal: at least 10x).

``--smoke`` runs the same path in seconds (tests/benchmarks/test_smoke.py): 4 users among 10 candidates, a smaller
tiny model (the ratio means nothing at that size).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# --smoke: the same two paths on 4 users and a smaller tiny model (overrides before the command line's --set)
SMOKE = [
    "data.max_users=12",
    "data.eval_candidates=10",
    "policy.tiny_hidden_size=32",
    "policy.tiny_layers=1",
    "policy.tiny_heads=2",
    "policy.tiny_intermediate_size=64",
    "policy.tiny_vocab_size=2048",
]
SMOKE_USERS = 4


def main(argv=None) -> int:
    from abpo.logs import progress_bars_only_on_a_terminal

    progress_bars_only_on_a_terminal()  # no progress-bar redraws in a piped or logged run (one line each)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=100, help="held-out users scored by each path")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--model", default="", help="model directory (default: the untrained tiny model)")
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--smoke", action="store_true", help="the smallest sizes that run the same path (seconds)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.users, args.overrides = min(args.users, SMOKE_USERS), SMOKE + args.overrides

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from abpo.config import load_config
    from abpo.data.candidates import build_eval_examples
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users
    from abpo.policy.model import build_tiny
    from abpo.policy.prompt import example_prompt
    from abpo.policy.scoring import score_examples

    cfg = load_config(args.config, args.overrides)
    torch.set_num_threads(args.threads)
    ds = load_dataset(cfg.data)
    titles = ds.titles()
    model_dir = args.model or build_tiny(cfg.policy, cfg.paths, titles, seed=cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    splits, _ = split_users(ds, cfg.data)
    examples = build_eval_examples(splits, ds, cfg.data)[: args.users]
    m = len(examples[0].candidates)
    styles = {
        "text": dataclasses.replace(cfg.policy, prompt_style="text", max_history=10),
        "item_tokens": dataclasses.replace(cfg.policy, prompt_style="item_tokens"),
    }
    print(f"{len(examples)} users, M = {m} candidates, {args.threads} thread(s), model {model_dir}")
    speed = {}
    for name, pol in styles.items():
        n_tok = sum(example_prompt(e, titles, tok, pol).n_tokens for e in examples) / len(examples)
        best = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            score_examples(model, tok, examples, titles, pol)
            best = min(best, time.perf_counter() - t0)
        speed[name] = len(examples) / best
        print(
            f"{name:<12} max_history {pol.max_history:>3}: {n_tok:7.0f} prompt tokens, {speed[name]:8.2f} users/s",
            flush=True,
        )
    print(f"users/s item_tokens/text = {speed['item_tokens'] / speed['text']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
