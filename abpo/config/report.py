"""Config section `report`: the A/B analysis."""

from __future__ import annotations

from dataclasses import dataclass, field

# abpo's holdback arm (abpo.arms.names: the one arm of kind holdback, which the config layer cannot import; a test
# holds the two names equal): report.holdback_arm may name it when the config does not serve it (no holdback table)
HOLDBACK_ARM = "holdback"


@dataclass
class ReportConfig:
    candidate_arm: str = field(
        default="abpo",
        metadata={"help": "The arm compared against every other arm: one of arms.names (checked at load)."},
    )
    arm_shares: dict[str, float] = field(
        default_factory=lambda: {"abpo": 0.43, "grpo": 0.25, "ml_retrain": 0.18, "popularity": 0.14},
        metadata={
            "min": 0,
            "max": 1,
            "help": "Configured traffic share of each arm (users): what the simulator's router assigns and what "
            "the sample-ratio-mismatch check expects.",
        },
    )
    holdback_arm: str = field(
        default=HOLDBACK_ARM,
        metadata={
            "help": "The arm that is never updated (pi_init served throughout): each arm of "
            "report.updated_arms is compared with it, month by month and over the whole period, in the "
            'table "Updating vs not updating (holdback)"; no table when it has no data. One of arms.names, '
            "or holdback when the config does not serve it, or empty for none (checked at load)."
        },
    )
    updated_arms: list[str] = field(
        default_factory=lambda: ["abpo", "grpo"],
        metadata={
            "help": "The arms updated monthly that the holdback table compares with report.holdback_arm "
            "(those with data)."
        },
    )
    confidence: float = field(default=0.95, metadata={"gt": 0, "lt": 1, "help": "Confidence level of every interval."})
    power: float = field(
        default=0.8,
        metadata={
            "gt": 0,
            "lt": 1,
            "help": "Power at which the minimum detectable effect printed beside every comparison is computed.",
        },
    )
    srm_alpha: float = field(
        default=0.001, metadata={"gt": 0, "lt": 1, "help": "Flag a sample-ratio mismatch below this p-value."}
    )
    max_user_share: float = field(
        default=0.1,
        metadata={
            "gt": 0,
            "max": 1,
            "help": "Flag an arm in a period where one user carries more than this share of its impressions "
            "(a bot, a replayed log): its comparisons are not tested, since impressions are not independent "
            "trials (0.1: an arm needs more than 10 users' worth of traffic; 1: never flagged).",
        },
    )
    assignment: str = field(
        default="salted_hash",
        metadata={
            "choices": ["salted_hash", "external"],
            "help": "How users were assigned to arms. salted_hash: the experiment's hash (sim.salt, the "
            "shares of arms.names in that order; abpo.abtest.assignment): the report checks every logged "
            "user against it and does not test an arm holding users of another arm. external: your own "
            "router's rule, which the report cannot check (it says so).",
        },
    )
    mlflow_experiment: str = field(
        default="abpo-monthly",
        metadata={
            "help": "MLflow experiment of the monthly runs; the report is logged as artifacts of the run "
            "tagged abpo.month=<last month> (the active run if there is one; created if absent)."
        },
    )
