"""A moved state's paths rewritten (abpo.registry.relocate, behind `abpo state relocate`; the whole command on a
copied state: tests/commands/test_state.py)."""

from __future__ import annotations

import pytest

from abpo.config import load_config
from abpo.registry import relocate_state


def test_relocate_refuses_a_relative_or_same_directory(tmp_path):
    cfg = load_config("tiny", [f"paths.root={tmp_path}"])
    with pytest.raises(ValueError, match="rule: the absolute directory"):
        relocate_state(cfg, "var")
    with pytest.raises(ValueError, match="rule: another directory than paths.root"):
        relocate_state(cfg, tmp_path)
