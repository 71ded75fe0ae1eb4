"""The lint and the layers run with the test suite: `ruff check` (pyproject.toml [tool.ruff]) and `lint-imports`
(the import-linter contracts in pyproject.toml [tool.importlinter]: abpo's layers import only downward, the leaf
modules import nothing of abpo, production code does not read from the simulator). Both come with the dev extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    if not exe.exists():
        pytest.fail(f"{exe}: not installed; `pip install -c constraints.txt -e '.[dev]'` (scripts/setup.sh) adds it")
    return str(exe)


def test_ruff_is_clean():
    proc = subprocess.run([_tool("ruff"), "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_import_contracts_are_kept():
    proc = subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout or "broken" not in proc.stdout.split("Contracts:")[-1]
