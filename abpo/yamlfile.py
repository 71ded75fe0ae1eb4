"""YAML as abpo's config files are read (configs/*.yaml, ``--config``, ``--set`` values, configs/regimes.yaml).

A leaf module (it imports nothing of abpo): abpo.config and abpo.experiment.regimes both read through it.

- Booleans are ``true`` / ``false`` only (YAML 1.2): ``yes``, ``on``, ``no`` stay strings (a bool field refuses them).
- ``1e-5`` is a float (YAML 1.2; PyYAML's YAML 1.1 reads a string); ``.nan`` and ``.inf`` are floats (a field
  refuses them as not finite).
- A key given twice in one mapping is refused (:class:`DuplicateKey`), naming the key and both lines, instead of the
  last one silently winning.
- A config file may start from another: ``extends: demo`` (a preset, ``configs/demo.yaml``) or ``extends: base.yaml``
  (a file, relative to this one). :func:`config_chain` reads the file and its parents; abpo.config merges them (the
  child's keys win) before it checks anything, and the DAG file reads ``arms.approval`` through the same chain.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

__all__ = ["EXTENDS", "ConfigLoader", "DuplicateKey", "YAMLFileError", "config_chain", "read_yaml", "yaml_value"]


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, line: int, first: int):
        super().__init__(f"duplicate key {key!r} at line {line} (first at line {first})")
        self.key, self.line, self.first = key, line, first


class YAMLFileError(ValueError):
    """A config file that is not YAML or holds a key twice: the message names the file, the line and the rule."""


class ConfigLoader(yaml.SafeLoader):
    """YAML as a config reads it: booleans are true/false only (YAML 1.2; `yes`, `on`, `no` stay strings and are
    refused by a bool field), 1e-5 is a float (YAML 1.2; PyYAML's YAML 1.1 reads a string), and a key given twice in
    one mapping is refused (:class:`DuplicateKey`) instead of the last one silently winning."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                k = self.construct_object(key_node, deep=True)
                try:
                    if k in seen:
                        raise DuplicateKey(k, key_node.start_mark.line + 1, seen[k])
                    seen[k] = key_node.start_mark.line + 1
                except TypeError:
                    continue  # an unhashable key: SafeLoader's own error
        return super().construct_mapping(node, deep=deep)


_BOOL, _FLOAT = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float"
ConfigLoader.yaml_implicit_resolvers = {
    c: [(tag, rx) for tag, rx in resolvers if tag not in (_BOOL, _FLOAT)]
    for c, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
ConfigLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
ConfigLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def yaml_value(raw: str) -> Any:
    """One value (a ``--set`` right-hand side) read by :class:`ConfigLoader`; yaml.YAMLError when it is not YAML."""
    return yaml.load(raw, Loader=ConfigLoader)  # noqa: S506 (a SafeLoader subclass)


def read_yaml(path: str | Path) -> Any:
    """The YAML file ``path`` read by :class:`ConfigLoader`; YAMLFileError naming the file, the key and the line for
    a duplicate key, the file and the line for anything that is not YAML."""
    try:
        return yaml.load(Path(path).read_text(), Loader=ConfigLoader)  # noqa: S506 (a SafeLoader subclass)
    except DuplicateKey as e:
        raise YAMLFileError(
            f"{path}: duplicate key {e.key!r} at line {e.line} (first at line {e.first}); "
            "rule: each key once per mapping"
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise YAMLFileError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None


EXTENDS = "extends"  # the top-level key naming a config file's parent
EXTENDS_RULE = "extends names a preset (demo: configs/demo.yaml) or a YAML file relative to this one (base.yaml)"


def parent_file(path: Path, name: Any, presets: Path) -> Path:
    """The file that ``extends: name`` in the config file ``path`` names: a bare name is the preset
    ``presets/<name>.yaml``; a name ending in .yaml / .yml or holding a folder is a file relative to ``path``'s folder
    (an absolute one as it is). YAMLFileError naming the file and the rule for anything but a non-empty string."""
    if not isinstance(name, str) or not name.strip():
        raise YAMLFileError(f"{path}: extends {name!r}: rule: {EXTENDS_RULE}")
    p = Path(name.strip())
    if p.suffix in (".yaml", ".yml") or len(p.parts) > 1:
        return path.parent / p
    return presets / f"{p}.yaml"


def config_chain(path: str | Path, presets: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The config file ``path`` and every file it extends (``extends:``, :func:`parent_file`), the farthest parent
    first, each as (file, its mapping without the ``extends`` key), each read by :func:`read_yaml`. YAMLFileError
    naming the file and the rule for a file that is not a mapping, a parent that does not exist, or a cycle (a file
    that extends itself, directly or through its parents)."""
    chain: list[tuple[Path, dict[str, Any]]] = []
    current = Path(path)
    while True:
        raw = read_yaml(current)
        raw = {} if raw is None else raw
        if not isinstance(raw, dict):
            raise YAMLFileError(f"{current}: top level must be a mapping")
        raw = dict(raw)
        name = raw.pop(EXTENDS, None)
        chain.append((current, raw))
        if name is None:
            return chain[::-1]
        parent = parent_file(current, name, presets)
        if not parent.is_file():
            known = sorted(p.stem for p in presets.glob("*.yaml"))
            raise YAMLFileError(
                f"{current}: extends {name!r}: no such file {parent}; rule: {EXTENDS_RULE}; presets: {known}"
            )
        seen = [p.resolve() for p, _ in chain]
        if parent.resolve() in seen:
            loop = " -> ".join(str(p) for p in [*(p for p, _ in chain[seen.index(parent.resolve()) :]), parent])
            raise YAMLFileError(
                f"{current}: extends {name!r} makes a cycle ({loop}); rule: a config may not extend itself, "
                "directly or through the files it extends"
            )
        current = parent
