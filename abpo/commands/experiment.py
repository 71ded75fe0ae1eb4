"""`abpo experiment`: the paper's Table 1 and ablation, the validation sweep and successive rounds
(abpo.experiment.runner, abpo.experiment.sweep)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from abpo.config import Config


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "experiment",
        parents=[common],
        help="Reproduce the paper's Table 1 and ablation: variants A-F, full-information, popularity, ML-retrain.",
        description=(
            "For every seed in experiment.seeds: pi_init (next-item pre-training + SFT; shared by every experiment "
            "with the same data, policy and SFT settings), then per round (experiment.rounds) a D_bandit logged by "
            "each row's current policy (or the logger of experiment.logger / --regime) and the row's update from it: No-Update, vanilla GRPO, (C), (D), (E), ABPO "
            "and the full-information upper reference; popularity and ML-retrain fitted on the same data. All rows "
            "are ranked on the same held-out candidates of the experiment.eval_split users. Prints HR@1, HR@5, "
            "NDCG@5, Diversity@1, Diversity@5 (mean ± std over seeds) and, against No-Update and vanilla GRPO, the "
            "paired difference with its two-stage bootstrap interval (seeds, then users) and p (Holm-adjusted but for "
            "the primary contrast, experiment.primary_contrast), the minimum detectable effect and non-inferiority "
            "tests; with rounds > 1 a trend test over rounds; writes table.md/csv, ablation.png, rounds.csv/png under "
            "<paths.root>/experiments/<experiment.name>/, all logged to MLflow. Finished cells are never recomputed. "
            "Any MovieLens-format directory (--set data.dataset_dir=DIR) or an Amazon-2018 domain (--config "
            "amazon18 --set data.amazon_domain=Office_Products|Industrial_and_Scientific)."
        ),
    )
    p.add_argument("--seeds", help="Comma-separated seeds (experiment.seeds).")
    p.add_argument("--rows", help="Comma-separated rows (experiment.rows), e.g. none,grpo,abpo.")
    p.add_argument("--workers", type=int, help="Parallel worker processes (experiment.workers).")
    p.add_argument("--split", choices=["test", "validation"], help="Evaluation users (experiment.eval_split).")
    p.add_argument("--rounds", type=int, help="Successive update rounds R (experiment.rounds).")
    p.add_argument(
        "--regime",
        help="A named logging regime of configs/regimes.yaml (e.g. today, stale_sim, "
        "foreign_sim, uniform_paper): its experiment.logger / clicks / log_candidates settings, applied "
        "before --set.",
    )
    p.add_argument(
        "--sweep",
        action="append",
        metavar="KEY=V1,V2",
        help="Try these values of a config key (repeat for a grid over several keys); validation users only. "
        "Each probe is an experiment under <name>-sweep/<probe>/, summarised in sweep.md.",
    )
    p.add_argument(
        "--regime-table",
        metavar="NAME[,NAME...]",
        help="Print the 'Where ABPO differs from GRPO' table (abpo.experiment.regime_table) of these finished "
        "experiments (names under <paths.root>/experiments, or directories) and exit; nothing is run.",
    )
    p.set_defaults(handler=_cmd_experiment)


def _cmd_experiment(args: argparse.Namespace, cfg: Config) -> int:
    from abpo.config import load_config
    from abpo.experiment.runner import run_experiment

    overrides = list(args.overrides)
    if args.regime:
        from abpo.config.errors import ConfigError
        from abpo.experiment.regime_settings import regime_overrides
        from abpo.paths import CONFIG_DIR

        try:
            overrides = [*regime_overrides(args.regime, CONFIG_DIR / "regimes.yaml"), *overrides]
        except ValueError as e:
            raise ConfigError(str(e)) from None
    for flag, key in (
        ("seeds", "experiment.seeds"),
        ("rows", "experiment.rows"),
        ("workers", "experiment.workers"),
        ("split", "experiment.eval_split"),
        ("rounds", "experiment.rounds"),
    ):
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={value}")
    cfg = load_config(args.config, overrides)
    if args.regime_table:
        from pathlib import Path

        from abpo.config.errors import ConfigError
        from abpo.experiment.regime_table import regime_table

        root = cfg.paths.resolve("root") / "experiments"
        names = [n.strip() for n in args.regime_table.split(",") if n.strip()]
        try:
            print(regime_table([Path(n) if Path(n).is_dir() else root / n for n in names]), end="")
        except (FileNotFoundError, ValueError) as e:
            raise ConfigError(str(e)) from None
        return 0
    if args.sweep:
        from abpo.experiment.sweep import parse_sweep, run_sweep

        axes = parse_sweep(args.sweep)
        for key, values in axes:  # every value must make a valid config before anything runs
            for v in values:
                load_config(args.config, [*overrides, f"{key}={v}"])
        sweep = run_sweep(
            cfg, axes, config_for=lambda ov: load_config(args.config, ov), config_ref=args.config, overrides=overrides
        )
        print(sweep.outputs["md"].read_text())
        for name, path in sweep.outputs.items():
            print(f"{name}: {path}")
        return 0
    res = run_experiment(cfg, config_ref=args.config, overrides=overrides)
    print(res.outputs["md"].read_text())
    for name, path in res.outputs.items():
        print(f"{name}: {path}")
    print(f"MLflow run: {res.mlflow_run_id} (experiment {cfg.experiment.mlflow_experiment})")
    return 0
