"""Fixtures of the policy tests: a small slice of the bundled MovieLens titles and a very small `tiny` model
built from it (once per session)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.sizes import TRAINER_MODEL

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def small_titles() -> dict[int, str]:
    """The first 400 MovieLens titles (item id -> title)."""
    with open(REPO_ROOT / "data" / "ml-latest-small" / "movies.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))[:400]
    return {int(r["movieId"]): r["title"] for r in rows}


@pytest.fixture(scope="session")
def small_policy_cfg():
    from abpo.config.policy import PolicyConfig

    return PolicyConfig(**TRAINER_MODEL, max_history=5, max_prompt_tokens=8192, tiny_vocab_size=600, lora_r=0)


@pytest.fixture(scope="session")
def tiny_dir(build_tiny_model, small_policy_cfg, small_titles):
    import torch

    torch.set_num_threads(1)
    return build_tiny_model(small_policy_cfg, small_titles)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture
def tiny_model(tiny_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
