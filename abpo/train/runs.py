"""What one update trains (`UpdateRun`) and what it returns (`UpdateResult`, also read back from the update.json a
launched update wrote), and the rollout-signal summary of its per-step history."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from abpo.errors import ExpectedError
from abpo.months import Month


@dataclass(frozen=True)
class UpdateRun:
    """What one update trains: the inputs of a single call. They differ between calls that share one config (each
    month updates every LLM arm from its own champion on its own logs; an experiment trains every row of every
    round), so they are arguments of :func:`run_update`, never settings of section ``update``."""

    variant: str = "abpo"  # docs/ABPO_SPEC.md variant, letter or name (abpo.algo.variants.get_variant)
    arm: str = "abpo"  # only impressions this arm served enter the update (their e0 is its); "" = every arm's
    months: tuple[Month, ...] = ()  # the months whose impressions form D_bandit; () = every month ingested
    init_model: Path | None = None  # pi_init / the starting checkpoint; None = the output of `abpo sft`
    output: Path | None = None  # under paths.models unless absolute; None = update-<letter>-<months>-seed<seed>

    def __post_init__(self) -> None:
        # a bad month stops here, before a model is loaded, and the months are Month values from here on
        object.__setattr__(self, "months", tuple(Month(m, "update month") for m in self.months))


class UpdateInputMissing(ExpectedError, RuntimeError):
    """An input of the update (pi_init, the bandit log in the warehouse) does not exist yet; the message names the
    command that makes it."""


@dataclass
class UpdateResult:
    variant: str
    output_dir: Path
    adapter_dir: Path | None
    model_dir: Path  # what to serve/evaluate next: the merged model (or pi_init for variant A)
    checkpoint_dir: Path | None  # the last checkpoint written (resume point)
    init_model_dir: Path
    mlflow_run_id: str | None
    global_step: int
    resumed_from: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # the last step's logged metrics
    batching: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)  # every step's logged metrics


def read_update_json(path: Path) -> UpdateResult:
    """The UpdateResult an update wrote to ``path`` (its update.json): what a launch of several processes returns
    to the process that started it (abpo.monthly.update.launch_refresh)."""
    raw = json.loads(Path(path).read_text())
    for k in ("output_dir", "adapter_dir", "model_dir", "checkpoint_dir", "init_model_dir"):
        raw[k] = Path(raw[k]) if raw.get(k) is not None else None
    known = {f.name for f in dataclasses.fields(UpdateResult)}
    return UpdateResult(**{k: v for k, v in raw.items() if k in known})


# ------------------------------------------------------------------------------------------- rollout signal

#: Per-step metrics whose mean over an update says whether its rollouts carried a learning signal.
SIGNAL_KEYS = {
    "format_reward": "rewards/format_reward/mean",
    "match_rate_positive": "abpo/match_rate/positive",
    "match_rate_no_response": "abpo/match_rate/no_response",
    "frac_reward_zero_std": "frac_reward_zero_std",
}


def rollout_signal(history: list[dict[str, float]]) -> dict[str, float]:
    """Means over the update's steps of the rollout-signal metrics (SIGNAL_KEYS; a metric absent at a step, e.g.
    the positive match rate of a batch without clicks, is averaged over the steps that have it)."""
    out = {}
    for name, key in SIGNAL_KEYS.items():
        vals = [h[key] for h in history if key in h and math.isfinite(h[key])]
        if vals:
            out[name] = sum(vals) / len(vals)
    return out
