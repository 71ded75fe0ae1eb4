"""A pinned update: two optimizer steps of variant F (abpo) on the tiny fixtures, with text prompts (free rollouts)
and with item-token prompts (constrained rollouts), whose logged per-step metrics and trained weights must stay
bit-identical to the values in tests/train/fixtures/pinned_update.json. Those values were computed on the code
before the issue-34 refactor of abpo/train (the records, the split of trainer.py and update.py): a refactor that
changes no behaviour keeps this test passing; one that changes a single number fails it, naming the metric.

The pins hold on one platform (the torch CPU kernels of this machine and its pinned torch version); on another,
recompute them from a commit whose numbers are trusted with ``ABPO_REPIN=1`` (it rewrites the fixture and fails)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from abpo.train.trainer import ABPOSettings

FIXTURE = Path(__file__).parent / "fixtures" / "pinned_update.json"
# wall-clock metrics: they differ from run to run by nature
TIMED = ("time", "runtime", "per_second", "flos")


def _weights_sha256(trainer) -> str:
    model = trainer.accelerator.unwrap_model(trainer.model)
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        if p.requires_grad:
            h.update(name.encode())
            h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _run(load_tiny, rows, update_cfg, tmp_path, settings, popularity) -> dict:
    from abpo.policy.config import PolicyConfig
    from abpo.policy.model import lora_config
    from abpo.train.dataset import to_hf_dataset
    from abpo.train.update import train_update

    torch.manual_seed(0)
    model, tok = load_tiny()
    trainer, _ = train_update(
        model,
        tok,
        to_hf_dataset(rows),
        update_cfg,
        settings,
        output_dir=tmp_path,
        seed=0,
        peft_config=lora_config(PolicyConfig(lora_r=4, lora_alpha=8)),
        resume=False,
        grpo_overrides={"disable_tqdm": True},
        item_popularity=popularity,
        quiet=True,
    )
    steps = [h for h in trainer.state.log_history if "abpo/advantages/mean" in h]
    metrics = [
        {
            k: repr(float(v))
            for k, v in sorted(h.items())
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not any(t in k for t in TIMED)
        }
        for h in steps
    ]
    return {"steps": trainer.state.global_step, "metrics": metrics, "weights_sha256": _weights_sha256(trainer)}


@pytest.fixture
def pinned_runs(load_tiny, update_rows, tiny_titles, tiny_policy_cfg, tiny_update_cfg, tmp_path):
    from abpo.train.dataset import BatchingReport, build_update_rows

    from .conftest import impression_rows

    popularity = {a: 1 + a % 7 for r in update_rows for a in r["candidates"]}
    u = dataclasses.replace(tiny_update_cfg, max_steps=2, save_steps=10)
    text = _run(
        load_tiny,
        update_rows,
        u,
        tmp_path / "text",
        ABPOSettings(variant="abpo", lambda_sc=0.5, scoring_batch_tokens=4096),
        popularity,
    )
    _, tok = load_tiny()
    pol = dataclasses.replace(tiny_policy_cfg, prompt_style="item_tokens")
    raw = impression_rows(tiny_titles, 8)
    item_rows = build_update_rows(
        [raw[0:4], raw[4:8]], tiny_titles, tok, pol, examples_per_batch=4, report=BatchingReport()
    )
    u_items = dataclasses.replace(u, group_size=5, max_completion_length=64)
    items = _run(
        load_tiny,
        item_rows,
        u_items,
        tmp_path / "items",
        ABPOSettings(
            variant="abpo",
            lambda_sc=0.5,
            scoring_batch_tokens=4096,
            constrained_rollouts=True,
            prompt_style="item_tokens",
            self_certainty_positions="answer",
        ),
        popularity,
    )
    return {"text_prompts": text, "item_tokens_constrained": items}


def test_pinned_update_is_bit_identical(pinned_runs):
    if os.environ.get("ABPO_REPIN") == "1":
        FIXTURE.parent.mkdir(exist_ok=True)
        FIXTURE.write_text(json.dumps(pinned_runs, indent=1, sort_keys=True) + "\n")
        pytest.fail(f"ABPO_REPIN=1: {FIXTURE} rewritten; rerun without it")
    want = json.loads(FIXTURE.read_text())
    assert set(pinned_runs) == set(want)
    for case, got in pinned_runs.items():
        exp = want[case]
        assert got["steps"] == exp["steps"] == 2, case
        assert len(got["metrics"]) == len(exp["metrics"]) == 2, case
        for step, (g, e) in enumerate(zip(got["metrics"], exp["metrics"]), start=1):
            assert g.keys() == e.keys(), f"{case} step {step}: metric names {sorted(g.keys() ^ e.keys())} differ"
            for k in e:
                assert g[k] == e[k], f"{case} step {step}: {k} = {g[k]}, pinned {e[k]}"
        assert got["weights_sha256"] == exp["weights_sha256"], f"{case}: the trained weights differ from the pin"
    # the pins are of a run that moved: the two steps' objectives and advantages are not all zero
    assert any(float(m["abpo/advantages/abs_mean"]) > 0 for c in want.values() for m in c["metrics"])
