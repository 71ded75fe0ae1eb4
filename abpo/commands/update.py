"""`abpo update`: one ABPO (or ablation / GRPO) update of the policy from the bandit log in the warehouse."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from abpo.arms.names import arm_arg
from abpo.months import month_arg

if TYPE_CHECKING:
    from abpo.config import Config


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "update",
        parents=[common],
        help="Update pi_init from the bandit log (ABPO or a variant A-F) with TRL; save a LoRA checkpoint.",
        description="Read D_bandit (--arm's impressions of the --month(s)) from the DuckDB warehouse in stratified "
        "mini-batches, run the update of --variant (docs/ABPO_SPEC.md: A none, B grpo, C anchor, D anchor_snips, "
        "E anchor_sc, F abpo; beside them G grpo_cr, H abpo_cr, I abpo_ll, J wll, K abpo_offpolicy, L grpo_ll: "
        "docs/update-variants.md) on pi_init (the output of `abpo sft`, or --init-model) with trl.GRPOTrainer, log every "
        "step to MLflow, and save the LoRA adapter (and merged model). Resumes from the last checkpoint of the same "
        "update directory unless --no-resume. Prints where the checkpoint and the MLflow run are. The flags say what "
        "to train; the config's section update says how (abpo config --explain).",
    )
    p.add_argument("--variant", default="abpo", help="Variant letter or name (default: abpo), e.g. abpo, grpo, F, B.")
    p.add_argument(
        "--month",
        action="append",
        type=month_arg,
        default=None,
        help="Train on this month's log (repeatable; default: every month ingested).",
    )
    p.add_argument(
        "--arm", default="abpo", type=arm_arg, help="Train on the impressions this arm served (default: abpo)."
    )
    p.add_argument(
        "--init-model",
        type=Path,
        default=None,
        metavar="DIR",
        help="Start from this model directory (default: the output of `abpo sft`, <paths.models>/<sft.output>).",
    )
    p.add_argument(
        "--output",
        type=Path,
        default=None,
        metavar="DIR",
        help="Update directory, under paths.models unless absolute "
        "(default: update-<letter>-<first month>_<last month>-seed<seed>).",
    )
    p.add_argument(
        "--max-steps", type=int, default=None, help="Stop after this many optimizer steps (default: update.max_steps)."
    )
    p.add_argument("--no-resume", action="store_true", help="Start over even if a checkpoint exists.")
    p.set_defaults(handler=cmd_update)


def cmd_update(args: argparse.Namespace, cfg: Config) -> int:
    from abpo.algo.variants import get_variant
    from abpo.train.distributed import LaunchRefused
    from abpo.train.runs import UpdateInputMissing, UpdateRun, rollout_signal
    from abpo.train.update import run_update

    if args.max_steps is not None:
        cfg.update.max_steps = args.max_steps
    if args.no_resume:
        cfg.update.resume = False
    try:
        variant = get_variant(args.variant)
    except ValueError as e:
        print(f"abpo update: {e}", file=sys.stderr)
        return 2
    run = UpdateRun(
        variant=variant.name,
        arm=args.arm,
        months=tuple(args.month or ()),
        init_model=args.init_model,
        output=args.output,
    )
    try:
        res = run_update(
            cfg,
            run,
            gate_users=cfg.arms.gate_users,
            gate_holdout_fraction=cfg.arms.gate_holdout_fraction,
            gate_ope_rows=cfg.arms.gate_ope_rows,
        )
    except UpdateInputMissing as e:
        print(f"abpo update: {e}", file=sys.stderr)
        return 1
    except LaunchRefused as e:  # a multi-process launch that would train wrongly: nothing trained, no MLflow run
        print(str(e) if str(e).startswith("abpo update") else f"abpo update: {e}", file=sys.stderr)
        return 2
    from abpo.train.distributed import dist_state

    if not dist_state().is_main:
        return 0  # rank 0 prints the summary
    uri = cfg.paths.tracking_uri()
    if not variant.update:
        print(f"update: variant A (no update): the policy stays pi_init at {res.model_dir}")
    else:
        print(
            f"update: variant {variant.letter} ({variant.name}), {res.global_step} steps"
            + (f", resumed from {res.resumed_from}" if res.resumed_from else "")
        )
        print(f"update: batches {res.batching}")
        keys = (
            "abpo/reward/total_mean",
            "abpo/match_rate/positive",
            "abpo/match_rate/no_response",
            "abpo/snips/ess_fraction",
            "abpo/advantages/mean",
            "entropy",
            "step_time",
        )
        shown = {k: round(res.metrics[k], 4) for k in keys if k in res.metrics}
        if shown:
            print(f"update: last step {shown}")
        signal = rollout_signal(res.history)
        if signal:
            print(
                f"update: rollouts over {len(res.history)} steps (means): "
                + ", ".join(f"{k} {v:.3f}" for k, v in signal.items())
            )
        print(f"update: LoRA adapter   {res.adapter_dir}")
        print(f"update: merged model   {res.model_dir}")
        print(f"update: last checkpoint {res.checkpoint_dir}")
    print(f"update: MLflow run {res.mlflow_run_id} (experiment {cfg.update.mlflow_experiment}, tracking URI {uri})")
    return 0
