"""The value rules of every config field, checked in one place whenever a value is read from a YAML file, the
environment or ``--set``: a section built from a mapping (unknown keys refused), strict types, and the allowed range or
choices a field's metadata carries."""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path
from typing import Any

import yaml

from abpo.config.errors import ConfigError
from abpo.yamlfile import YAMLFileError, excerpt, read_yaml as read_yaml_file, shown_key, yaml_value

# Each field's metadata may carry its allowed range, checked in one place (:func:`_scalar`) whenever a value is read
# from a YAML file, the environment or ``--set``, and shown by `abpo config --explain`:
#   "min" / "max": inclusive bounds, "gt" / "lt": exclusive bounds (a list's items and a mapping's values are each
#   checked), "choices": the allowed strings, "duration": a string such as 90m, 72h or 7d (:func:`duration_seconds`),
#   with "duration_max": (the longest, as a duration, and why) when it has one.
# Types are strict: a bool field takes YAML true/false only, an int field an integer only (not 2.5, not true), a float
# field a finite number only (not true, not .nan, not .inf), a str field a string only. Nothing is coerced.
RANGE_KEYS = ("gt", "min", "lt", "max")
INT64_MAX = 2**63 - 1  # every int field's bound besides its own: numpy, torch, DuckDB and SQLite hold int64


def range_rule(meta: Any) -> str:
    """The range a field's metadata allows, as the one-line rule its refusal prints ('' when none): ``> 0``,
    ``>= 1``, ``in (0, 1]``, ``one of a, b``."""
    if "choices" in meta:
        return "one of " + ", ".join(map(str, meta["choices"]))
    if meta.get("duration"):
        if "duration_max" in meta:
            longest, why = meta["duration_max"]
            return f"{DURATION_RULE}, at most {longest} ({why})"
        return DURATION_RULE
    lo = ("(", meta["gt"]) if "gt" in meta else ("[", meta["min"]) if "min" in meta else None
    hi = (")", meta["lt"]) if "lt" in meta else ("]", meta["max"]) if "max" in meta else None
    if lo and hi:
        return f"in {lo[0]}{lo[1]:g}, {hi[1]:g}{hi[0]}"
    if lo:
        return f"{'>' if lo[0] == '(' else '>='} {lo[1]:g}"
    if hi:
        return f"{'<' if hi[0] == ')' else '<='} {hi[1]:g}"
    return ""


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
DURATION_RULE = "a duration > 0: a number and a unit, s, m, h or d (90m, 72h, 7d)"


def duration_seconds(text: str) -> float | None:
    """A duration field's value (``90m``, ``72h``, ``1.5d``, ``45s``) in seconds; None when it is not a positive number
    followed by one of :data:`DURATION_UNITS` (the field's refusal says :data:`DURATION_RULE`)."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", str(text))
    if not m or float(m.group(1)) <= 0:
        return None
    return float(m.group(1)) * DURATION_UNITS[m.group(2)]


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
        return ConfigError(f"{source}: {key} {excerpt(shown)}: rule: {rule}")

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
    if tp is int and abs(value) > INT64_MAX:  # a step count, size or seed the trainer and the stores hold as int64
        raise refuse(value, f"an integer within int64 (at most {INT64_MAX} in magnitude)" + _also(meta))
    if "choices" in meta and value not in meta["choices"]:
        raise refuse(value, range_rule(meta))
    if meta.get("duration") and duration_seconds(value) is None:
        raise refuse(value, range_rule(meta))
    if "duration_max" in meta:
        seconds, most = duration_seconds(value), duration_seconds(meta["duration_max"][0])
        if seconds is not None and most is not None and seconds > most:
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


def _also(meta: Any) -> str:
    """The field's own range after the int64 rule, when it has one (``; and >= 1``)."""
    rule = range_rule(meta)
    return f"; and {rule}" if rule else ""


