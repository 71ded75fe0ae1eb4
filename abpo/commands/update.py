"""`abpo update`: one ABPO (or ablation / GRPO) update of the policy from the bandit log in the warehouse."""

from __future__ import annotations

import argparse
import sys


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "update",
        parents=[common],
        help="Update pi_init from the bandit log (ABPO or a variant A-F) with TRL; save a LoRA checkpoint.",
        description="Read D_bandit (update.arm's impressions of update.months) from the DuckDB warehouse in "
        "stratified mini-batches, run the update of update.variant (docs/ABPO_SPEC.md: A none, B grpo, C anchor, "
        "D anchor_snips, E anchor_sc, F abpo) on pi_init (the output of `abpo sft`) with trl.GRPOTrainer, "
        "log every step to MLflow, and save the LoRA adapter (and merged model). Resumes from the last "
        "checkpoint of the same update directory unless --no-resume. Prints where the checkpoint and the "
        "MLflow run are.",
    )
    p.add_argument("--variant", default=None, help="Variant letter or name (default: update.variant), e.g. abpo, grpo, F, B.")
    p.add_argument("--month", action="append", default=None, help="Train on this month's log (repeatable; default: update.months or all).")
    p.add_argument("--max-steps", type=int, default=None, help="Stop after this many optimizer steps (default: update.max_steps).")
    p.add_argument("--no-resume", action="store_true", help="Start over even if a checkpoint exists.")
    p.set_defaults(handler=cmd_update)


def cmd_update(args: argparse.Namespace, cfg) -> int:
    from abpo.algo.variants import get_variant
    from abpo.train.update import UpdateInputMissing, rollout_signal, run_update

    if args.variant:
        cfg.update.variant = args.variant
    if args.month:
        cfg.update.months = list(args.month)
    if args.max_steps is not None:
        cfg.update.max_steps = args.max_steps
    if args.no_resume:
        cfg.update.resume = False
    try:
        variant = get_variant(cfg.update.variant)
    except ValueError as e:
        print(f"abpo update: {e}", file=sys.stderr)
        return 2
    try:
        res = run_update(cfg)
    except UpdateInputMissing as e:
        print(f"abpo update: {e}", file=sys.stderr)
        return 1
    uri = cfg.paths.tracking_uri()
    if not variant.update:
        print(f"update: variant A (no update): the policy stays pi_init at {res.model_dir}")
    else:
        print(f"update: variant {variant.letter} ({variant.name}), {res.global_step} steps"
              + (f", resumed from {res.resumed_from}" if res.resumed_from else ""))
        print(f"update: batches {res.batching}")
        keys = ("abpo/reward/total_mean", "abpo/match_rate/positive", "abpo/match_rate/no_response",
                "abpo/snips/ess_fraction", "abpo/advantages/mean", "entropy", "step_time")
        shown = {k: round(res.metrics[k], 4) for k in keys if k in res.metrics}
        if shown:
            print(f"update: last step {shown}")
        signal = rollout_signal(res.history)
        if signal:
            print(f"update: rollouts over {len(res.history)} steps (means): "
                  + ", ".join(f"{k} {v:.3f}" for k, v in signal.items()))
        print(f"update: LoRA adapter   {res.adapter_dir}")
        print(f"update: merged model   {res.model_dir}")
        print(f"update: last checkpoint {res.checkpoint_dir}")
    print(f"update: MLflow run {res.mlflow_run_id} (experiment {cfg.update.mlflow_experiment}, tracking URI {uri})")
    return 0
