"""`abpo experiment`: the paper's Table 1 and ablation (abpo.experiment.runner)."""

from __future__ import annotations

import argparse


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "experiment",
        parents=[common],
        help="Reproduce the paper's Table 1 and ablation: variants A-F + popularity + ML-retrain over seeds.",
        description=(
            "For every seed in experiment.seeds: pi_init by SFT, D_bandit logged by it, then one cell per row of "
            "experiment.rows (No-Update, vanilla GRPO, (C), (D), (E), ABPO, popularity, ML-retrain), all ranked on "
            "the same held-out candidates of the experiment.eval_split users. Prints HR@1, HR@5, NDCG@5, "
            "Diversity@1, Diversity@5 (mean ± std over seeds) with paired tests against No-Update and vanilla GRPO, "
            "and writes table.csv, table.md, ablation.png under <paths.root>/experiments/<experiment.name>/, all "
            "logged to MLflow. Finished cells are reused on a rerun. Any MovieLens-format directory "
            "(--set data.dataset_dir=DIR) or an Amazon-2018 domain (--set data.format=amazon18 --set "
            "data.dataset_dir=DIR --set data.amazon_domain=Office_Products)."
        ),
    )
    p.add_argument("--seeds", help="Comma-separated seeds (experiment.seeds).")
    p.add_argument("--rows", help="Comma-separated rows (experiment.rows), e.g. none,grpo,abpo.")
    p.add_argument("--workers", type=int, help="Parallel worker processes (experiment.workers).")
    p.add_argument("--split", choices=["test", "validation"], help="Evaluation users (experiment.eval_split).")
    p.set_defaults(handler=_cmd_experiment)


def _cmd_experiment(args: argparse.Namespace, cfg) -> int:
    from abpo.experiment.runner import run_experiment

    overrides = list(args.overrides)
    for flag, key in (("seeds", "experiment.seeds"), ("rows", "experiment.rows"), ("workers", "experiment.workers"),
                      ("split", "experiment.eval_split")):
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={value}")
    from abpo.config import load_config

    cfg = load_config(args.config, overrides)
    res = run_experiment(cfg, config_ref=args.config, overrides=overrides)
    print(res.outputs["md"].read_text())
    for name, path in res.outputs.items():
        print(f"{name}: {path}")
    print(f"MLflow run: {res.mlflow_run_id} (experiment {cfg.experiment.mlflow_experiment})")
    return 0
