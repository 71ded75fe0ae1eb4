"""Config section `arms`: the four arms of the production loop (abpo.arms), one block per arm that has settings of
its own (``arms.popularity``, ``arms.ml_retrain``), and the continual monthly cycle (abpo.monthly)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from abpo.data.holdout import GATE_OPE_ROWS, GATE_USERS

# arms.update_logs' choices, refused at load when anything else; abpo.train.strata.check_update_logs reads them too
UPDATE_LOGS = ("own", "all")

# arms.gate_primary's choices: which half of the gate decides (abpo.monthly.gate_verdict.gate_verdict, docs/gate.md)
GATE_PRIMARY = ("ope", "offline")
# arms.gate_ope_estimator's choices (abpo.monthly.gate dispatches on them): snips = SNIPS on the arm's own month logs
# (the first gate's estimator); the others on every arm's month logs with a cross-fitted reward model
# (abpo.evaluation.off_policy: snips_all is SNIPS there, the rest are its DM, IPS, DR, SNDR and Switch-DR)
GATE_OPE_ESTIMATORS = ("snips", "dm", "ips", "snips_all", "dr", "sndr", "switch_dr")
# the keys of an arm's entry in arms.update_by_arm: the update's budget (rows are arms.update_max_examples_by_arm)
UPDATE_BUDGET_KEYS = ("learning_rate", "epochs", "lr_scheduler_type", "warmup_ratio", "batch_size")
# arms.approval's choices (docs/gate.md "Approval"); the DAG (dags/abpo_monthly.py) and the promote step read them too
APPROVAL = ("none", "required")
# arms.approval_timeout's longest value, and why (abpo.config.values checks it at load: 3000000d was taken, and the
# approval task then overflowed computing its deadline after the gate had passed)
APPROVAL_TIMEOUT_MAX = ("31d", "the DAG runs one month at a time: a longer wait holds the next month back")
# arms.ml_retrain.kind's choices -> the ranker of abpo.baselines.RANKERS it refits (abpo.arms.rankers reads it)
ML_RETRAIN_KINDS = {"als": "ml_retrain", "sasrec": "sasrec"}


@dataclass
class PopularityArmConfig:
    """Block ``arms.popularity``: every field but ``temperature`` is a parameter of the ranker (abpo.baselines)."""

    temperature: float = field(
        default=0.5,
        metadata={"gt": 0, "help": "popularity arm: exposure ~ softmax(log(1 + count) / T) over the candidates."},
    )
    window: int = field(
        default=0,
        metadata={
            "min": 0,
            "help": "popularity arm: count only each user's last N interactions and clicks to date (a rolling "
            "window); 0 = all of them.",
        },
    )


@dataclass
class MLRetrainArmConfig:
    """Block ``arms.ml_retrain``: ``kind`` picks the model; every field but ``temperature`` and ``kind`` is a parameter
    of the ALS ranker (abpo.baselines.als); SASRec's are section ``sasrec``."""

    temperature: float = field(
        default=0.1,
        metadata={"gt": 0, "help": "ml_retrain arm: exposure ~ softmax(model score / T) over the candidates."},
    )
    kind: str = field(
        default="als",
        metadata={
            "choices": tuple(ML_RETRAIN_KINDS),
            "help": "ml_retrain arm's model: als (implicit ALS, refitted from scratch) | sasrec (SASRec-CE, "
            "abpo.baselines.sasrec with section sasrec: the bootstrap early-stopped on the validation users, each "
            "month warm-started from the champion's weights for sasrec.refit_epochs). docs/policy.md, Baselines.",
        },
    )
    iterations: int = field(
        default=15, metadata={"min": 1, "help": "ml_retrain arm (kind als): ALS iterations per refit."}
    )


