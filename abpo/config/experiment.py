"""Config section `experiment`: `abpo experiment`, the paper's Table 1 and ablation on any dataset."""

from __future__ import annotations

from dataclasses import dataclass, field

# The logging regime's choices (abpo.experiment.regime_settings reads them; docs/regimes.md)
LOGGERS = ("on_policy", "pi_init", "foreign", "uniform", "mixed")  # experiment.logger
FOREIGN = ("ml_retrain", "popularity")  # experiment.foreign_logger: the rankers that can log
CLICKS = ("next_item", "simulator")  # experiment.clicks
LOG_CANDIDATES = ("offline", "paper")  # experiment.log_candidates


@dataclass
class ExperimentConfig:
    name: str = field(
        default="table1",
        metadata={"help": "Experiment directory under <paths.root>/experiments/ (cells, seeds' models, outputs)."},
    )
    seeds: list[int] = field(
        default_factory=lambda: [0, 1, 2, 3, 4],
        metadata={
            "min": 0,
            "help": "Seeds: each gets its own pi_init (SFT), its own D_bandit and its own updates; the data split "
            "and candidate sets follow data.seed and are the same for every seed (paired comparisons).",
        },
    )
    rows: list[str] = field(
        default_factory=lambda: [
            "none",
            "grpo",
            "anchor",
            "anchor_snips",
            "anchor_sc",
            "abpo",
            "full_info",
            "popularity",
            "ml_retrain",
        ],
        metadata={
            "help": "Table rows: update variants (A none = No-Update, B grpo, C anchor, D anchor_snips, E anchor_sc, "
            "F abpo; beside them G grpo_cr, H abpo_cr, I abpo_ll, J wll, K abpo_offpolicy, L grpo_ll of "
            "docs/update-variants.md), the GRPO controls grpo_g1 and grpo_lr, full_info (the upper reference: next-item fine-tuning of pi_init on the true next items of the "
            "same update positions, what complete feedback would give) and the baselines popularity and "
            "ml_retrain, all ranked on the same evaluation candidates."
        },
    )
    eval_split: str = field(
        default="test",
        metadata={
            "choices": ("test", "validation"),
            "help": "Which held-out users score the table: test | validation. Users are split once by a salted "
            "hash of their id (validation_fraction of them are validation users); anything tuned is tuned on "
            "validation, the reported table is on test. Both use the held-out target x_{T+N}, never trained on.",
        },
    )
    validation_fraction: float = field(
        default=0.3,
        metadata={"gt": 0, "lt": 1, "help": "Share of users in the validation split (the rest are test users)."},
    )
    max_eval_users: int = field(
        default=0,
        metadata={"min": 0, "help": "Score at most this many users of the split (seeded choice); 0 = all of them."},
    )
    update_max_examples: int = field(
        default=0,
        metadata={
            "min": 0,
            "help": "update.max_examples for every variant's update (logged rows used); 0 = keep update.max_examples.",
        },
    )
    update_steps: int = field(
        default=0,
        metadata={
            "min": 0,
            "help": "N-1 for this experiment: bandit requests per user (the logged rows an update sees); 0 = keep "
            "data.update_steps. Applied as data.update_steps everywhere in the experiment (it also sets T, so pi_init "
            "trains on x_{1:T} of the shorter histories).",
        },
    )
    eval_candidates: int = field(
        default=0,
        metadata={
            "min": 0,
            "help": "M of the evaluation's candidate sets for this experiment (the paper's is 200); 0 = keep "
            "data.eval_candidates. Applied as data.eval_candidates everywhere in the experiment.",
        },
    )
    rounds: int = field(
        default=1,
        metadata={
            "min": 1,
            "help": "Successive update rounds R. Each user's update positions x_{T+1..T+N-1} (data.update_steps) are "
            "cut into R consecutive windows; round r logs a fresh D_bandit on window r with the row's round r-1 "
            "policy (pi_init for r = 1) and updates that policy from it. 1 = one update on the whole log.",
        },
    )
    full_info_learning_rate: float = field(
        default=1.0e-4,
        metadata={
            "gt": 0,
            "help": "Learning rate of the full_info row's next-item fine-tuning (one epoch, sft.batch_size).",
        },
    )
    noninferiority_margin: float = field(
        default=0.01,
        metadata={
            "min": 0,
            "help": "Absolute non-inferiority margin δ against No-Update, an HR@5 difference: H0 Δ <= -δ is tested "
            "one-sided at level experiment.noninferiority_alpha on the two-stage bootstrap (abpo.experiment.stats).",
        },
    )
    noninferiority_relative_margin: float = field(
        default=0.05,
        metadata={
            "min": 0,
            "help": "Relative non-inferiority margin against No-Update, a share ρ of No-Update's mean HR@5: H0 Δ <= "
            "-ρ · mean HR@5(No-Update), tested like the absolute margin (both are reported).",
        },
    )
    noninferiority_alpha: float = field(
        default=0.025,
        metadata={
            "gt": 0,
            "lt": 0.5,
            "help": "One-sided level of both non-inferiority tests (0.025 = the lower bound of a two-sided 95% "
            "interval).",
        },
    )
    primary_contrast: str = field(
        default="abpo-grpo",
        metadata={
            "help": "The pre-registered primary contrast 'ROW-REFERENCE' (HR@5 at the last round, ROW minus "
            "REFERENCE), reported with its unadjusted two-stage bootstrap p; every other comparison of the table is "
            "Holm-adjusted as one family. Default: F (abpo) vs B (grpo)."
        },
    )
    alpha: float = field(
        default=0.05,
        metadata={"gt": 0, "lt": 1, "help": "Two-sided level of the intervals, the p-values' tests and the MDE."},
    )
    power: float = field(
        default=0.8,
        metadata={"gt": 0, "lt": 1, "help": "Power of the minimum detectable effect beside each comparison."},
    )
    bootstrap_samples: int = field(
        default=2000,
        metadata={
            "min": 1,
            "help": "Replicates of the two-stage bootstrap (seeds with replacement, then users inside each drawn "
            "seed) behind every interval, p-value, MDE and trend test of the table.",
        },
    )
    logger: str = field(
        default="on_policy",
        metadata={
            "choices": LOGGERS,
            "help": "Who logs each round's D_bandit (abpo.experiment.regimes): on_policy (the row's round r-1 policy, "
            "pi_init in round 1), pi_init (every round: the paper's literal e0, stale from round 2), foreign (the "
            "ranker experiment.foreign_logger, softmax(score/T)), uniform (uniform over the log's candidates) or "
            "mixed (each request's logger drawn by report.arm_shares: LLM arms = the row's current policy, ranker "
            "arms = the rankers). The stored propensity is always the logger's own e0 of the logged item.",
        },
    )
    foreign_logger: str = field(
        default="ml_retrain",
        metadata={
            "choices": FOREIGN,
            "help": "The ranker that logs with experiment.logger = foreign: ml_retrain | popularity.",
        },
    )
    foreign_temperature: float = field(
        default=0.0,
        metadata={
            "min": 0,
            "help": "T of a ranker logger's softmax(score/T) (foreign and mixed); 0 = arms.<ranker>.temperature.",
        },
    )
    clicks: str = field(
        default="next_item",
        metadata={
            "choices": CLICKS,
            "help": "Click model of the logs: next_item (y = 1 iff the logged item is x_{t'+1}) or simulator (the "
            "production loop's click model abpo.sim.clicks on its preference oracle, with sim.base_ctr's intercept "
            "calibration and the next/soon boosts; seeded uniforms), so a no-response can be a liked item and a "
            "click a non-next item.",
        },
    )
    log_candidates: str = field(
        default="offline",
        metadata={
            "choices": LOG_CANDIDATES,
            "help": "Candidates of the logged requests: offline (data.train_candidates with "
            "data.train_hard_negative_fraction popularity hard negatives) or paper (experiment.log_candidate_count "
            "uniform random unseen distractors); the next item x_{t'+1} is always included.",
        },
    )
    log_candidate_count: int = field(
        default=200,
        metadata={"min": 2, "help": "M of the logged candidate sets with experiment.log_candidates = paper."},
    )
    month: str = field(default="2024-01", metadata={"help": "Month stamped on the offline D_bandit impressions."})
    workers: int = field(
        default=2,
        metadata={
            "min": 1,
            "help": "Cells computed in parallel processes (each with policy.num_threads torch threads). 2 fills a "
            "2-core machine with the tiny model's single-thread work.",
        },
    )
    ml_retrain_epochs: int = field(
        default=0,
        metadata={"min": 0, "help": "Training epochs of the ML-retrain sequential recommender; 0 = its default."},
    )
    mlflow_experiment: str = field(
        default="abpo-experiment", metadata={"help": "MLflow experiment: one parent run, a nested run per cell."}
    )
