"""The experiment's logging regimes as settings: the regime keys' defaults and check (their choices:
abpo.config.experiment), the settings a cell's fingerprint digests, the line naming a regime under every table and the named regime presets
of configs/regimes.yaml. Pure: it imports nothing of abpo.experiment (the logs themselves: abpo.experiment.regimes).
Config keys ``experiment.logger``, ``experiment.foreign_logger``, ``experiment.foreign_temperature``,
``experiment.clicks``, ``experiment.log_candidates`` and ``experiment.log_candidate_count``; their defaults are the
one regime the experiment had before (on_policy, next_item, offline), which keeps its code path (abpo.policy.bandit)
and its cells' fingerprints.

    logger      on_policy  round r is logged by the row's round r-1 policy (pi_init in round 1)
                pi_init    every round by pi_init (the paper's literal e0, stale from round 2)
                foreign    by a ranker (experiment.foreign_logger: ml_retrain | popularity) exposing
                           softmax(score / T) over C (T: experiment.foreign_temperature, else
                           arms.<ranker>.temperature);
                           fitted on every user's x_{1:T} and the real items of the earlier windows (the interactions
                           to date the production loop refits its rankers on)
                uniform    uniform over C: e0 = 1 / |C|
                mixed      each request's logger drawn by report.arm_shares: an LLM arm's share (abpo, grpo) is the
                           row's current policy, a ranker arm's share the ranker (as foreign)
    clicks      next_item  y = 1 iff a_log = x_{t'+1}
                simulator  y ~ Bernoulli(P(click | a_log)) of the production loop's click model
                           (abpo.sim.simulator.click_probabilities: preference oracle + next/soon boosts), seeded
    log_candidates offline C_{t'} of data.train_candidates with data.train_hard_negative_fraction hard negatives
                paper      M = experiment.log_candidate_count uniform random unseen distractors; x_{t'+1} in C
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.config.experiment import CLICKS, FOREIGN, LOG_CANDIDATES, LOGGERS
from abpo.yamlfile import read_yaml

if TYPE_CHECKING:
    from abpo.config import Config

DEFAULTS = {"logger": "on_policy", "clicks": "next_item", "log_candidates": "offline"}
LOGGING_ARM = "logging_arm"
# what the column logging_arm holds: pi_init, the row's own updated policy, a ranker, or uniform exploration
LOGGING_ARMS = ("pi_init", "policy", "popularity", "ml_retrain", "uniform")
CLICK_STREAM, EXPOSE_STREAM, MIX_STREAM = 11, 12, 13
# Keys added to section `sim` after cells were cached, with their default (= the behaviour before they existed): at
# that default a key is left out of a regime's digest, so cached cells keep their fingerprints
ADDED_SIM_KEYS: dict[str, Any] = {
    "replicate": 0,  # abpo loop-experiment: replicate 0 is the cells of before
    "replay_horizon": 10,  # the replay truth's settings: read only under sim.oracle = replay
    "replay_decay": 0.7,
    "replay_strength": 5.0,
    "replay_popularity_exponent": 0.0,
}
# Keys added to a foreign ranker arm's section after cells were cached, with their default, per arm (as ADDED_SIM_KEYS)
ADDED_ARM_KEYS: dict[str, dict[str, Any]] = {
    "ml_retrain": {"kind": "als"},  # kind sasrec (SASRec-CE) beside ALS, the ranker of before
}


def without_added_defaults(section: dict[str, Any], added: dict[str, Any]) -> dict[str, Any]:
    """``section`` without the keys of ``added`` that hold the default they were added with: what a cell's fingerprint
    digests, so that adding a key to a digested section keeps every cached cell's fingerprint (ADDED_SIM_KEYS here,
    abpo.experiment.cells.ADDED_UPDATE_KEYS)."""
    return {k: v for k, v in section.items() if not (k in added and v == added[k])}


def check_regime(e) -> None:
    """The regime keys of section experiment ``e`` are known values (each error names the key and the rule)."""
    for key, options in (
        ("logger", LOGGERS),
        ("foreign_logger", FOREIGN),
        ("clicks", CLICKS),
        ("log_candidates", LOG_CANDIDATES),
    ):
        if getattr(e, key) not in options:
            raise ValueError(f"experiment.{key}={getattr(e, key)!r}; rule: one of {' | '.join(options)}")
    if e.foreign_temperature < 0:
        raise ValueError(
            f"experiment.foreign_temperature={e.foreign_temperature}; rule: 0 (arms.<ranker>.temperature) or > 0"
        )
    if e.log_candidate_count < 2:
        raise ValueError(f"experiment.log_candidate_count={e.log_candidate_count}; rule: at least 2")


def regime_settings(cfg: Config) -> dict[str, Any]:
    """The regime's settings that differ from today's default, with what they bring along (the ranker and its
    temperature, the click model's sim settings, the candidate count). Empty for the default regime: a cell's
    fingerprint adds this dict only when it is not empty, so the cells of before stay found."""
    e = cfg.experiment
    out: dict[str, Any] = {}
    if e.logger != DEFAULTS["logger"]:
        out["logger"] = e.logger
        if e.logger in ("foreign", "mixed"):
            out["foreign_temperature"] = e.foreign_temperature
            out["arms"] = {
                n: without_added_defaults(dataclasses.asdict(getattr(cfg.arms, n)), ADDED_ARM_KEYS.get(n, {}))
                for n in FOREIGN
            }
        if e.logger == "foreign":
            out["foreign_logger"] = e.foreign_logger
        if e.logger == "mixed":
            out["arm_shares"] = dict(cfg.report.arm_shares)
    if e.clicks != DEFAULTS["clicks"]:
        out["clicks"] = e.clicks
        out["sim"] = without_added_defaults(dataclasses.asdict(cfg.sim), ADDED_SIM_KEYS)
    if e.log_candidates != DEFAULTS["log_candidates"]:
        out["log_candidates"] = e.log_candidates
        out["log_candidate_count"] = e.log_candidate_count
    return out


def describe(cfg: Config) -> str:
    """One line naming the regime of the logs, for every table's note."""
    e = cfg.experiment
    logger = {
        "on_policy": "on-policy (each row's previous-round policy)",
        "pi_init": "pi_init every round",
        "uniform": "uniform over C",
        "mixed": f"mixed by report.arm_shares {dict(cfg.report.arm_shares)}",
        "foreign": f"foreign {e.foreign_logger} softmax(score/T)",
    }[e.logger]
    cands = (
        f"offline (M = {cfg.data.train_candidates}, hard-negative fraction {cfg.data.train_hard_negative_fraction})"
        if e.log_candidates == "offline"
        else f"paper (M = {e.log_candidate_count}, uniform unseen distractors)"
    )
    clicks = (
        "next item (y = 1 iff a_log = x_{t'+1})"
        if e.clicks == "next_item"
        else f"simulator (sim click model, base CTR {cfg.sim.base_ctr})"
    )
    return f"Logs: logger {logger}; candidates {cands}; clicks {clicks}."


def is_default(cfg: Config) -> bool:
    return not regime_settings(cfg)


def shared_kind(cfg: Config) -> str:
    """The row-independent logger whose logs a seed shares: the regime's logger if it does not depend on the row,
    else pi_init (round 1 of on_policy, and the baselines' training clicks)."""
    lg = cfg.experiment.logger
    return lg if lg in ("pi_init", "foreign", "uniform") else "pi_init"


def regime_overrides(name: str, path: Path) -> list[str]:
    """The ``--set`` overrides of a named regime preset (``--regime NAME``): the mapping NAME -> {key: value} of
    the YAML file ``path`` (configs/regimes.yaml), each key under section experiment unless it names a section."""
    raw = read_yaml(path) or {}  # a regime or a key given twice is refused (YAMLFileError, a ValueError)
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise ValueError(f"{path}: rule: a mapping of regime name -> mapping of key: value")
    if name not in raw:
        raise ValueError(f"--regime {name!r}: not in {path}; rule: one of {', '.join(sorted(raw))}")
    out = []
    for k, v in raw[name].items():
        key = k if "." in k else f"experiment.{k}"
        out.append(f"{key}={','.join(map(str, v)) if isinstance(v, list) else v}")
    return out
