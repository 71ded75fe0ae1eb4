"""Where abpo's own files are: a leaf module (it imports nothing of abpo), so every layer, from the data loaders to
the CLI, can resolve a path without importing the config that composes them.

Two layouts, one set of names:

- a checkout (``pip install -e .`` or running from the repository): the repository's own ``configs/``, ``sql/``,
  ``dags/``, ``plugins/`` and ``data/``;
- an installed wheel (``pip install .``): the same files shipped as package data under ``abpo/_resources/``
  (pyproject.toml maps the repository's top-level folders there with hatchling's ``force-include``).

:data:`RESOURCES` is the folder holding those files in either layout. A relative path in a config (the dataset, a
model, the DeepSpeed file) is looked up there first (:func:`repo_path`), else under :func:`base_dir`: the checkout's
root, or the current directory when installed. The state root (``paths.root``, default ``var``) is relative to
:func:`base_dir` too.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
_PACKAGED = (
    PACKAGE_DIR / "_resources"
)  # the wheel's copy (pyproject.toml [tool.hatch.build.targets.wheel.force-include])


def _checkout_root() -> Path | None:
    root = PACKAGE_DIR.parent
    if (root / "pyproject.toml").is_file() and (root / "sql").is_dir() and (root / "configs").is_dir():
        return root
    return None


CHECKOUT: Path | None = _checkout_root()  # the repository when running from a checkout, else None
RESOURCES: Path = CHECKOUT if CHECKOUT is not None else _PACKAGED
REPO_ROOT = RESOURCES  # the name the rest of abpo uses for the folder holding configs/, sql/, data/ (either layout)
CONFIG_DIR = RESOURCES / "configs"  # the presets: configs/<name>.yaml
SQL_DIR = RESOURCES / "sql"  # the named transforms run by abpo.warehouse.Warehouse.run
DAGS_DIR = RESOURCES / "dags"  # abpo_monthly.py (`abpo airflow install` copies it into a deployment)
PLUGINS_DIR = RESOURCES / "plugins"  # abpo_plugin.py (the same)


def installed() -> bool:
    """True when abpo runs from an installed wheel (its files under abpo/_resources), not from a checkout."""
    return CHECKOUT is None


def base_dir() -> Path:
    """Where a relative state root or a relative user path resolves: the checkout's root, or the current directory
    when abpo is installed from a wheel."""
    return CHECKOUT if CHECKOUT is not None else Path.cwd()


def repo_path(p: str | os.PathLike) -> Path:
    """``p`` when absolute; else ``p`` under :func:`base_dir` when it exists there; else the bundled file of that
    name (configs/, data/, ...) when there is one; else ``p`` under :func:`base_dir` (named in the error that
    follows)."""
    path = Path(p)
    if path.is_absolute():
        return path
    for candidate in (base_dir() / path, RESOURCES / path):
        if candidate.exists():
            return candidate
    return base_dir() / path


NAMESPACE_PATTERN = r"[a-z0-9][a-z0-9_-]*"  # what paths.namespace may be (MLflow names, Airflow Asset URIs, paths)
# its length: every name built from it (the longest, <ns>-abpo-arm-ml_retrain) is also a directory name under the
# artifact root and the models' cache, which a file system caps at 255 bytes; MLflow and Airflow names stay short too
NAMESPACE_MAX_LENGTH = 64


def namespaced(name: str, namespace: str = "") -> str:
    """``<namespace>-<name>``: a registered model, lock or MLflow experiment name of environment ``namespace``
    (``paths.namespace``), so two environments share one MLflow server without touching each other's names; ``name``
    itself when the namespace is empty (the default: every name as it always was). ValueError naming the rule when
    the namespace is not lower-case letters, digits, '-' and '_', or longer than :data:`NAMESPACE_MAX_LENGTH`."""
    import re

    if not namespace:
        return name
    if not re.fullmatch(NAMESPACE_PATTERN, namespace) or len(namespace) > NAMESPACE_MAX_LENGTH:
        shown = namespace if len(namespace) <= 80 else f"{namespace[:40]}...({len(namespace)} characters)"
        raise ValueError(
            f"config paths.namespace = {shown!r}: rule: {NAMESPACE_PATTERN} (lower-case letters, "
            f"digits, '-', '_'), at most {NAMESPACE_MAX_LENGTH} characters; empty = no namespace"
        )
    return f"{namespace}-{name}"
