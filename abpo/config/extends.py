"""A config file that says only what differs: ``extends: <preset or file>`` (read by abpo.yamlfile.config_chain), the
file and its parents merged into one mapping before anything is checked, and where each key's value came from (for
`abpo config --explain`).

The merge, per section: a section (a mapping whose field is a section, such as ``update`` or ``arms.popularity``)
merges key by key, the child's keys winning over its parent's; any other value, a list or a mapping such as
``report.arm_shares``, is the child's whole (never merged item by item). Chains are allowed (``demo_office`` extends
``demo``, which extends ``tiny``)."""

from __future__ import annotations

import dataclasses
import os
import typing
from pathlib import Path
from typing import Any

from abpo.config.errors import ConfigError
from abpo.config.values import build
from abpo.paths import CONFIG_DIR
from abpo.yamlfile import YAMLFileError, config_chain

DEFAULT = "default"  # the source of a value no file, variable or --set gave


def shown(path: Path) -> str:
    """A config file as --explain names it: ``configs/<name>.yaml`` for a preset (wherever abpo is installed), the
    path as given otherwise."""
    try:
        return f"configs/{path.resolve().relative_to(CONFIG_DIR.resolve()).as_posix()}"
    except ValueError:
        return os.path.normpath(path)


def merge(cls: Any, into: dict[str, Any], values: dict[str, Any], source: str, sources: dict[str, str], prefix=""):
    """``values`` (one file's mapping for the dataclass ``cls``) merged into ``into``: a section key by key, any
    other value replaced whole; ``sources`` records ``source`` for every dotted leaf key it sets."""
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        tp = hints.get(key)
        if tp is not None and dataclasses.is_dataclass(tp) and isinstance(value, dict):
            section = into.get(key)
            into[key] = section = dict(section) if isinstance(section, dict) else {}
            merge(tp, section, value, source, sources, dotted + ".")
        else:
            into[key] = value
            for k in [k for k in sources if k.startswith(dotted + ".")]:  # a whole section replaced
                del sources[k]
            sources[dotted] = source


def resolve(cls: Any, path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The config file ``path`` merged with every file it extends, the farthest parent first, and the source of each
    key set (:func:`shown`). Each file is checked on its own as it is read (an unknown key, a value outside its
    rule: ConfigError naming that file), so a parent's mistake names the parent; the rules between keys are checked
    on the whole config, after the merge and the overrides (abpo.config.validate)."""
    try:
        chain = config_chain(path, CONFIG_DIR)
    except YAMLFileError as e:
        raise ConfigError(str(e)) from None
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for file, values in chain:
        build(cls, values, str(file))  # each file's keys and values, named by that file
        merge(cls, merged, values, shown(file), sources)
    return merged, sources
