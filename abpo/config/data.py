"""Config section `data`: which dataset, and how sequences become D_sup / D_bandit / evaluation sets."""

from __future__ import annotations

from dataclasses import dataclass, field

from abpo.data.loaders import FORMATS


@dataclass
class DataConfig:
    dataset_dir: str = field(
        default="data/ml-latest-small",
        metadata={
            "help": "Dataset directory; a relative path is under the repo root (installed from a wheel: the "
            "current directory, else the bundled data); or an object-store URI (s3://bucket/prefix, "
            "movielens format: its movies.csv and ratings.csv; docs/scaling.md)."
        },
    )
    format: str = field(
        default="movielens", metadata={"choices": FORMATS, "help": "Dataset format: movielens | amazon18."}
    )
    amazon_domain: str = field(
        default="Office_Products", metadata={"help": "amazon18 only: the domain (file prefix) to load."}
    )
    seed: int = field(
        default=0,
        metadata={"min": 0, "max": 2**32 - 1, "help": "Seed for distractor sampling and every other data-side draw."},
    )
    tie_seed: int = field(
        default=0,
        metadata={
            "min": 0,
            "max": 2**32 - 1,
            "help": "movielens: seed of the shuffle that orders a user's ratings in the same second (their true "
            "order is unknown; item_id order would leak the next item to a sequential model). Apart "
            "from data.seed so that the sequences, splits and targets stay put when only the "
            "distractors are redrawn.",
        },
    )
    min_history: int = field(
        default=5,
        metadata={
            "min": 1,
            "help": "T must be at least this: users with fewer initial-history items are reported and skipped.",
        },
    )
    update_steps: int = field(
        default=4,
        metadata={"min": 1, "help": "N-1: bandit requests per user, t' in {T..T+N-2}; x_{T+N} is the held-out target."},
    )
    train_candidates: int = field(
        default=20, metadata={"min": 2, "help": "M: candidate-set size for training (D_sup, D_bandit). Paper: 200."}
    )
    eval_candidates: int = field(
        default=100, metadata={"min": 2, "help": "Candidate-set size for evaluation. Paper: 200."}
    )
    eval_hard_negative_fraction: float = field(
        default=0.5,
        metadata={
            "min": 0,
            "max": 1,
            "help": "Share of evaluation negatives drawn as popularity-based hard negatives (the rest uniform).",
        },
    )
    train_hard_negative_fraction: float = field(
        default=0.5,
        metadata={
            "min": 0,
            "max": 1,
            "help": "Share of training distractors (D_sup, D_bandit) drawn by training popularity like the "
            "evaluation's hard negatives, so training sees the evaluation's candidate distribution; "
            "0 = the spec's uniform distractors.",
        },
    )
    sup_examples_per_user: int = field(
        default=0, metadata={"min": 0, "help": "Cap on D_sup pairs (x_{1:t}, x_{t+1}) per user, latest first; 0 = all."}
    )
    max_users: int = field(
        default=0, metadata={"min": 0, "help": "Use at most this many users (seeded choice); 0 = all."}
    )
    ingest_min_keep_fraction: float = field(
        default=0.5,
        metadata={
            "min": 0,
            "max": 1,
            "help": "Ingest refuses to replace a month by fewer than this share of the clean rows it holds (0 "
            "clean rows always refused) unless forced (`abpo ingest --force`).",
        },
    )
    warehouse_memory_limit: str = field(
        default="", metadata={"help": "DuckDB memory_limit for the warehouse (e.g. 2GB); empty = DuckDB's default."}
    )
    warehouse_temp_directory: str = field(
        default="duckdb_tmp",
        metadata={"help": "DuckDB spill directory (relative to paths.root unless absolute); empty = DuckDB's default."},
    )
    known_arms: list[str] = field(
        default_factory=lambda: ["abpo", "grpo", "ml_retrain", "popularity"],
        metadata={"help": "Arms the warehouse accepts in impressions; rows of any other arm are quarantined."},
    )
    min_propensity: float = field(
        default=1e-9,
        metadata={
            "gt": 0,
            "max": 1,
            "help": "Contract floor of a logged propensity: rows below it are quarantined "
            "(propensity_out_of_range) and the GX suite checks it. Near 0 the SNIPS weight e/e0 "
            "overflows (5e-324 gave a NaN estimate); an arm draws an item this unlikely about once in "
            "a billion exposures per candidate. Must be in (0, 1].",
        },
    )
    max_clock_skew_seconds: float = field(
        default=86400.0,
        metadata={
            "min": 0,
            "help": "Contract: served_at may differ from event_time by at most this many seconds; rows further "
            "apart are quarantined (served_at_out_of_range).",
        },
    )
    max_quarantine_fraction: float = field(
        default=0.2,
        metadata={
            "min": 0,
            "max": 1,
            "help": "Ingest refuses to publish a month whose quarantined share of the landed rows is above this "
            "(naming the rules that fired) unless forced (`abpo ingest --force`); 1 disables.",
        },
    )
