"""Fixtures for the trainer tests: a 2-layer Llama with a small BPE vocabulary trained on real MovieLens titles,
and D_bandit-style rows built from the bundled catalog (tiny sizes: these run on 2 shared CPU cores)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.sizes import TRAINER_MODEL

N_ITEMS = 40  # catalog slice the tiny tokenizer and the candidate sets use
M = 6  # candidates per prompt


@pytest.fixture(scope="session")
def tiny_titles(movielens) -> dict[int, str]:
    titles = movielens.titles()
    ids = sorted(titles)[:N_ITEMS]
    return {i: titles[i] for i in ids}


@pytest.fixture(scope="session")
def tiny_policy_cfg():
    from abpo.config.policy import PolicyConfig

    return PolicyConfig(
        **TRAINER_MODEL, max_history=3, max_prompt_tokens=4096, tiny_vocab_size=400, lora_r=4, lora_alpha=8
    )


@pytest.fixture(scope="session")
def tiny_model_dir(build_tiny_model, tiny_titles, tiny_policy_cfg):
    """save_pretrained directory of the tiny model + tokenizer (built once; load fresh copies per test)."""
    return build_tiny_model(tiny_policy_cfg, tiny_titles)


@pytest.fixture
def load_tiny(tiny_model_dir):
    def _load():
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(tiny_model_dir)
        return model, tok

    return _load


def impression_rows(titles: dict[int, str], n: int, seed: int = 0) -> list[dict]:
    """IMPRESSIONS_SCHEMA-like dicts: alternating y = 1 / y = 0, a_log in C, e0 in (0, 1]."""
    rng = np.random.default_rng(seed)
    ids = sorted(titles)
    rows = []
    for i in range(n):
        pick = rng.choice(len(ids), size=M + 2, replace=False)
        history = [ids[j] for j in pick[:2]]
        cands = [ids[j] for j in pick[2:]]
        a = int(rng.integers(M))
        rows.append(
            {
                "impression_id": f"imp-{seed}-{i}",
                "user_id": i,
                "arm": "abpo",
                "history": history,
                "candidates": cands,
                "item_id": cands[a],
                "propensity": float(rng.uniform(0.05, 0.6)),
                "clicked": int(i % 2 == 0),
                "logging_policy": "softmax(tau=1.0)",
            }
        )
    return rows


@pytest.fixture
def make_impressions():
    """impression_rows as a fixture (tests import nothing from conftest)."""
    return impression_rows


@pytest.fixture
def land_impressions():
    """Factory: land_impressions(rows, landing, month) -> the Parquet file of ``rows`` (impression_rows) landed as
    month ``month``'s part ``test``, with the columns a serving log adds (served 2025-02-10, model version 1,
    logging policy softmax(tau=1.0), position 0, the request id the impression's)."""
    from datetime import UTC, datetime

    import pyarrow as pa

    from abpo.data.schemas import IMPRESSIONS_SCHEMA, SCHEMA_VERSION, write_impressions

    def land(rows: list[dict], landing, month: str):
        t = datetime(2025, 2, 10, tzinfo=UTC)
        full = [
            dict(
                r,
                event_time=t,
                served_at=t,
                model_version="1",
                request_id=r["impression_id"],
                position=0,
                logging_policy="softmax(tau=1.0)",
                schema_version=SCHEMA_VERSION,
            )
            for r in rows
        ]
        return write_impressions(pa.Table.from_pylist(full, schema=IMPRESSIONS_SCHEMA), landing, month, part="test")

    return land


@pytest.fixture
def ingested_impressions(land_impressions):
    """Factory: ingested_impressions(cfg, rows, month, known_arms=("abpo",)): ``rows`` landed in ``cfg``'s landing
    zone (land_impressions) and ingested into its warehouse as month ``month``; what `abpo update` reads."""
    from abpo.warehouse import Warehouse

    def ingest(cfg, rows: list[dict], month: str, known_arms=("abpo",)) -> None:
        land_impressions(rows, cfg.paths.resolve("landing"), month)
        with Warehouse(cfg.paths.resolve("warehouse")) as wh:
            wh.ingest_month(cfg.paths.resolve("landing"), month, known_arms=list(known_arms))

    return ingest


def _eight_update_rows(titles, load_tiny, policy_cfg) -> list[dict]:
    """Trainer rows (abpo.train.dataset.COLUMNS) of 8 logged examples (impression_rows) in batches of 4 (both strata
    in each), their prompts in ``policy_cfg``'s style."""
    from abpo.train.dataset import BatchingReport, build_update_rows

    _, tok = load_tiny()
    rows = impression_rows(titles, 8)
    batches = [rows[0:4], rows[4:8]]
    return build_update_rows(batches, titles, tok, policy_cfg, examples_per_batch=4, report=BatchingReport())


@pytest.fixture
def update_rows(tiny_titles, tiny_policy_cfg, load_tiny):
    """Trainer rows (abpo.train.dataset.COLUMNS) of 8 logged examples in batches of 4 (both strata in each)."""
    return _eight_update_rows(tiny_titles, load_tiny, tiny_policy_cfg)


@pytest.fixture
def item_policy_cfg(tiny_policy_cfg):
    """tiny_policy_cfg with the item_tokens prompt."""
    return dataclasses.replace(tiny_policy_cfg, prompt_style="item_tokens")


@pytest.fixture
def item_update_rows(tiny_titles, item_policy_cfg, load_tiny):
    """Trainer rows of the same 8 logged examples as update_rows, with the item_tokens prompt (batches of 4)."""
    return _eight_update_rows(tiny_titles, load_tiny, item_policy_cfg)


@pytest.fixture
def tiny_update_cfg():
    from abpo.config.update import UpdateConfig

    return dataclasses.replace(
        UpdateConfig(),
        group_size=3,
        batch_size=4,
        grad_accum=1,
        max_steps=2,
        save_steps=1,
        learning_rate=5e-3,
        max_completion_length=24,
        warmup_ratio=0.0,
    )
