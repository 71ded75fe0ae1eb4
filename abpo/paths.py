"""Where the repository's own files are: a leaf module (it imports nothing of abpo), so every layer, from the data
loaders to the CLI, can resolve a repo-relative path without importing the config that composes them."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO_ROOT / "configs"  # the presets: configs/<name>.yaml
SQL_DIR = REPO_ROOT / "sql"  # the named transforms run by abpo.warehouse.Warehouse.run
DAGS_DIR = REPO_ROOT / "dags"
PLUGINS_DIR = REPO_ROOT / "plugins"


def repo_path(p: str | Path) -> Path:
    """``p`` when absolute, else the same path under the repository root."""
    p = Path(p)
    return p if p.is_absolute() else REPO_ROOT / p
