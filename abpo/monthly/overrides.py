"""What a run of the abpo_monthly DAG may change through its `overrides` param: the allow-list, its JSON-schema
pattern (Airflow validates a trigger's params against it), the ranges of the allowed numeric keys and the check every
task repeats. `abpo demo` checks its --set overrides against the same list before it starts anything.

Dependency-free (the DAG file imports it when it is parsed)."""

from __future__ import annotations

import math
import re

# The config keys a run's `overrides` param may set ("section.*": any key of the section): how big and how long a month's
# work is, the simulator, the report's presentation, the update's hyperparameters. Not paths.* (state, tracking URI),
# the dataset's location or format, the warehouse's settings, the data contract and audit (known_arms, min_propensity,
# max_clock_skew_seconds, max_quarantine_fraction, ingest_min_keep_fraction), policy.* (the model; only its CPU threads,
# policy.num_threads, which change how fast, not what), sft.experiment /
# output, update.deepspeed / mlflow_experiment: a trigger must not point the loop at other files, stores, models or
# rules. Nor the gate (NOT_OVERRIDABLE: its margins, alpha, power, metric, minimum ESS, users) or the report's
# sample-ratio and integrity checks (srm_alpha, arm_shares, max_user_share, assignment): whoever may trigger a run
# must not be able to switch a safety check off; those belong to the deployment's config file ($ABPO_CONFIG). (What an arm's update trains, its
# variant, logs, starting model and output, is no config at all: the update step passes it.)
OVERRIDE_ALLOWED = (
    "sim.*",
    "seed",
    "policy.num_threads",
    "arms.popularity.*",
    "arms.ml_retrain.*",
    *(
        f"arms.{k}"
        for k in ("replay_months", "min_rows_per_stratum", "update_max_examples", "update_logs", "gate_ope_bootstrap")
    ),
    *(f"report.{k}" for k in ("candidate_arm", "holdback_arm", "updated_arms", "confidence", "power")),
    *(
        f"data.{k}"
        for k in (
            "seed",
            "tie_seed",
            "min_history",
            "update_steps",
            "train_candidates",
            "eval_candidates",
            "eval_hard_negative_fraction",
            "train_hard_negative_fraction",
            "sup_examples_per_user",
            "max_users",
        )
    ),
    *(
        f"sft.{k}"
        for k in (
            "pretrain_epochs",
            "epochs",
            "max_steps",
            "learning_rate",
            "batch_size",
            "grad_accum",
            "warmup_ratio",
            "weight_decay",
            "max_grad_norm",
            "logging_steps",
            "use_lora",
            "gradient_checkpointing",
            "max_examples",
            "eval_max_users",
            "eval_generation",
        )
    ),
    *(
        f"update.{k}"
        for k in (
            "group_size",
            "delta",
            "eps_std",
            "lambda_sc",
            "w_max",
            "epsilon",
            "beta",
            "learning_rate",
            "batch_size",
            "grad_accum",
            "epochs",
            "max_steps",
            "warmup_ratio",
            "weight_decay",
            "max_grad_norm",
            "temperature",
            "top_p",
            "max_examples",
            "stratification",
            "logging_steps",
            "save_steps",
            "save_total_limit",
        )
    ),
)
# Keys a trigger may not set although their section is tunable, each with why (the refusal names it): the gate's
# settings and what switches a safety check off.
NOT_OVERRIDABLE = {
    **{
        f"arms.{k}": "a gate setting"
        for k in (
            "gate_metric",
            "gate_primary",
            "gate_margin",
            "gate_guardrail_margin",
            "gate_alpha",
            "gate_power",
            "gate_ope_margin",
            "gate_ope_rows",
            "gate_ope_estimator",
            "gate_ope_switch_lambda",
            "gate_min_ess",
            "gate_max_users",
            "gate_users",
            "gate_holdout_fraction",
        )
    },
    "arms.names": "the experiment's design (which arms run)",
    "report.srm_alpha": "the report's sample-ratio check",
    "report.arm_shares": "the report's sample-ratio check",
    "report.max_user_share": "the report's check of arms dominated by one user",
    "report.assignment": "the report's check of the users' assignment",
}
# Ranges of the allowed numeric keys: key -> (low, low included, high, high included, integer). Every numeric key a
# trigger may set has one, with a finite upper bound (a trigger must not size a month past what a machine can run:
# update.group_size=1e9 or sim.requests_per_user=1e9 were taken and failed hours later, or never finished; a seed past
# 2^32 failed at the update; tests/faults/test_bounds_faults.py walks the config for a key without one). A value outside is
# refused: a trigger may tune the update, never switch it off (update.learning_rate=0 trains nothing, so a challenger
# identical to its champion was promoted) or shrink what the gate looks at until it cannot tell versions apart
# (data.eval_candidates <= 5 makes HR@5 1 for every version; sft.eval_max_users sizes the gate's users when
# arms.gate_max_users is 0; arms.gate_ope_bootstrap the off-policy interval). Each range lies inside the config
# field's own (its metadata, checked when the config loads): this module may not import abpo (the DAG reads it at
# parse time), so the ranges are written here again, and tests/monthly/test_overrides.py holds them inside.
INF = math.inf
SEED_MAX = 2**32 - 1  # numpy's and torch's seeds (abpo.config.SEED_MAX)
BIG = 10**9  # a count beyond any month's rows, examples or steps
OVERRIDE_RANGES: dict[str, tuple[float, bool, float, bool, bool]] = {
    # seeds
    "seed": (0, True, SEED_MAX, True, True),
    "data.seed": (0, True, SEED_MAX, True, True),
    "data.tie_seed": (0, True, SEED_MAX, True, True),
    # the data's sizes
    "data.min_history": (1, True, 1000, True, True),
    "data.update_steps": (1, True, 1000, True, True),
    "data.train_candidates": (2, True, 10_000, True, True),
    "data.eval_candidates": (6, True, 10_000, True, True),
    "data.eval_hard_negative_fraction": (0, True, 1, True, False),
    "data.train_hard_negative_fraction": (0, True, 1, True, False),
    "data.sup_examples_per_user": (0, True, 10_000, True, True),
    "data.max_users": (0, True, 10**8, True, True),
    "policy.num_threads": (0, True, 1024, True, True),
    # the SFT
    "sft.learning_rate": (0, False, 1, True, False),
    "sft.epochs": (0, False, 1000, True, False),
    "sft.pretrain_epochs": (1, True, 1000, True, True),
    "sft.max_steps": (-1, True, 10**7, True, True),
    "sft.batch_size": (1, True, 65_536, True, True),
    "sft.grad_accum": (1, True, 4096, True, True),
    "sft.warmup_ratio": (0, True, 1, False, False),
    "sft.weight_decay": (0, True, 10, True, False),
    "sft.max_grad_norm": (0, False, 10**6, True, False),
    "sft.logging_steps": (1, True, 10**7, True, True),
    "sft.max_examples": (0, True, BIG, True, True),
    "sft.eval_max_users": (10, True, 10**8, True, True),
    # the update
    "update.learning_rate": (0, False, 1, True, False),
    "update.epochs": (0, False, 1000, True, False),
    "update.max_steps": (-1, True, 10**7, True, True),
    "update.batch_size": (1, True, 65_536, True, True),
    "update.grad_accum": (1, True, 4096, True, True),
    "update.group_size": (3, True, 256, True, True),
    "update.epsilon": (0, False, 10, True, False),
    "update.w_max": (0, False, 10**6, True, False),
    "update.beta": (0, True, 100, True, False),
    "update.delta": (0, False, 1, True, False),
    "update.eps_std": (0, False, 1, True, False),
    "update.lambda_sc": (0, True, 100, True, False),
    "update.temperature": (0, False, 100, True, False),
    "update.top_p": (0, False, 1, True, False),
    "update.warmup_ratio": (0, True, 1, False, False),
    "update.weight_decay": (0, True, 10, True, False),
    "update.max_grad_norm": (0, False, 10**6, True, False),
    "update.max_examples": (0, True, BIG, True, True),
    "update.save_steps": (1, True, 10**7, True, True),
    "update.save_total_limit": (0, True, 1000, True, True),
    "update.logging_steps": (1, True, 10**7, True, True),
    # the arms
    "arms.update_max_examples": (0, True, BIG, True, True),
    "arms.min_rows_per_stratum": (1, True, BIG, True, True),
    "arms.replay_months": (0, True, 1200, True, True),
    "arms.gate_ope_bootstrap": (200, True, 10**6, True, True),
    "arms.popularity.temperature": (0, False, 10**6, True, False),
    "arms.popularity.window": (0, True, 1200, True, True),
    "arms.ml_retrain.temperature": (0, False, 10**6, True, False),
    "arms.ml_retrain.iterations": (1, True, 10_000, True, True),
    # the report
    "report.confidence": (0.5, False, 1, False, False),
    "report.power": (0, False, 1, False, False),
    # the simulator
    "sim.window": (1, True, 1000, True, True),
    "sim.requests_per_user": (1, True, 1000, True, True),
    "sim.replicate": (0, True, 1000, True, True),
    "sim.candidate_count": (2, True, 10_000, True, True),
    "sim.retrieval_fraction": (0, True, 1, True, False),
    "sim.popular_fraction": (0, True, 1, True, False),
    "sim.retrieval_window": (1, True, 10_000, True, True),
    "sim.retrieval_recent": (1, True, 10_000, True, True),
    "sim.base_ctr": (0, True, 1, False, False),
    "sim.preference_slope": (-100, True, 100, True, False),
    "sim.oracle_factors": (1, True, 4096, True, True),
    "sim.oracle_iterations": (1, True, 10_000, True, True),
    "sim.oracle_regularization": (0, True, 10**6, True, False),
    "sim.oracle_knn_window": (1, True, 10_000, True, True),
    "sim.oracle_knn_recent": (1, True, 10_000, True, True),
    "sim.oracle_markov_order": (1, True, 100, True, True),
    "sim.oracle_markov_smoothing": (0, False, 10**6, True, False),
    "sim.oracle_reference_users": (0, True, 10**8, True, True),
    "sim.replay_horizon": (1, True, 10_000, True, True),
    "sim.replay_decay": (0, False, 1, True, False),
    "sim.replay_strength": (0, True, 100, True, False),
    "sim.replay_popularity_exponent": (0, True, 4, True, False),
    "sim.click_next": (0, True, 1, True, False),
    "sim.click_soon": (0, True, 1, True, False),
    "sim.soon_horizon": (0, True, 10_000, True, True),
}
# the same list as a JSON-schema pattern of one override (Airflow validates params against it when a run is triggered);
# "section.*" also covers the keys of a block inside the section (arms.popularity.temperature)
OVERRIDE_PATTERN = (
    "^(?:"
    + "|".join(k.replace(".", "\\.").replace("\\.*", "\\.[a-z_0-9]+(?:\\.[a-z_0-9]+)*") for k in OVERRIDE_ALLOWED)
    + ")=.*$"
)


