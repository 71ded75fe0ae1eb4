"""The lint, the format, the layers and the types run with the test suite: `ruff check` and `ruff format --check`
(pyproject.toml [tool.ruff], [tool.ruff.format]), `lint-imports` (the import-linter contracts in pyproject.toml
[tool.importlinter]: abpo's layers import only downward, the leaf modules import nothing of abpo, production code does
not read from the simulator) and mypy over abpo/ ([tool.mypy]) held at tests/typecheck_baseline.txt's count
(scripts/typecheck.py). All come with the dev extra. `make lint`, `make typecheck` and `make format` run the same."""

from __future__ import annotations

import importlib.util
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
    proc = subprocess.run(
        [_tool("ruff"), "check", "--no-cache", "--output-format", "concise", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_import_contracts_are_kept():
    proc = subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout or "broken" not in proc.stdout.split("Contracts:")[-1]


# `ruff format` is enforced (issue 34): `make format` formats the tree, `make lint` checks it.
def test_the_tree_is_formatted():
    proc = subprocess.run(
        [_tool("ruff"), "format", "--check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, "`make format` reformats these:\n" + proc.stdout[-6000:] + proc.stderr[-2000:]


def test_mypy_errors_stay_at_or_below_the_baseline():
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy: not installed; `pip install -c constraints.txt -e '.[dev]'` (scripts/setup.sh) adds it")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "typecheck.py")], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-3000:]


def test_no_module_under_abpo_is_over_500_lines():
    """One idea per file (issue 34): a module past 500 lines is split along its seams, not grown."""
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "abpo").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert not long, f"modules over 500 lines (rule: split along their seams): {long}"
