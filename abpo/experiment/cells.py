"""Cells: a cell's fingerprint (what its result depends on) and its files: content-addressed in
<root>/experiments/_cells/<fingerprint>.json with a copy under <exp>/cells/, so neither a rerun nor another
experiment or probe with the same settings recomputes one; and what a GRPO control row changes in section update,
read from the ABPO cell of its seed and round."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.experiment.regime_settings import regime_settings, without_added_defaults
from abpo.experiment.rows import FULL_INFO, is_llm_row, measured_gamma_ratio, row_key
from abpo.experiment.seeds import digest, experiments_root

if TYPE_CHECKING:
    from abpo.config import Config

# The run inputs section `update` held until they became arguments (abpo.train.runs.UpdateRun), with the values
# every preset gave them. A cell's update never read them (its row and round set them), but they were part of the
# digested section: putting them back keeps the fingerprints, and so every cached cell, of before the change.
RETIRED_UPDATE_KEYS: dict[str, Any] = {
    "variant": "abpo",
    "months": [],
    "arm": "abpo",
    "init_model": "",
    "output_name": "",
}

# Keys added to section `update` after cells were cached, with their default (= the behaviour before they existed):
# at that default a key is left out of the digest, so cached cells keep their fingerprints; any other value enters it.
# The same for section `sft`.
ADDED_SFT_KEYS: dict[str, Any] = {"item_init": "random"}
ADDED_UPDATE_KEYS: dict[str, Any] = {
    "self_certainty_positions": "choice",
    "greedy_rollouts": False,
    "processes": 1,
    # the terms beside the paper's (docs/update-variants.md)
    "no_response_weight": 1.0,
    "no_response_weight_rule": "fixed",
    "click_weight": 1.0,
    "surrogate_weight": 1.0,
    "likelihood_weight": 0.0,
    "offpolicy_weight": 0.0,
    "offpolicy_gamma": 0.1,
}


# Keys of section `update` that change no result (where checkpoints go, how often they and the metrics are written):
# digested at the value every CPU preset held when cells were first cached, whatever the config says, so that a
# checkpoint interval tuned for speed (configs/demo.yaml's save_steps 100) keeps every cached
# cell (abpo.train.update.resume_key leaves the same keys out of what a resume compares).
RESULT_FREE_UPDATE_KEYS: dict[str, Any] = {"save_steps": 20, "save_total_limit": 2, "logging_steps": 1}


def cell_fingerprint(cfg: Config, row: str, seed: int | None = None, r: int | None = None) -> str:
    """What a cell's result depends on: the data, policy and SFT settings (pi_init and the candidates), the seed,
    the round and the number of rounds, the update settings (variants that update), full_info's learning rate, the
    experiment's evaluation settings, the logging regime where it is not the default
    (abpo.experiment.regime_settings.regime_settings) and, for grpo_lr, the ABPO cell its learning rate is measured in."""
    e = cfg.experiment
    d: dict[str, Any] = {k: dataclasses.asdict(getattr(cfg, k)) for k in ("data", "policy", "sft")}
    d["sft"] = without_added_defaults(d["sft"], ADDED_SFT_KEYS)
    d.update(row=row, seed=None if seed is None else int(seed), round=r, rounds=e.rounds)
    updates = is_llm_row(row) and row != FULL_INFO and row_key(row) != "none"
    upd = without_added_defaults(dataclasses.asdict(cfg.update), ADDED_UPDATE_KEYS) | RESULT_FREE_UPDATE_KEYS
    d["update"] = {**upd, **RETIRED_UPDATE_KEYS} if updates else None
    keys = ["eval_split", "validation_fraction", "max_eval_users", "month"]
    keys += ["update_max_examples"] if updates else []
    keys += ["full_info_learning_rate"] if row == FULL_INFO else []
    keys += ["ml_retrain_epochs"] if row == "ml_retrain" else []
    ed = dataclasses.asdict(e)
    d["experiment"] = {k: ed[k] for k in keys}
    regime = regime_settings(cfg)
    if regime:  # only away from the default regime: the cells of before keep their fingerprints
        d["regime"] = regime
    if row == "grpo_lr":
        d["gamma_ratio_of"] = cell_fingerprint(cfg, "abpo", seed, r)
    return digest(d)


def experiment_dir(cfg: Config) -> Path:
    return experiments_root(cfg) / cfg.experiment.name


def _cell_path(exp_dir: Path, seed: int, row: str, r: int = 1, rounds: int = 1) -> Path:
    suffix = "" if rounds == 1 else f"-r{r}of{rounds}"
    return exp_dir / "cells" / f"seed{seed}-{row}{suffix}.json"


def _cache_path(cfg: Config, fingerprint: str) -> Path:
    return experiments_root(cfg) / "_cells" / f"{fingerprint}.json"


def _load_cell(path: Path, fingerprint: str) -> dict | None:
    if not path.exists():
        return None
    cell = json.loads(path.read_text())
    return cell if cell.get("fingerprint") == fingerprint else None


def find_cell(cfg: Config, exp_dir: Path, seed: int, row: str, r: int) -> dict | None:
    """A finished cell with these settings: the experiment's own copy, or one any experiment or probe computed."""
    fp = cell_fingerprint(cfg, row, seed, r)
    cell = _load_cell(_cell_path(exp_dir, seed, row, r, cfg.experiment.rounds), fp)
    if cell is None:
        cell = _load_cell(_cache_path(cfg, fp), fp)
        if cell is not None:
            _save_json(_cell_path(exp_dir, seed, row, r, cfg.experiment.rounds), cell)
    return cell


def _save_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # two experiments may finish the same shared cell
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)


def save_cell(cfg: Config, exp_dir: Path, cell: dict) -> None:
    _save_json(_cache_path(cfg, cell["fingerprint"]), cell)
    _save_json(_cell_path(exp_dir, cell["seed"], cell["row"], cell["round"], cfg.experiment.rounds), cell)


def row_update_changes(cfg: Config, exp_dir: Path, seed: int, row: str, r: int) -> dict[str, Any]:
    """Section update's fields a GRPO control changes: grpo_g1 samples G-1 rollouts (update.grpo_equal_samples);
    grpo_lr trains at update.learning_rate x measured_gamma_ratio of the ABPO cell of (seed, round r)."""
    if row == "grpo_g1":
        return {"grpo_equal_samples": True}
    if row == "grpo_lr":
        ratio = measured_gamma_ratio(find_cell(cfg, exp_dir, seed, "abpo", r), f"seed {seed}, round {r}")
        return {"learning_rate": cfg.update.learning_rate * ratio}
    return {}
