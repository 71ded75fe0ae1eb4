"""Config section `experiment`: `abpo experiment`, the paper's Table 1 and ablation on any dataset."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ExperimentConfig:
    name: str = field(
        default="table1",
        metadata={"help": "Experiment directory under <paths.root>/experiments/ (cells, seeds' models, outputs)."},
    )
    seeds: list[int] = field(
        default_factory=lambda: [0, 1, 2],
        metadata={
            "help": "Seeds: each gets its own pi_init (SFT), its own D_bandit and its own updates; the data split "
            "and candidate sets follow data.seed and are the same for every seed (paired comparisons)."
        },
    )
    rows: list[str] = field(
        default_factory=lambda: ["none", "grpo", "anchor", "anchor_snips", "anchor_sc", "abpo", "popularity", "ml_retrain"],
        metadata={
            "help": "Table rows: update variants (A none = No-Update, B grpo, C anchor, D anchor_snips, E anchor_sc, "
            "F abpo) and the baselines popularity and ml_retrain, all ranked on the same evaluation candidates."
        },
    )
    eval_split: str = field(
        default="test",
        metadata={
            "help": "Which held-out users score the table: test | validation. Users are split once by a salted "
            "hash of their id (validation_fraction of them are validation users); anything tuned is tuned on "
            "validation, the reported table is on test. Both use the held-out target x_{T+N}, never trained on."
        },
    )
    validation_fraction: float = field(
        default=0.3, metadata={"help": "Share of users in the validation split (the rest are test users)."}
    )
    max_eval_users: int = field(
        default=0, metadata={"help": "Score at most this many users of the split (seeded choice); 0 = all of them."}
    )
    update_max_examples: int = field(
        default=0,
        metadata={"help": "update.max_examples for every variant's update (logged rows used); 0 = keep update.max_examples."},
    )
    month: str = field(default="2024-01", metadata={"help": "Month stamped on the offline D_bandit impressions."})
    workers: int = field(
        default=2,
        metadata={
            "help": "Cells computed in parallel processes (each with policy.num_threads torch threads). 2 fills a "
            "2-core machine with the tiny model's single-thread work."
        },
    )
    ml_retrain_epochs: int = field(
        default=0, metadata={"help": "Training epochs of the ML-retrain sequential recommender; 0 = its default."}
    )
    mlflow_experiment: str = field(
        default="abpo-experiment", metadata={"help": "MLflow experiment: one parent run, a nested run per cell."}
    )
