"""The pipeline's configuration: one YAML file (configs/<preset>.yaml) mapped onto typed sections.

Each section is a dataclass owned by the module that uses it (every field has a default and a help
text in its ``metadata``); this file only composes them, loads YAML, and applies ``--set a.b=v``
overrides. Unknown keys are an error that names the file and the key.
"""

from __future__ import annotations

import dataclasses
import math
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
from abpo.experiment.config import ExperimentConfig, check_rounds_fit
from abpo.paths import CONFIG_DIR, base_dir, namespaced
from abpo.policy.config import PolicyConfig, SFTConfig
from abpo.redact import has_userinfo, redact
from abpo.sim.config import SimConfig
from abpo.train.config import UpdateConfig
from abpo.yamlfile import YAMLFileError, read_yaml as read_yaml_file, yaml_value

__all__ = ["Config", "ConfigError", "PathsConfig", "describe", "load_config", "preset_path"]


@dataclass
class PathsConfig:
    """Where the embedded defaults keep their state. Relative paths are relative to ``root``."""

    root: str = field(
        default="var",
        metadata={
            "help": "State directory; relative to the repo root unless absolute "
            "(installed from a wheel: to the current directory)."
        },
    )
    landing: str = field(
        default="landing",
        metadata={
            "help": "Landing zone: impressions/month=YYYY-MM/*.parquet (and interactions/...): a directory, or an "
            "object-store URI (s3://bucket/prefix, gs://..., any fsspec URI; credentials from the environment, "
            "never this file; a partition there is read once its $ABPO_LANDING_MARKER, default _SUCCESS, is "
            "there; docs/scaling.md)."
        },
    )
    warehouse: str = field(default="warehouse.duckdb", metadata={"help": "DuckDB warehouse file."})
    models: str = field(
        default="models", metadata={"help": "Local model checkpoints (tokenizer, tiny model, SFT, updates)."}
    )
    reports: str = field(default="reports", metadata={"help": "A/B reports (HTML, Markdown, PNG)."})
    mlflow_tracking_uri: str = field(
        default="",
        metadata={
            "help": "MLflow tracking URI; empty = $MLFLOW_TRACKING_URI if set, else SQLite file "
            "mlflow.db under root (precedence: --set > $ABPO_TRACKING_URI > $MLFLOW_TRACKING_URI > "
            "YAML > that default)."
        },
    )
    mlflow_artifacts: str = field(
        default="mlartifacts",
        metadata={
            "help": "MLflow artifact root for the SQLite store: a directory, or an object-store URI (s3://bucket/prefix; "
            "MLflow writes through boto3 with the AWS_* variables and $MLFLOW_S3_ENDPOINT_URL or "
            "$AWS_ENDPOINT_URL)."
        },
    )
    namespace: str = field(
        default="",
        metadata={
            "help": "Environment prefix of every MLflow name abpo makes: registered models "
            "(<namespace>-abpo-arm-<arm>, <namespace>-abpo-recommender), promotion locks "
            "(<namespace>-abpo-lock-<arm>) and experiments (<namespace>-abpo-arms, ...), so two "
            "environments share one MLflow server; empty = the names as they are ($ABPO_NAMESPACE)."
        },
    )

    # the fields that may name an object store (s3://bucket/prefix, gs://..., any fsspec URI: abpo.data.storage)
    URI_FIELDS = ("landing", "mlflow_artifacts")

    def resolve(self, name: str) -> Path:
        """Absolute path of one of the fields above. A field set to an object-store URI is refused here (a
        ValueError naming the key: it has no local path; :meth:`location` gives it), so no URI ever becomes a local
        directory named ``s3:``."""
        value = str(getattr(self, name))
        if is_uri(value):
            allowed = name in self.URI_FIELDS
            raise ValueError(
                f"config paths.{name} = {value!r}: "
                + (
                    "an object-store URI where a local path is needed (read it through PathsConfig.location)"
                    if allowed
                    else f"rule: a local path (only paths.{' and paths.'.join(self.URI_FIELDS)} may be object-store "
                    "URIs; the DuckDB warehouse, models and reports are files on the machine that runs the step)"
                )
            )
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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ConfigError(ValueError):
    """A bad config file, variable or override: the message names the source, the key and the rule, with any
    credentials in the value blanked out (abpo.redact)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


# the config's object-store URIs: read through abpo.data.storage with credentials from the environment only
CREDENTIAL_FREE_FIELDS = ("paths.landing", "paths.mlflow_artifacts", "data.dataset_dir")


def check_no_credentials(cfg: Config) -> None:
    """ConfigError for an object-store URI setting (:data:`CREDENTIAL_FREE_FIELDS`) that carries credentials
    (``s3://KEY:SECRET@bucket/x``, ``?secret_key=...``): credentials never come from the config, which is copied,
    committed and printed (`abpo config`); they come from the environment or $ABPO_STORAGE_CONNECTION."""
    for dotted in CREDENTIAL_FREE_FIELDS:
        section, key = dotted.split(".")
        value = str(getattr(getattr(cfg, section), key, "") or "")
        if is_uri(value) and has_userinfo(value):
            raise ConfigError(
                f"config {dotted} = {redact(value)!r}: rule: credentials never come from the config (no "
                "user:password@ or secret query parameter in an object-store URI); set AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE or the instance role, or $ABPO_STORAGE_CONNECTION "
                "(docs/scaling.md)"
            )


# ---------------------------------------------------------------------------------------------- value rules
# Each field's metadata may carry its allowed range, checked in one place (:func:`_scalar`) whenever a value is read
# from a YAML file, the environment or ``--set``, and shown by `abpo config --explain`:
#   "min" / "max": inclusive bounds, "gt" / "lt": exclusive bounds (a list's items and a mapping's values are each
#   checked), "choices": the allowed strings.
# Types are strict: a bool field takes YAML true/false only, an int field an integer only (not 2.5, not true), a float
# field a finite number only (not true, not .nan, not .inf), a str field a string only. Nothing is coerced.
RANGE_KEYS = ("gt", "min", "lt", "max")


def range_rule(meta: Any) -> str:
    """The range a field's metadata allows, as the one-line rule its refusal prints ('' when none): ``> 0``,
    ``>= 1``, ``in (0, 1]``, ``one of a, b``."""
    if "choices" in meta:
        return "one of " + ", ".join(map(str, meta["choices"]))
    lo = ("(", meta["gt"]) if "gt" in meta else ("[", meta["min"]) if "min" in meta else None
    hi = (")", meta["lt"]) if "lt" in meta else ("]", meta["max"]) if "max" in meta else None
    if lo and hi:
        return f"in {lo[0]}{lo[1]:g}, {hi[1]:g}{hi[0]}"
    if lo:
        return f"{'>' if lo[0] == '(' else '>='} {lo[1]:g}"
    if hi:
        return f"{'<' if hi[0] == ')' else '<='} {hi[1]:g}"
    return ""


def _type_rule(tp: Any) -> str:
    return {
        bool: "true or false (YAML booleans only; not coerced)",
        int: "an integer (not coerced)",
        float: "a finite number (not coerced)",
        str: "a string (quote it)",
    }[tp]


def _scalar(value: Any, tp: Any, meta: Any, key: str, source: str) -> Any:
    """``value`` checked against the scalar type ``tp`` and the range in ``meta``; ConfigError naming the source,
    the key, the value and the rule otherwise."""

    def refuse(shown: Any, rule: str):
        return ConfigError(f"{source}: {key} {shown!r}: rule: {rule}")

    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok:
            try:
                value = float(value)
            except OverflowError:
                ok = False
            ok = ok and math.isfinite(value)
    elif tp is str:
        ok = isinstance(value, str)
    else:
        return value
    if not ok:
        raise refuse(value, _type_rule(tp))
    if "choices" in meta and value not in meta["choices"]:
        raise refuse(value, range_rule(meta))
    if tp in (int, float) and any(k in meta for k in RANGE_KEYS):
        inside = (
            ("gt" not in meta or value > meta["gt"])
            and ("min" not in meta or value >= meta["min"])
            and ("lt" not in meta or value < meta["lt"])
            and ("max" not in meta or value <= meta["max"])
        )
        if not inside:
            raise refuse(value, range_rule(meta))
    return value


def _coerce(value: Any, tp: Any, where: str, meta: Any = None, key: str = "", source: str = "") -> Any:
    """``value`` as a field of type ``tp`` (metadata ``meta``, dotted ``key``, read from ``source``): a nested section
    built from a mapping, a list from a YAML list (or from ``a,b`` on the command line), a mapping's values and every
    scalar checked by :func:`_scalar`."""
    meta = meta or {}
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return _build(tp, value, where, source, key)
    if tp in (bool, int, float, str):
        return _scalar(value, tp, meta, key, source)
    if origin in (list, tuple):
        (inner, *_) = typing.get_args(tp) or (Any,)
        if isinstance(value, str):  # `--set arms.names=abpo,grpo`: names as they are, numbers (seeds) read as YAML
            value = [
                v.strip() if inner is str else _yaml_value(v.strip(), source, key)
                for v in value.split(",")
                if v.strip()
            ]
        elif not isinstance(value, (list, tuple)):
            value = [value]  # `--set experiment.seeds=0`: YAML reads a lone scalar
        return [
            (_coerce(v, inner, f"{where}[{i}]", meta, f"{key}[{i}]", source) if inner is not Any else v)
            for i, v in enumerate(value)
        ]
    if origin is dict:
        kt, vt = typing.get_args(tp) or (Any, Any)
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {key} {value!r}: rule: a mapping")
        return {
            _coerce(k, kt, where, {}, f"{key} (a key)", source): _coerce(v, vt, where, meta, f"{key}.{k}", source)
            for k, v in value.items()
        }
    return value


def _build(cls: type, values: dict[str, Any], where: str, source: str | None = None, prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(fields)}")
    source = where if source is None else source
    kwargs = {
        k: _coerce(v, hints[k], f"{where}.{k}", fields[k].metadata, f"{prefix}{'.' if prefix else ''}{k}", source)
        for k, v in values.items()
    }
    return cls(**kwargs)


def _yaml_value(raw: str, source: str, key: str) -> Any:
    """One ``--set`` value read as YAML by :func:`abpo.yamlfile.yaml_value`; ConfigError naming the key otherwise."""
    try:
        return yaml_value(raw)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: {key} {raw!r}: rule: a YAML value ({str(e).splitlines()[0]})") from None


def read_yaml(path: Path) -> Any:
    """A config file read by :func:`abpo.yamlfile.read_yaml` (duplicate keys refused, YAML 1.2 booleans and floats);
    ConfigError naming the file, the key and the line otherwise."""
    try:
        return read_yaml_file(path)
    except YAMLFileError as e:
        raise ConfigError(str(e)) from None


def _set_path(cfg: Any, dotted: str, raw: Any, where: str, parse: bool = True) -> None:
    obj = cfg
    *parents, leaf = dotted.split(".")
    for p in parents:  # a section is a dataclass field of its parent: never an attribute such as __class__
        fields = {f.name for f in dataclasses.fields(obj) if dataclasses.is_dataclass(getattr(obj, f.name))}
        if p not in fields:
            raise ConfigError(f"{where}: no section {p!r} in {dotted!r}; rule: sections are {sorted(fields)}")
        obj = getattr(obj, p)
    if not dataclasses.is_dataclass(obj) or leaf not in {f.name for f in dataclasses.fields(obj)}:
        raise ConfigError(f"{where}: unknown key {dotted!r}")
    f = next(f for f in dataclasses.fields(obj) if f.name == leaf)
    tp = typing.get_type_hints(type(obj))[leaf]
    value = _yaml_value(raw, where, dotted) if parse and isinstance(raw, str) else raw
    setattr(obj, leaf, _coerce(value, tp, f"{where} {dotted}", f.metadata, dotted, where))


def check_values(obj: Any, prefix: str = "", source: str = "default") -> None:
    """Every field of the config (or section) ``obj`` checked against its type and range, as loading checks them
    (a test runs it on the defaults: every default must satisfy its own rule)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            check_values(value, key + ".", source)
        else:
            _coerce(value, hints[f.name], key, f.metadata, key, source)


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
    raw = read_yaml(path) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    cfg = _build(Config, raw, str(path))
    tracking_from = f"{path} paths.mlflow_tracking_uri"
    if abpo.USER_MLFLOW_TRACKING_URI:
        cfg.paths.mlflow_tracking_uri, tracking_from = abpo.USER_MLFLOW_TRACKING_URI, "$MLFLOW_TRACKING_URI"
    for env, key in ENV_OVERRIDES.items():
        if os.environ.get(env):
            _set_path(cfg, key, os.environ[env], f"${env}", parse=False)  # a path or a name: taken as it is
            tracking_from = f"${env}" if key == "paths.mlflow_tracking_uri" else tracking_from
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key.sub=value")
        key, value = item.split("=", 1)
        _set_path(cfg, key.strip(), value, "--set")
        tracking_from = (
            "--set paths.mlflow_tracking_uri" if key.strip() == "paths.mlflow_tracking_uri" else tracking_from
        )
    try:
        namespaced("", cfg.paths.namespace)  # a namespace MLflow and Airflow names can carry, checked once here
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_no_credentials(cfg)
    validate(cfg)
    object.__setattr__(cfg.paths, "_tracking_uri_from", tracking_from)  # not a field: not in to_dict / config_hash
    return cfg


def validate(cfg: Config) -> None:
    """The rules that relate keys of different sections, checked once, when :func:`load_config` has applied the
    preset, the environment and every override: a combination that cannot run is refused before any step starts,
    with one line naming each key involved and the rule (a ConfigError). The rules:

    - ``experiment.rounds`` at most the update positions per user (``experiment.update_steps`` when set, else
      ``data.update_steps``): abpo.experiment.config.check_rounds_fit.
    """
    try:
        check_rounds_fit(cfg.experiment, cfg.data.update_steps)
    except ValueError as e:
        raise ConfigError(str(e)) from None


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
            rule = range_rule(f.metadata)
            rows.append((key, default, f.metadata.get("help", "") + (f" Allowed: {rule}." if rule else "")))
    return rows
