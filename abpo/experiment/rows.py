"""The experiment's rows (abpo.experiment.runner): their names and labels, the variant each trains with, the
GRPO controls' measured learning-rate ratio, and the experiment's config (its settings applied and checked)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from abpo.config.errors import ConfigError
from abpo.config.validate import check_rounds_fit
from abpo.experiment.regime_settings import check_regime

if TYPE_CHECKING:
    from abpo.config import Config

BASELINES = ("popularity", "ml_retrain")
FULL_INFO = "full_info"
# controls of vanilla GRPO: G-1 sampled rollouts like the anchored variants (update.grpo_equal_samples),
# and GRPO at update.learning_rate x the mean gamma ratio measured in the ABPO (F) cell of the same seed and round
CONTROLS = {"grpo_g1": "grpo", "grpo_lr": "grpo"}
GAMMA_RATIO = "abpo/gamma_ratio"


def row_key(row: str) -> str:
    """A row's canonical name: a variant's config name (none, grpo, ..., abpo), full_info or a baseline name."""
    from abpo.algo.variants import get_variant

    if row in BASELINES or row == FULL_INFO or row in CONTROLS:
        return row
    try:
        return get_variant(row).name
    except ValueError:
        raise ConfigError(
            f"experiment.rows: {row!r}; rule: a variant (A-L or none, grpo, anchor, anchor_snips, anchor_sc, abpo, "
            "grpo_cr, abpo_cr, abpo_ll, wll, abpo_offpolicy, grpo_ll), "
            f"{FULL_INFO}, a GRPO control ({', '.join(CONTROLS)}) or a baseline ({', '.join(BASELINES)})"
        ) from None


def row_label(row: str) -> str:
    """How a row is named in the table (the paper's)."""
    from abpo.algo.variants import get_variant

    if row == "popularity":
        return "Popularity"
    if row == "ml_retrain":
        return "ML-retrain"
    if row == FULL_INFO:
        return "Full-information (upper ref.)"
    if row == "grpo_g1":
        return "(B) Vanilla GRPO, G-1 rollouts"
    if row == "grpo_lr":
        return "(B) Vanilla GRPO, lr x gamma ratio of F"
    v = get_variant(row)
    names = {"A": "No-Update", "B": "Vanilla GRPO", "F": "ABPO"}
    return f"({v.letter}) {names.get(v.letter, v.description)}"


def variant_of(row: str) -> str:
    """The update variant a row trains with (a control of GRPO is vanilla GRPO, abpo.algo.variants)."""
    return CONTROLS.get(row, row)


def is_llm_row(row: str) -> bool:
    """Rows whose policy is the LLM (a variant or full_info): they go through rounds; baselines are fitted once."""
    return row not in BASELINES


def experiment_config(cfg: Config) -> Config:
    """The config an experiment runs with: ``experiment.update_steps`` and ``experiment.eval_candidates`` applied as
    data.update_steps and data.eval_candidates, and the
    experiment's settings checked (each error names the key and the rule)."""
    e = cfg.experiment
    if e.update_steps < 0:
        raise ValueError(f"experiment.update_steps={e.update_steps}; rule: 0 (keep data.update_steps) or >= 1")
    if e.update_steps:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, update_steps=e.update_steps))
    if e.rounds < 1:
        raise ValueError(f"experiment.rounds={e.rounds}; rule: at least 1")
    check_rounds_fit(e, cfg.data.update_steps)
    if e.eval_candidates < 0:
        raise ValueError(f"experiment.eval_candidates={e.eval_candidates}; rule: 0 (keep data.eval_candidates) or >= 2")
    if e.bootstrap_samples < 1:
        raise ValueError(f"experiment.bootstrap_samples={e.bootstrap_samples}; rule: at least 1")
    if e.eval_candidates:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, eval_candidates=e.eval_candidates))
    check_regime(e)
    return cfg


def measured_gamma_ratio(abpo_cell: Mapping | None, where: str) -> float:
    """The mean over update steps of the per-step metric ``abpo/gamma_ratio`` in an ABPO (F) cell's update history
    (the trainer's logged metrics); an error naming ``where`` if the cell or the metric is missing."""
    hist = [] if abpo_cell is None else abpo_cell.get("update", {}).get("history", [])
    vals = [float(h[GAMMA_RATIO]) for h in hist if GAMMA_RATIO in h and math.isfinite(float(h[GAMMA_RATIO]))]
    if not vals:
        state = "no ABPO (F) cell" if abpo_cell is None else f"no {GAMMA_RATIO} in its update history"
        raise ValueError(
            f"experiment.rows grpo_lr ({where}): {state}; rule: the learning rate is update.learning_rate "
            f"x the mean {GAMMA_RATIO} measured in the ABPO cell of the same seed and round: run row "
            "abpo (F) first with the same settings (or add it to experiment.rows)"
        )
    return float(np.mean(vals))
