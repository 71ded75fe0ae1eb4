"""The pipeline's configuration: one YAML file (configs/<preset>.yaml) mapped onto typed sections.

This package is the bottom of abpo's layers above abpo.data (every package's functions take ``cfg: Config``). One
module per section, each a dataclass whose fields carry a default and a help text (and any allowed range or choices)
in their ``metadata``: abpo.config.{paths,data,policy (policy, sft),update,report,experiment,sim,arms,sasrec}. This module
composes them into :class:`Config` and loads it (:func:`load_config`: YAML, merged with the files it extends by
abpo.config.extends, then the environment, then ``--set a.b=v`` overrides; :func:`explain` says where each value came
from); abpo.config.values checks every value against its field as it is read (unknown keys are an error that names
the file and the key); abpo.config.validate checks the rules between keys once everything is applied; ConfigError is
abpo.config.errors'.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import abpo
from abpo.config.arms import ArmsConfig
from abpo.config.data import DataConfig
from abpo.config.errors import ConfigError
from abpo.config.experiment import ExperimentConfig
from abpo.config.extends import DEFAULT, resolve
from abpo.config.paths import PathsConfig
from abpo.config.policy import PolicyConfig, SFTConfig
from abpo.config.report import ReportConfig
from abpo.config.sasrec import SASRecConfig
from abpo.config.sim import SimConfig
from abpo.config.update import UpdateConfig
from abpo.config.validate import validate
from abpo.config.values import build, range_rule, set_key
from abpo.paths import CONFIG_DIR

__all__ = ["Config", "describe", "explain", "load_config", "preset_path", "sources"]


# Environment variables a deployment sets instead of editing YAML (precedence: YAML < env < --set).
ENV_OVERRIDES = {
    "ABPO_STATE": "paths.root",
    "ABPO_TRACKING_URI": "paths.mlflow_tracking_uri",
    "ABPO_NAMESPACE": "paths.namespace",
}
# MLFLOW_TRACKING_URI, MLflow's own variable, is honoured too, below $ABPO_TRACKING_URI: the value the user exported,
# read once when abpo was first imported (abpo.USER_MLFLOW_TRACKING_URI), never the variable as it is now, because
# mlflow.set_tracking_uri writes it itself (so a later read would see abpo's own last choice, leaking between runs).


SEED_MAX = 2**32 - 1  # numpy's and torch's seeds (the update seeds both from it): a larger one fails there


@dataclass
class Config:
    """The whole pipeline's configuration. Load with :func:`load_config`."""

    name: str = "tiny"
    seed: int = field(default=0, metadata={"min": 0, "max": SEED_MAX})
    paths: PathsConfig = field(default_factory=PathsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    update: UpdateConfig = field(default_factory=UpdateConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    arms: ArmsConfig = field(default_factory=ArmsConfig)
    sasrec: SASRecConfig = field(default_factory=SASRecConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def preset_path(name_or_path: str | Path) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    return CONFIG_DIR / f"{name_or_path}.yaml"


def load_config(name_or_path: str | Path = "tiny", overrides: list[str] | None = None) -> Config:
    """Load a preset name (``tiny``, ``gpu``, ...) or a YAML path merged with every file it extends
    (``extends:``, abpo.config.extends), then the environment (:data:`ENV_OVERRIDES`), then ``key.sub=value``
    overrides; the rules between keys are checked on the result. :func:`sources` says where each value came from."""
    path = preset_path(name_or_path)
    if not path.exists():
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        raise ConfigError(f"{path}: config not found (presets: {known})")
    raw, origin = resolve(Config, path)
    cfg = build(Config, raw, str(path))
    tracking_from = f"{origin.get('paths.mlflow_tracking_uri', path)} paths.mlflow_tracking_uri"
    if abpo.USER_MLFLOW_TRACKING_URI:
        cfg.paths.mlflow_tracking_uri, tracking_from = abpo.USER_MLFLOW_TRACKING_URI, "$MLFLOW_TRACKING_URI"
        origin["paths.mlflow_tracking_uri"] = "$MLFLOW_TRACKING_URI"
    for env, key in ENV_OVERRIDES.items():
        if os.environ.get(env):
            set_key(cfg, key, os.environ[env], f"${env}", parse=False)  # a path or a name: taken as it is
            tracking_from = f"${env}" if key == "paths.mlflow_tracking_uri" else tracking_from
            origin[key] = f"${env}"
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key.sub=value")
        key, value = item.split("=", 1)
        key = key.strip()
        set_key(cfg, key, value, "--set")
        tracking_from = "--set paths.mlflow_tracking_uri" if key == "paths.mlflow_tracking_uri" else tracking_from
        for k in [k for k in origin if k.startswith(key + ".")]:  # a whole section set
            del origin[k]
        origin[key] = "--set"
    validate(cfg)
    object.__setattr__(cfg.paths, "_tracking_uri_from", tracking_from)  # not a field: not in to_dict / config_hash
    object.__setattr__(cfg, "_sources", origin)  # nor this
    return cfg


def sources(cfg: Config) -> dict[str, str]:
    """Where each key of ``cfg`` (dotted) that is not at its default came from: the preset or file that set it
    (``configs/demo.yaml``), ``$ABPO_STATE`` (an :data:`ENV_OVERRIDES` variable or ``$MLFLOW_TRACKING_URI``) or
    ``--set``, as :func:`load_config` applied them; {} for a config built otherwise."""
    return dict(getattr(cfg, "_sources", {}))


def explain(cfg: Config) -> list[tuple[str, Any, str, Any, str]]:
    """(dotted key, resolved value, source, default, help) for every field of ``cfg``, for `abpo config --explain`:
    the source is ``default`` or where :func:`sources` says the value came from."""
    given = sources(cfg)
    rows = []
    for key, default, help_text in describe(Config):
        value: Any = cfg
        for part in key.split("."):
            value = getattr(value, part)
        source = next((given[k] for k in (key, *_parents(key)) if k in given), DEFAULT)
        rows.append((key, value, source, default, help_text))
    return rows


def _parents(key: str) -> list[str]:
    parts = key.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def describe(cls: Any, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(dotted key, default, help) for every field, for `abpo config --explain`."""
    rows = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            rows.extend(describe(tp, key + "."))
        else:
            factory = f.default_factory
            default = f.default if f.default is not dataclasses.MISSING else factory() if callable(factory) else None
            rule = range_rule(f.metadata)
            rows.append((key, default, f.metadata.get("help", "") + (f" Allowed: {rule}." if rule else "")))
    return rows