@dataclass
class ArmsConfig:
    names: list[str] = field(
        default_factory=lambda: ["abpo", "grpo", "ml_retrain", "popularity"],
        metadata={"help": "Arms served and updated each month (every one of them also in report.arm_shares)."},
    )
    popularity: PopularityArmConfig = field(default_factory=PopularityArmConfig)
    ml_retrain: MLRetrainArmConfig = field(default_factory=MLRetrainArmConfig)
    replay_months: int = field(
        default=0,
        metadata={
            "min": 0,
            "max": 1200,  # a century of months: more reaches back before year 1, which no month can name
            "help": "LLM arms: also train on the arm's logs of this many months before the current one "
            "(0 = the current month only: each month's update starts from the champion; at most 1200).",
        },
    )
    min_rows_per_stratum: int = field(
        default=4,
        metadata={
            "min": 1,
            "help": "LLM arms: a month with fewer positive or no-response rows than this is not updated (the "
            "arm keeps its champion; the DAG marks the arm's update skipped).",
        },
    )
    gate_metric: str = field(
        default="HR@5",
        metadata={
            "help": "Offline gate metric, HR@K or NDCG@K: compared user by user (challenger - champion) on the "
            "gate's held-out users (docs/gate.md)."
        },
    )
    gate_primary: str = field(
        default="ope",
        metadata={
            "choices": GATE_PRIMARY,
            "help": "Which evidence decides the gate (docs/gate.md): ope = the paired off-policy estimate of "
            "challenger - champion CTR on the month's served candidates, on rows no update trained on "
            "(arms.gate_ope_rows), against arms.gate_ope_margin; the offline half is then a guardrail against "
            "collapse at arms.gate_guardrail_margin (benchmarks/gate_power.py measures its error rates). "
            "offline = the offline paired test at arms.gate_margin decides together with the off-policy half "
            "(both must pass; the former gate, kept for comparison).",
        },
    )
    gate_margin: float = field(
        default=0.02,
        metadata={
            "help": "Offline gate (paired non-inferiority, docs/gate.md), with arms.gate_primary = offline (or "
            "when no month's logs are read): the challenger passes when the one-sided (1 - arms.gate_alpha) "
            "lower confidence bound of its per-user metric minus the champion's, on the same users, is > "
            "-margin (absolute: 0.02 = 2 points of HR@5)."
        },
    )
    gate_guardrail_margin: float = field(
        default=0.10,
        metadata={
            "gt": 0,
            "help": "Offline guardrail (arms.gate_primary = ope): the challenger fails only when the one-sided "
            "(1 - arms.gate_alpha) upper bound of its per-user metric minus the champion's is below -margin "
            "(absolute: 0.10 = 10 points of HR@5), i.e. when it is shown worse by more than the margin; a "
            "challenger of equal HR@5 passes it with probability at least 1 - arms.gate_alpha on any number of "
            "users (docs/gate.md). It refuses a collapse, it does not decide ties.",
        },
    )
    gate_alpha: float = field(
        default=0.025,
        metadata={
            "gt": 0,
            "lt": 0.5,
            "help": "Offline gate: the one-sided level of the paired non-inferiority test, in (0, 0.5).",
        },
    )
    gate_power: float = field(
        default=0.8,
        metadata={
            "gt": 0,
            "lt": 1,
            "help": "Offline gate: the power at which the gate reports the minimum detectable difference (MDE) "
            "of the paired test beside its verdict, in (0, 1); it does not change the decision.",
        },
    )
    gate_ope_margin: float = field(
        default=0.005,
        metadata={
            "help": "Off-policy gate (non-inferiority): the challenger passes when the one-sided 97.5% lower "
            "bound (the 95% bootstrap interval's) of its CTR minus the champion's (arms.gate_ope_estimator's "
            "paired estimate) is at least -margin (absolute CTR: 0.005 = half a point; the former gate's 0.05 "
            "was 5 points). A negative value "
            "disables this check (the offline test at arms.gate_margin then decides).",
        },
    )
    gate_ope_rows: str = field(
        default="heldout",
        metadata={
            "choices": GATE_OPE_ROWS,
            "help": "Which of the month's logged rows the off-policy gate reads: heldout = every arm's rows of "
            "the held-out users (the arms.gate_holdout_fraction slice), whose impressions no LLM update then "
            "trains on, so the estimate is out of sample; all = every row of the month (the rows the "
            "challenger trained on: in-sample, optimistic).",
        },
    )
    gate_ope_estimator: str = field(
        default="sndr",
        metadata={
            "choices": GATE_OPE_ESTIMATORS,
            "help": "Off-policy gate: the estimator whose interval decides (docs/gate.md; every one is recorded): "
            "snips = SNIPS on the arm's own month logs; dm, ips, snips_all, dr, sndr, switch_dr = on every arm's "
            "month logs (each row's logged propensity as e0), the reward model cross-fitted on the logs it does "
            "not score, a bootstrap over users. Default sndr: the coverage of the true difference closest to "
            "95% in benchmarks/ope_coverage.py (0.955; dr 0.945 with a larger RMSE; docs/gate.md).",
        },
    )
    gate_ope_switch_lambda: float = field(
        default=10.0,
        metadata={
            "gt": 0,
            "help": "Off-policy gate, switch_dr: rows whose weight pi/e0 exceeds this keep only the reward model's "
            "term (Wang, Agarwal & Dudik 2017).",
        },
    )
    gate_ope_bootstrap: int = field(
        default=2000, metadata={"min": 1, "help": "Bootstrap resamples of the off-policy gate."}
    )
    gate_max_users: int = field(
        default=0,
        metadata={
            "min": 0,
            "help": "Held-out users the gate scores (seeded choice; more than there are = all of them); "
            "0 = sft.eval_max_users.",
        },
    )
    gate_users: str = field(
        default="dataset",
        metadata={
            "choices": GATE_USERS,
            "help": "Whose held-out users the offline gate scores: dataset = the configured dataset's offline "
            "construction (target x_{T+N}); warehouse = your own users, the arms.gate_holdout_fraction "
            "slice of the warehouse's interactions through the gated month (target: each one's last "
            "interaction, candidates drawn as data.eval_*), whose impressions then never enter an LLM "
            "update.",
        },
    )
    gate_holdout_fraction: float = field(
        default=0.25,
        metadata={
            "gt": 0,
            "lt": 1,
            "help": "The share of users held out of every LLM update for the gate (arms.gate_ope_rows = heldout: "
            "the off-policy half reads their rows; arms.gate_users = warehouse: the offline half scores them), "
            'by a seeded stable hash (sha256("<seed>:gate:<user>") / 2^64 < share): in (0, 1). 0.25: the smallest '
            "share whose gate met size <= 0.05 and power >= 0.8 at +1 point on the validation series "
            '(docs/gate.md "Error rates").',
        },
    )
    update_logs: str = field(
        default="all",
        metadata={
            "choices": UPDATE_LOGS,
            "help": "Whose logs an LLM arm's month update trains on: all = the month's clean impressions of "
            "every arm in arms.names (each row's e0 is the propensity its arm logged: softmax(s/tau) "
            "of an LLM arm, softmax(score/T) of a ranker; w = e_old/e0 is a real importance weight); "
            "own = only the arm's own rows (logged by the champion it starts from: w = 1). Rows whose "
            "propensity cannot be trusted (missing, <= 0, > 1, not finite, below data.min_propensity) "
            "or of an arm not in arms.names are refused, naming arm, month, impression and rule.",
        },
    )
    update_max_examples: int = field(
        default=0,
        metadata={"min": 0, "help": "Logged rows per LLM-arm update (seeded, proportional); 0 = update.max_examples."},
    )
    update_max_examples_by_arm: dict[str, int] = field(
        default_factory=dict,
        metadata={
            "help": "Per LLM arm, its rows per update instead of arms.update_max_examples (e.g. {grpo_cr: 4096}: "
            'each arm sized on the validation month, docs/loop.md "Sizing the update"); an arm not named keeps '
            "arms.update_max_examples. Keys: LLM arms of arms.names; values >= 0 (0 = update.max_examples)."
        },
    )

    update_by_arm: dict[str, dict[str, Any]] = field(
        default_factory=dict,
        metadata={
            "help": "Per LLM arm, its update budget instead of section update's (e.g. {grpo_cr: {learning_rate: "
            '1e-3, epochs: 3}}: the budget chosen on the validation series, docs/which-update.md "The budget '
            'curve"); keys of each: ' + ", ".join(UPDATE_BUDGET_KEYS) + ", each checked as the update key of that "
            "name. An arm not named trains with section update's settings."
        },
    )

    def update_settings(self, arm: str, update: Any) -> Any:
        """Section ``update`` (an UpdateConfig) as ``arm``'s monthly update trains: its entry of update_by_arm
        applied over it (the keys of UPDATE_BUDGET_KEYS), the rows cap of :meth:`update_rows` in max_examples."""
        import dataclasses

        over = dict(self.update_by_arm.get(arm, {}))
        return dataclasses.replace(update, max_examples=self.update_rows(arm, update.max_examples), **over)

    def update_rows(self, arm: str, otherwise: int) -> int:
        """The rows cap of ``arm``'s monthly update: its entry of update_max_examples_by_arm, else
        update_max_examples; 0 there means ``otherwise`` (update.max_examples). The one rule both the update
        (abpo.arms.llm) and its first step's weights (abpo.monthly.update) subsample by."""
        return self.update_max_examples_by_arm.get(arm, self.update_max_examples) or otherwise

    approval: str = field(
        default="none",
        metadata={
            "choices": APPROVAL,
            "help": "Who lets a challenger that passed the gate become champion: none = the gate alone (the month's "
            "promote step moves it); required = a human too: each such LLM arm waits at an approval task "
            "<arm>.approve of the Airflow DAG that shows the gate's numbers; Approve promotes (the history records "
            "who and when), Reject or no answer within arms.approval_timeout keeps the champion (docs/gate.md "
            '"Approval"). Read from the deployment\'s config file when the DAG is parsed; not a run override.',
        },
    )
    approval_timeout: str = field(
        default="72h",
        metadata={
            "duration": True,
            "duration_max": APPROVAL_TIMEOUT_MAX,
            "help": "arms.approval = required: how long an approval task waits for an answer, a number and a unit "
            "(s, m, h or d: 90m, 72h, 7d), > 0, at most 31d; no answer by then counts as Reject (not promoted, "
            "recorded).",
        },
    )
    gate_max_top_weight_share: float = field(
        default=0.5,
        metadata={
            "help": "Off-policy gate: the challenger fails (closed) when its largest SNIPS weights (the top "
            "arms.gate_top_weight_fraction of the arm's month rows, at least one) carry more than this "
            "share of the total weight (a few rows with impossible or tiny logged propensities decide "
            "the estimate); 1 disables."
        },
    )
    gate_top_weight_fraction: float = field(
        default=0.01,
        metadata={
            "help": "Off-policy gate: the share of rows whose weights arms.gate_max_top_weight_share caps "
            "(k = max(1, ceil(fraction * n)) largest weights)."
        },
    )
    gate_min_ess: float = field(
        default=10.0,
        metadata={
            "min": 0,
            "help": "Off-policy gate: the challenger fails (closed) when the effective sample size of its or the "
            "champion's weights on the rows the deciding estimator reads is below this (or below 2, whatever "
            "this is: one row would carry over half the weight), or when the estimate is not finite; an "
            "interval from fewer effective rows says nothing.",
        },
    )
