"""Seconds per update step: ABPO (variant F) against vanilla GRPO (variant B), same model, data and G, in one run.

    .venv/bin/python benchmarks/update_step.py [--m 20 200] [--steps 4] [--reps 2] [--threads 2]

For each candidate-set size M: real D_bandit requests of the bundled MovieLens (abpo.data: splits, candidate
sets of size M), the `tiny` preset's model (policy.tiny_*; untrained weights: the cost of a step does not depend
on them), e0 = e_p(a|q) of that model over C (shared-prefix scorer), a logged action per request (a click with
probability --click-rate, a_log = x_{t'+1}; otherwise a_log ~ e0 and y = 1[a_log = x_{t'+1}]), stratified into
batches of update.batch_size. Then B and F each train `--steps` optimizer steps (after --warmup untimed steps) from the
same starting weights, alternating B, F, B, F ... `--reps` times; a step's time is wall-clock from the Trainer's
on_step_begin to on_step_end (rollout generation, rewards, advantages, loss, backward, optimizer), and the
process CPU time over the same span (what to compare on a shared machine, where wall time swings with other load). F's extra work
per step: e_old (scoring all M candidates of each logged example under pi_old) and self-certainty (one forward
over each no-response rollout and anchor). Prints the median seconds per step and the ratio F / B (goal: <= 1.5
at M = 20 on CPU).

GPU (vLLM vs HF generate tokens/second) is not measured here: this benchmark runs on the CPU preset.
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


def build_log(cfg, dataset, model, tok, n_requests: int, click_rate: float, seed: int):
    """Two IMPRESSIONS_SCHEMA-like strata (lists of dicts) of `n_requests` real bandit requests."""
    import numpy as np

    from abpo.data.candidates import build_bandit_requests
    from abpo.data.splits import split_users
    from abpo.policy.scoring import candidate_answers, candidate_propensities, sample_logged_action, score_candidates
    from abpo.policy.prompt import example_prompt

    splits, _ = split_users(dataset, cfg.data)
    requests = build_bandit_requests(splits, dataset, cfg.data)
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(requests), size=min(n_requests, len(requests)), replace=False)
    titles = dataset.titles()
    pos, neg = [], []
    for i in sorted(pick.tolist()):
        ex = requests[i]
        fp = example_prompt(ex, titles, tok, cfg.policy)
        s = score_candidates(model, tok, fp.text, candidate_answers(ex.candidates, titles),
                             batch_tokens=cfg.policy.scoring_batch_tokens)
        e = candidate_propensities(s, cfg.policy.tau)
        if rng.random() < click_rate:
            j = ex.candidates.index(ex.positive)
        else:
            j, _ = sample_logged_action(e.numpy(), rng)
        a = ex.candidates[j]
        row = {"impression_id": ex.request_id, "user_id": ex.user_id, "arm": "abpo", "history": list(ex.history),
               "candidates": list(ex.candidates), "item_id": a, "propensity": float(e[j]),
               "clicked": int(a == ex.positive)}
        (pos if row["clicked"] else neg).append(row)
    return pos, neg


class StepTimer:
    def __init__(self):
        from transformers import TrainerCallback

        timer = self

        class _CB(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                timer.t0, timer.c0 = time.perf_counter(), time.process_time()

            def on_step_end(self, args, state, control, **kw):
                timer.times.append(time.perf_counter() - timer.t0)
                timer.cpu.append(time.process_time() - timer.c0)

        self.times: list[float] = []
        self.cpu: list[float] = []  # process CPU seconds (all threads): robust to other load on a shared machine
        self.callback = _CB()


def time_variant(variant, model_dir, tok, ds, update_cfg, policy_cfg, settings, steps, warmup, out_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from abpo.policy.model import lora_config
    from abpo.train.update import train_update

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    u = dataclasses.replace(update_cfg, variant=variant, max_steps=steps + warmup, save_steps=10**6, warmup_ratio=0.0)
    s = dataclasses.replace(settings, variant=variant)
    timer = StepTimer()
    trainer, _ = train_update(model, tok, ds, u, s, output_dir=out_dir / variant, seed=0,
                              peft_config=lora_config(policy_cfg), resume=False,
                              callbacks=[timer.callback], grpo_overrides={"save_strategy": "no"}, quiet=True)
    extra = [h.get("abpo/advantage_time_s") for h in trainer.state.log_history if "abpo/advantage_time_s" in h]
    return timer.times[warmup:], timer.cpu[warmup:], extra[warmup:]  # drop the warm-up steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, nargs="+", default=[20, 200], help="candidate-set sizes M (default 20 200)")
    ap.add_argument("--steps", type=int, default=4, help="timed optimizer steps per run")
    ap.add_argument("--warmup", type=int, default=1, help="untimed warm-up steps per run")
    ap.add_argument("--reps", type=int, default=2, help="B/F alternations per M")
    ap.add_argument("--group-size", type=int, default=None, help="G (default: the tiny preset's update.group_size)")
    ap.add_argument("--batch-size", type=int, default=None, help="logged examples per step (default: the preset's)")
    ap.add_argument("--click-rate", type=float, default=0.25, help="share of requests logged as clicks")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--config", default="tiny")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from abpo.config import load_config
    from abpo.data.loaders import load_dataset
    from abpo.policy.model import build_tiny
    from abpo.train.dataset import update_dataset_from_strata
    from abpo.train.trainer import ABPOSettings

    torch.set_num_threads(args.threads)
    results = []
    with tempfile.TemporaryDirectory(prefix="abpo-bench-") as tmp:
        tmp = Path(tmp)
        for m in args.m:
            cfg = load_config(args.config, [
                f"data.train_candidates={m}", f"policy.max_prompt_tokens={max(1024, 24 * m + 512)}",
            ])
            if args.group_size:
                cfg.update.group_size = args.group_size
            if args.batch_size:
                cfg.update.batch_size = args.batch_size
            dataset = load_dataset(cfg.data)
            model_dir = build_tiny(cfg.policy, cfg.paths, dataset.titles(), seed=cfg.seed)
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(model_dir)
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
            n_req = cfg.update.batch_size * (args.steps + args.warmup) * 2
            t0 = time.perf_counter()
            pos, neg = build_log(cfg, dataset, model, tok, n_req, args.click_rate, cfg.seed)
            import pyarrow as pa

            ds, report = update_dataset_from_strata(
                pa.Table.from_pylist(pos), pa.Table.from_pylist(neg), dataset.titles(), tok, cfg.policy,
                examples_per_batch=cfg.update.batch_size, seed=cfg.seed,
            )
            prompt_tokens = statistics.mean(
                len(tok.apply_chat_template(r, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
                for r in ds["prompt"][:8]
            )
            print(f"M={m}: {len(pos)} clicks + {len(neg)} no-responses logged in {time.perf_counter() - t0:.1f}s; "
                  f"{len(ds)} rows, ~{prompt_tokens:.0f} prompt tokens, G={cfg.update.group_size}, "
                  f"batch={cfg.update.batch_size} examples", flush=True)
            settings = ABPOSettings(tau=cfg.policy.tau, lambda_sc=cfg.update.lambda_sc,
                                    scoring_batch_tokens=cfg.policy.scoring_batch_tokens)
            times = {"grpo": [], "abpo": []}
            cpu = {"grpo": [], "abpo": []}
            extra = []
            for rep in range(args.reps):
                for variant in ("grpo", "abpo"):
                    t, c, x = time_variant(variant, model_dir, tok, ds, cfg.update, cfg.policy, settings, args.steps, args.warmup, tmp / f"{m}-{rep}")
                    times[variant] += t
                    cpu[variant] += c
                    if variant == "abpo":
                        extra += [v for v in x if v is not None]
                    print(f"  rep {rep} {variant:5s}: wall " + " ".join(f"{v:.2f}" for v in t) + " s/step; CPU "
                          + " ".join(f"{v:.2f}" for v in c) + " s/step", flush=True)
            b, f = statistics.median(times["grpo"]), statistics.median(times["abpo"])
            bc, fc = statistics.median(cpu["grpo"]), statistics.median(cpu["abpo"])
            results.append((m, b, f, bc, fc, statistics.median(extra) if extra else float("nan"), prompt_tokens))

    print()
    print("median per optimizer step; wall = seconds, CPU = process CPU seconds (robust to other load)")
    print(f"{'M':>5} {'prompt tok':>10} {'B wall':>8} {'F wall':>8} {'F/B wall':>9} {'B CPU':>8} {'F CPU':>8} "
          f"{'F/B CPU':>8} {'F e_old+r_sc wall':>18}")
    for m, b, f, bc, fc, x, pt in results:
        print(f"{m:>5} {pt:>10.0f} {b:>8.2f} {f:>8.2f} {f / b:>9.2f} {bc:>8.2f} {fc:>8.2f} {fc / bc:>8.2f} {x:>18.2f}")
    at20 = [fc / bc for m, b, f, bc, fc, _, _ in results if m == 20]
    if at20:
        print(f"goal F/B <= 1.5 at M=20 (CPU time): {'met' if all(r <= 1.5 for r in at20) else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
