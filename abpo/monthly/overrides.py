"""What a run of the abpo_monthly DAG may change through its `overrides` param: the allow-list, its JSON-schema
pattern (Airflow validates a trigger's params against it) and the check every task repeats. `abpo demo` checks its
--set overrides against the same list before it starts anything.

Dependency-free (the DAG file imports it when it is parsed)."""

from __future__ import annotations

import re

# The config keys a run's `overrides` param may set ("section.*": any key of the section): how big and how long a month's
# work is, the gate, the simulator, the report. Not paths.* (state, tracking URI), the dataset's location or format,
# the warehouse's settings, the data contract and audit (known_arms, min_propensity, max_clock_skew_seconds,
# max_quarantine_fraction, ingest_min_keep_fraction), policy.* (the model), sft.experiment / output, update.deepspeed /
# mlflow_experiment: a trigger must not point the loop at other files, stores, models or rules. (What an arm's update
# trains, its variant, logs, starting model and output, is no config at all: the update step passes it.)
OVERRIDE_ALLOWED = (
    "arms.*", "sim.*", "report.*", "seed",
    *(f"data.{k}" for k in ("seed", "tie_seed", "min_history", "update_steps", "train_candidates", "eval_candidates",
                            "eval_hard_negative_fraction", "train_hard_negative_fraction", "sup_examples_per_user",
                            "max_users")),
    *(f"sft.{k}" for k in ("epochs", "max_steps", "learning_rate", "batch_size", "grad_accum", "warmup_ratio",
                           "weight_decay", "max_grad_norm", "logging_steps", "use_lora", "gradient_checkpointing",
                           "max_examples", "eval_max_users", "eval_generation")),
    *(f"update.{k}" for k in ("group_size", "delta", "eps_std", "lambda_sc", "w_max", "epsilon", "beta",
                              "learning_rate", "batch_size", "grad_accum", "epochs", "max_steps", "warmup_ratio",
                              "weight_decay", "max_grad_norm", "temperature", "top_p", "max_examples",
                              "stratification", "logging_steps", "save_steps", "save_total_limit")),
)
# the same list as a JSON-schema pattern of one override (Airflow validates params against it when a run is triggered);
# "section.*" also covers the keys of a block inside the section (arms.popularity.temperature)
OVERRIDE_PATTERN = "^(?:" + "|".join(k.replace(".", "\\.").replace("\\.*", "\\.[a-z_0-9]+(?:\\.[a-z_0-9]+)*")
                                     for k in OVERRIDE_ALLOWED) + ")=.*$"


def check_overrides(overrides) -> list[str]:
    """The `overrides` param when every item is ``key=value`` with a key in OVERRIDE_ALLOWED; ValueError naming the
    first item that is not, and the allowed keys."""
    if not isinstance(overrides, (list, tuple)):
        raise ValueError(f"overrides {overrides!r}: rule: a list of \"key=value\" strings")
    for item in overrides:
        if not isinstance(item, str) or not re.fullmatch(OVERRIDE_PATTERN, item, flags=re.DOTALL):
            raise ValueError(f"overrides item {item!r}: rule: key=value with a key in {', '.join(OVERRIDE_ALLOWED)} "
                             "(section.* = any key of that section)")
    return list(overrides)
