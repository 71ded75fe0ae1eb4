"""The pipeline's configuration: one YAML file (configs/<preset>.yaml) mapped onto typed sections.

Each section is a dataclass owned by the module that uses it (every field has a default and a help
text in its ``metadata``); this file only composes them, loads YAML, and applies ``--set a.b=v``
overrides. Unknown keys are an error that names the file and the key.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import abpo
from abpo.abtest.config import ReportConfig
from abpo.arms.config import ArmsConfig
from abpo.data.config import DataConfig
from abpo.data.storage import is_uri
from abpo.experiment.config import ExperimentConfig
from abpo.paths import CONFIG_DIR, REPO_ROOT, base_dir, namespaced
from abpo.policy.config import PolicyConfig, SFTConfig
from abpo.sim.config import SimConfig
from abpo.train.config import UpdateConfig

__all__ = ["CONFIG_DIR", "REPO_ROOT", "Config", "ConfigError", "PathsConfig", "describe", "load_config", "preset_path"]


@dataclass
class PathsConfig:
    """Where the embedded defaults keep their state. Relative paths are relative to ``root``."""

    root: str = field(default="var", metadata={"help": "State directory; relative to the repo root unless absolute "
                                                          "(installed from a wheel: to the current directory)."})
    landing: str = field(default="landing", metadata={
        "help": "Landing zone: impressions/month=YYYY-MM/*.parquet (and interactions/...): a directory, or an "
                "object-store URI (s3://bucket/prefix, gs://..., any fsspec URI; credentials from the environment, "
                "never this file; a partition there is read once its $ABPO_LANDING_MARKER, default _SUCCESS, is "
                "there; docs/scaling.md)."})
    warehouse: str = field(default="warehouse.duckdb", metadata={"help": "DuckDB warehouse file."})
    models: str = field(default="models", metadata={"help": "Local model checkpoints (tokenizer, tiny model, SFT, updates)."})
    reports: str = field(default="reports", metadata={"help": "A/B reports (HTML, Markdown, PNG)."})
    mlflow_tracking_uri: str = field(
        default="", metadata={"help": "MLflow tracking URI; empty = $MLFLOW_TRACKING_URI if set, else SQLite file "
                              "mlflow.db under root (precedence: --set > $ABPO_TRACKING_URI > $MLFLOW_TRACKING_URI > "
                              "YAML > that default)."}
    )
    mlflow_artifacts: str = field(default="mlartifacts", metadata={
        "help": "MLflow artifact root for the SQLite store: a directory, or an object-store URI (s3://bucket/prefix; "
                "MLflow writes through boto3 with the AWS_* variables and $MLFLOW_S3_ENDPOINT_URL or "
                "$AWS_ENDPOINT_URL)."})
    namespace: str = field(
        default="", metadata={"help": "Environment prefix of every MLflow name abpo makes: registered models "
                              "(<namespace>-abpo-arm-<arm>, <namespace>-abpo-recommender), promotion locks "
                              "(<namespace>-abpo-lock-<arm>) and experiments (<namespace>-abpo-arms, ...), so two "
                              "environments share one MLflow server; empty = the names as they are ($ABPO_NAMESPACE)."})

    # the fields that may name an object store (s3://bucket/prefix, gs://..., any fsspec URI: abpo.data.storage)
    URI_FIELDS = ("landing", "mlflow_artifacts")

    def resolve(self, name: str) -> Path:
        """Absolute path of one of the fields above. A field set to an object-store URI is refused here (a
        ValueError naming the key: it has no local path; :meth:`location` gives it), so no URI ever becomes a local
        directory named ``s3:``."""
        value = str(getattr(self, name))
        if is_uri(value):
            allowed = name in self.URI_FIELDS
            raise ValueError(f"config paths.{name} = {value!r}: " + (
                "an object-store URI where a local path is needed (read it through PathsConfig.location)" if allowed
                else f"rule: a local path (only paths.{' and paths.'.join(self.URI_FIELDS)} may be object-store "
                "URIs; the DuckDB warehouse, models and reports are files on the machine that runs the step)"))
        root = Path(self.root)
        if not root.is_absolute():
            root = base_dir() / root
        if name == "root":
            return root
        p = Path(getattr(self, name))
        return p if p.is_absolute() else root / p

    def location(self, name: str) -> Path | str:
        """:meth:`resolve`, except that a field of :data:`URI_FIELDS` set to an object-store URI (``s3://bucket/x``,
        ``gs://...``) is returned as that URI, unchanged (abpo.data.storage reads and writes it)."""
        value = str(getattr(self, name))
        if name in self.URI_FIELDS and is_uri(value):
            return value
        return self.resolve(name)

    def tracking_uri(self) -> str:
        return self.mlflow_tracking_uri or f"sqlite:///{self.resolve('root') / 'mlflow.db'}"

    def tracking_uri_source(self) -> str:
        """Where :meth:`tracking_uri` came from (printed with it): ``--set paths.mlflow_tracking_uri``,
        ``$ABPO_TRACKING_URI``, ``$MLFLOW_TRACKING_URI``, ``<file> paths.mlflow_tracking_uri`` or the default."""
        if not self.mlflow_tracking_uri:
            return "the default: SQLite mlflow.db under paths.root"
        return getattr(self, "_tracking_uri_from", "paths.mlflow_tracking_uri")


# Environment variables a deployment sets instead of editing YAML (precedence: YAML < env < --set).
ENV_OVERRIDES = {"ABPO_STATE": "paths.root", "ABPO_TRACKING_URI": "paths.mlflow_tracking_uri",
                 "ABPO_NAMESPACE": "paths.namespace"}
# MLFLOW_TRACKING_URI, MLflow's own variable, is honoured too, below $ABPO_TRACKING_URI: the value the user exported,
# read once when abpo was first imported (abpo.USER_MLFLOW_TRACKING_URI), never the variable as it is now, because
# mlflow.set_tracking_uri writes it itself (so a later read would see abpo's own last choice, leaking between runs).


@dataclass
class Config:
    """The whole pipeline's configuration. Load with :func:`load_config`."""

    name: str = "tiny"
    seed: int = 0
    paths: PathsConfig = field(default_factory=PathsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    update: UpdateConfig = field(default_factory=UpdateConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    arms: ArmsConfig = field(default_factory=ArmsConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ConfigError(ValueError):
    pass


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return _build(tp, value, where)
    if tp is bool:
        if isinstance(value, str):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ConfigError(f"{where}: expected a boolean, got {value!r}")
        return bool(value)
    if tp in (int, float, str):
        try:
            return tp(value)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}") from e
    if origin in (list, tuple):
        (inner, *_) = typing.get_args(tp) or (Any,)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        elif not isinstance(value, (list, tuple)):
            value = [value]  # `--set experiment.seeds=0`: YAML reads a lone scalar
        return [(_coerce(v, inner, f"{where}[{i}]") if inner is not Any else v) for i, v in enumerate(value)]
    return value


def _build(cls: type, values: dict[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(names)}")
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in values.items()}
    return cls(**kwargs)


def _set_path(cfg: Any, dotted: str, raw: str, where: str) -> None:
    obj = cfg
    *parents, leaf = dotted.split(".")
    for p in parents:
        if not dataclasses.is_dataclass(obj) or not hasattr(obj, p):
            raise ConfigError(f"{where}: no section {p!r} in {dotted!r}")
        obj = getattr(obj, p)
    if not dataclasses.is_dataclass(obj) or leaf not in {f.name for f in dataclasses.fields(obj)}:
        raise ConfigError(f"{where}: unknown key {dotted!r}")
    tp = typing.get_type_hints(type(obj))[leaf]
    setattr(obj, leaf, _coerce(yaml.safe_load(raw) if isinstance(raw, str) else raw, tp, f"{where} {dotted}"))


def preset_path(name_or_path: str | Path) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    return CONFIG_DIR / f"{name_or_path}.yaml"


def load_config(name_or_path: str | Path = "tiny", overrides: list[str] | None = None) -> Config:
    """Load a preset name (``tiny``, ``gpu``, ...) or a YAML path, then the environment
    (:data:`ENV_OVERRIDES`), then ``key.sub=value`` overrides."""
    path = preset_path(name_or_path)
    if not path.exists():
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        raise ConfigError(f"{path}: config not found (presets: {known})")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    cfg = _build(Config, raw, str(path))
    tracking_from = f"{path} paths.mlflow_tracking_uri"
    if abpo.USER_MLFLOW_TRACKING_URI:
        cfg.paths.mlflow_tracking_uri, tracking_from = abpo.USER_MLFLOW_TRACKING_URI, "$MLFLOW_TRACKING_URI"
    for env, key in ENV_OVERRIDES.items():
        if os.environ.get(env):
            _set_path(cfg, key, os.environ[env], f"${env}")
            tracking_from = f"${env}" if key == "paths.mlflow_tracking_uri" else tracking_from
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key.sub=value")
        key, value = item.split("=", 1)
        _set_path(cfg, key.strip(), value, "--set")
        tracking_from = "--set paths.mlflow_tracking_uri" if key.strip() == "paths.mlflow_tracking_uri" else \
            tracking_from
    try:
        namespaced("", cfg.paths.namespace)  # a namespace MLflow and Airflow names can carry, checked once here
    except ValueError as e:
        raise ConfigError(str(e)) from None
    object.__setattr__(cfg.paths, "_tracking_uri_from", tracking_from)  # not a field: not in to_dict / config_hash
    return cfg


def describe(cls: type, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(dotted key, default, help) for every field, for `abpo config --explain`."""
    rows = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            rows.extend(describe(tp, key + "."))
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            rows.append((key, default, f.metadata.get("help", "")))
    return rows
