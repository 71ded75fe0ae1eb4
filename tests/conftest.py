"""Shared fixtures (keep small): the bundled MovieLens dataset, a fresh data config, and the tiny preset on a
MovieLens slice for SFT."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Tests never write into the user's state directory (var/): anything that falls back to the configured
# default lands in a throw-away directory instead. Tests that need their own state pass paths.root.
os.environ["ABPO_STATE"] = tempfile.mkdtemp(prefix="abpo-test-state-")
os.environ.pop("ABPO_TRACKING_URI", None)

REPO_ROOT = Path(__file__).resolve().parents[1]
MOVIELENS_DIR = REPO_ROOT / "data" / "ml-latest-small"


@pytest.fixture(scope="session")
def movielens():
    """The bundled MovieLens latest-small, loaded once per session (treat as read-only)."""
    from abpo.data.loaders import load_movielens

    return load_movielens(MOVIELENS_DIR)


@pytest.fixture
def data_cfg():
    """A fresh DataConfig with the tiny preset's values (mutable per test)."""
    from abpo.config import load_config

    return load_config("tiny").data


@pytest.fixture
def make_dataset():
    """Factory: {user_id: [item ids]} (+ n_items) -> a Dataset with items 1..n_items titled t<i>."""
    import pyarrow as pa

    from abpo.data.loaders import Dataset
    from abpo.data.schemas import CATALOG_SCHEMA, INTERACTIONS_SCHEMA

    def make(sequences: dict[int, list[int]], n_items: int = 50) -> Dataset:
        ids = list(range(1, n_items + 1))
        catalog = pa.table(
            {"item_id": ids, "title": [f"t{i}" for i in ids], "genres": [[] for _ in ids]}, schema=CATALOG_SCHEMA
        )
        rows = [(u, i, p) for u, s in sorted(sequences.items()) for p, i in enumerate(s)]
        inter = pa.table(
            {"user_id": [r[0] for r in rows], "item_id": [r[1] for r in rows], "event_time": [None] * len(rows),
             "rating": [None] * len(rows), "position": [r[2] for r in rows]},
            schema=INTERACTIONS_SCHEMA,
        )
        return Dataset("toy", catalog, inter, dict(sequences))

    return make


@pytest.fixture
def slice_cfg(tmp_path):
    """The tiny preset on 12 MovieLens users, a very small model, state under tmp_path."""
    from abpo.config import load_config

    cfg = load_config("tiny", [f"paths.root={tmp_path / 'var'}"])
    cfg.data.max_users, cfg.data.sup_examples_per_user = 12, 4
    cfg.data.train_candidates, cfg.data.eval_candidates, cfg.data.update_steps = 8, 10, 2
    p = cfg.policy
    p.tiny_hidden_size, p.tiny_layers, p.tiny_heads, p.tiny_intermediate_size, p.tiny_vocab_size = 32, 1, 2, 64, 2048
    p.max_history, p.scoring_batch_tokens = 3, 8192
    cfg.sft.use_lora = False
    s = cfg.sft
    s.max_steps, s.batch_size, s.learning_rate, s.logging_steps, s.warmup_ratio = 12, 8, 1e-2, 1, 0.0
    s.eval_generation = True
    return cfg
