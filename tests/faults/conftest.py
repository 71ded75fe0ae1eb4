"""Faults tried by the route a user takes (the `abpo` command in-process, the DAG's params, the UI plugin's routes),
each against the real DuckDB, MLflow and Great Expectations (issue 18)."""

from __future__ import annotations

import pytest


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A throw-away state directory for the `abpo` command ($ABPO_STATE), returned as a Path."""
    root = tmp_path / "var"
    monkeypatch.setenv("ABPO_STATE", str(root))
    monkeypatch.delenv("ABPO_TRACKING_URI", raising=False)
    return root


@pytest.fixture
def abpo(capsys):
    """Run `abpo ARGS...` in this process: (rc, stdout, stderr)."""
    from abpo.cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            rc = main(list(argv))
        except SystemExit as e:  # argparse
            rc = e.code if isinstance(e.code, int) else 2
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run