def _range_text(key: str) -> str:
    lo, lo_in, hi, hi_in, integer = OVERRIDE_RANGES[key]
    kind = "an integer" if integer else "a finite number"
    low = f"{'>=' if lo_in else '>'} {lo:g}"
    return f"{kind} {low}" + (f" and {'<=' if hi_in else '<'} {hi:g}" if hi != INF else "")


def check_range(key: str, value: str) -> None:
    """ValueError naming ``key=value`` and its range (:data:`OVERRIDE_RANGES`) when the value is outside it, not a
    number or not finite; nothing for a key without a range."""
    if key not in OVERRIDE_RANGES:
        return
    lo, lo_in, hi, hi_in, integer = OVERRIDE_RANGES[key]
    text = value.strip()
    try:
        x = float(text)
        ok = math.isfinite(x) and (x >= lo if lo_in else x > lo) and (x <= hi if hi_in else x < hi)
        if integer:
            ok = ok and re.fullmatch(r"[+-]?[0-9]+", text) is not None
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"overrides item {f'{key}={value}'!r}: rule: {key} must be {_range_text(key)} (a run may tune it, "
            "never switch a step or a check off)"
        )


def check_overrides(overrides) -> list[str]:
    """The `overrides` param when every item is ``key=value`` with a key in OVERRIDE_ALLOWED (not in NOT_OVERRIDABLE)
    and, for a key with a range (OVERRIDE_RANGES), a value inside it; ValueError naming the first item that is not,
    and the rule."""
    if not isinstance(overrides, (list, tuple)):
        raise ValueError(f'overrides {overrides!r}: rule: a list of "key=value" strings')
    for item in overrides:
        key = item.split("=", 1)[0].strip() if isinstance(item, str) else ""
        kept = next((k for k in NOT_OVERRIDABLE if key == k or key.startswith(k + ".")), None)
        if kept is not None:
            raise ValueError(
                f"overrides item {item!r}: rule: {key} is {NOT_OVERRIDABLE[kept]}, not a run-time "
                "override (a trigger must not loosen or switch off a safety check); set it in the "
                "deployment's config file ($ABPO_CONFIG)"
            )
        if not isinstance(item, str) or not re.fullmatch(OVERRIDE_PATTERN, item, flags=re.DOTALL):
            raise ValueError(
                f"overrides item {item!r}: rule: key=value with a key in {', '.join(OVERRIDE_ALLOWED)} "
                "(section.* = any key of that section)"
            )
        check_range(key, item.split("=", 1)[1])
    return list(overrides)