def _coerce(value: Any, tp: Any, where: str, meta: Any = None, key: str = "", source: str = "") -> Any:
    """``value`` as a field of type ``tp`` (metadata ``meta``, dotted ``key``, read from ``source``): a nested section
    built from a mapping, a list from a YAML list (or from ``a,b`` on the command line), a mapping's values and every
    scalar checked by :func:`_scalar`."""
    meta = meta or {}
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {excerpt(value)}")
        return build(tp, value, where, source, key)
    if tp in (bool, int, float, str):
        return _scalar(value, tp, meta, key, source)
    if origin in (list, tuple):
        (inner, *_) = typing.get_args(tp) or (Any,)
        if isinstance(value, str):  # `--set arms.names=abpo,grpo`: names as they are, numbers (seeds) read as YAML
            value = [
                v.strip() if inner is str else yaml_setting(v.strip(), source, key)
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
            raise ConfigError(f"{source}: {key} {excerpt(value)}: rule: a mapping")
        return {
            _coerce(k, kt, where, {}, f"{key} (a key)", source): _coerce(v, vt, where, meta, f"{key}.{k}", source)
            for k, v in value.items()
        }
    return value


def build(cls: Any, values: dict[str, Any], where: str, source: str | None = None, prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted((k for k in values if k not in fields), key=str)
    if unknown:
        raise ConfigError(f"{where}: {unknown_keys(unknown)}; known: {sorted(fields)}; rule: a key of this section")
    source = where if source is None else source
    kwargs = {
        k: _coerce(v, hints[k], f"{where}.{k}", fields[k].metadata, f"{prefix}{'.' if prefix else ''}{k}", source)
        for k, v in values.items()
    }
    return cls(**kwargs)


SHOWN_UNKNOWN_KEYS = 5  # the most unknown keys a refusal names (a foreign file has one per line)


def unknown_keys(keys: list[Any]) -> str:
    """The unknown keys of a refusal: the first :data:`SHOWN_UNKNOWN_KEYS` that are names (``'updat'``), the others
    counted, never quoted (:func:`abpo.yamlfile.shown_key`: a foreign file's lines, /etc/shadow's password hashes, are
    not echoed)."""
    names = [k for k in keys if shown_key(k).startswith("'")]
    shown = [shown_key(k) for k in names[:SHOWN_UNKNOWN_KEYS]]
    others = len(keys) - len(shown)
    if not others:
        return f"unknown key(s) [{', '.join(shown)}]"
    what = f"{len(keys) - len(names)} that are not names" if len(names) < len(keys) else ""
    if len(names) > SHOWN_UNKNOWN_KEYS:
        what = ", ".join(filter(None, [what, f"{len(names) - SHOWN_UNKNOWN_KEYS} more names"]))
    head = f"[{', '.join(shown)}] and " if shown else ""
    return f"{len(keys)} unknown key(s): {head}{others} not shown ({what})"


def yaml_setting(raw: str, source: str, key: str) -> Any:
    """One ``--set`` value read as YAML by :func:`abpo.yamlfile.yaml_value`; ConfigError naming the key otherwise."""
    try:
        return yaml_value(raw)
    except yaml.YAMLError as e:
        problem = (str(e).splitlines() or [type(e).__name__])[0][:120]
        raise ConfigError(f"{source}: {key} {excerpt(raw)}: rule: a YAML value ({problem})") from None


def read_yaml(path: Path) -> Any:
    """A config file read by :func:`abpo.yamlfile.read_yaml` (duplicate keys refused, YAML 1.2 booleans and floats);
    ConfigError naming the file, the key and the line otherwise."""
    try:
        return read_yaml_file(path)
    except YAMLFileError as e:
        raise ConfigError(str(e)) from None


def set_key(cfg: Any, dotted: str, raw: Any, where: str, parse: bool = True) -> None:
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
    value = yaml_setting(raw, where, dotted) if parse and isinstance(raw, str) else raw
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
