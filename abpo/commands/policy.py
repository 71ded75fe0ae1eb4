"""`abpo sft`, `abpo evaluate`, `abpo simulate-log`: pi_init, its offline metrics, and a synthetic D_bandit."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from abpo.arms.names import arm_arg

if TYPE_CHECKING:
    from abpo.config import Config


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "sft",
        parents=[common],
        help="Train pi_init on D_sup (TRL SFTTrainer), evaluate it, log and register it in MLflow.",
        description="Supervised fine-tuning of the initial policy pi_init on D_sup (docs/ABPO_SPEC.md) with TRL's "
        "SFTTrainer, loss on the answer only. Starts from policy.model (tiny: built locally), saves to "
        "<paths.models>/<sft.output>, logs params, the loss curve and the model to MLflow, registers it "
        "(aliases champion and pi_init), and prints HR@K of pi_init on the held-out targets next to the "
        "random baseline K/M.",
    )
    p.add_argument("--max-steps", type=int, default=None, help="Stop after this many optimizer steps (sft.max_steps).")
    p.add_argument("--no-mlflow", action="store_true", help="Do not log to MLflow nor register the model.")
    p.add_argument("--no-eval", action="store_true", help="Skip the held-out evaluation.")
    p.set_defaults(handler=cmd_sft)

    p = sub.add_parser(
        "evaluate",
        parents=[common],
        help="Offline metrics of a policy on the held-out targets: HR@K, NDCG@K, Diversity@K vs random K/M.",
        description="Rank each user's evaluation candidates (target x_{T+N} + unseen negatives) by s_p and print "
        "HR@1/5, NDCG@1/5 and Diversity@1/5 next to the random baseline K/M; optionally HR@1 by greedy "
        "generation. The policy is --model (a directory), else pi_init (<paths.models>/<sft.output>).",
    )
    p.add_argument("--model", default=None, help="Model directory to evaluate (default: pi_init).")
    p.add_argument("--max-users", type=int, default=None, help="Evaluate at most this many users (sft.eval_max_users).")
    p.add_argument("--generation", action="store_true", help="Also report HR@1 by greedy generation.")
    p.set_defaults(handler=cmd_evaluate)

    p = sub.add_parser(
        "simulate-log",
        parents=[common],
        help="Build the synthetic bandit log D_bandit with pi_init and land it as impressions.",
        description="docs/ABPO_SPEC.md offline construction: for each user and t' in {T..T+N-2}, score the M "
        "candidates with pi_init, sample a_log ~ softmax(s/tau), store e0(a_log), y = 1 iff a_log = x_{t'+1}; "
        "write it in the impressions contract to <paths.landing>/impressions/month=YYYY-MM/ for `abpo ingest`.",
    )
    p.add_argument("--month", default="2024-01", help="Month partition to land the log in (YYYY-MM).")
    p.add_argument("--arm", default="abpo", type=arm_arg, help="Arm name written on every impression (default: abpo).")
    p.set_defaults(handler=cmd_simulate_log)


def _threads() -> None:
    import os

    import torch

    n = int(os.environ.get("ABPO_THREADS", "0") or 0)
    if n > 0:
        torch.set_num_threads(n)


def cmd_sft(args: argparse.Namespace, cfg: Config) -> int:
    from abpo.policy.sft import train_sft

    _threads()
    if args.max_steps is not None:
        cfg.sft.max_steps = args.max_steps
    res = train_sft(
        cfg,
        validation_fraction=cfg.experiment.validation_fraction,
        log_mlflow=not args.no_mlflow,
        register=not args.no_mlflow,
        evaluate=not args.no_eval,
    )
    print(f"sft: done in {res.seconds:.0f}s; pi_init at {res.model_dir}")
    if res.metrics:
        for k in (1, 5):
            if f"HR@{k}" in res.metrics:
                print(
                    f"sft: pi_init HR@{k} = {res.metrics[f'HR@{k}']:.4f} vs random K/M = "
                    f"{res.metrics[f'random_HR@{k}']:.4f}"
                )
    if res.model_version:
        print(f"sft: MLflow run {res.mlflow_run_id}, model version {res.model_version} ({cfg.paths.tracking_uri()})")
    return 0


def cmd_evaluate(args: argparse.Namespace, cfg: Config) -> int:
    import dataclasses
    from pathlib import Path

    from abpo.data.candidates import build_eval_examples, training_popularity
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users
    from abpo.policy.evaluate import evaluate_policy
    from abpo.policy.model import load_policy
    from abpo.policy.sft import seeded_subsample

    _threads()
    model_dir = Path(args.model) if args.model else cfg.paths.resolve("models") / cfg.sft.output
    if not model_dir.exists():
        print(f"abpo evaluate: {model_dir}: no model there; run `abpo sft --config {cfg.name}` first", file=sys.stderr)
        return 1
    ds = load_dataset(cfg.data)
    splits, _ = split_users(ds, cfg.data)
    n = cfg.sft.eval_max_users if args.max_users is None else args.max_users
    ev = seeded_subsample(build_eval_examples(splits, ds, cfg.data), n, cfg.seed)
    model, tok = load_policy(dataclasses.replace(cfg.policy, model=str(model_dir)), cfg.paths, dataset=ds)
    res = evaluate_policy(
        model, tok, ev, ds.titles(), cfg.policy, popularity=training_popularity(splits, ds), generation=args.generation
    )
    print(f"evaluate: {model_dir}")
    for line in res.lines():
        print(f"evaluate: {line}")
    return 0


def cmd_simulate_log(args: argparse.Namespace, cfg: Config) -> int:
    from abpo.policy.bandit import build_bandit_log

    _threads()
    try:
        table = build_bandit_log(cfg, month=args.month, arm=args.arm)
    except FileNotFoundError as e:
        print(f"abpo simulate-log: {e}", file=sys.stderr)
        return 1
    clicks = sum(table.column("clicked").to_pylist())
    print(
        f"simulate-log: {table.num_rows} impressions for {args.month} (arm {args.arm}), {clicks} clicks "
        f"(CTR {clicks / max(table.num_rows, 1):.4f}) -> {cfg.paths.location('landing')}/impressions/month={args.month}/"
    )
    return 0
