"""The update on CUDA gives the CPU's result: two optimizer steps of variant F (abpo) on the tiny fixtures, the
item-token policy with constrained rollouts (the CPU preset's path), run once on the CPU in float32 and once on the
GPU, in float32 and in bf16 mixed precision (update.bf16, the `gpu` preset's), from the same weights and seed.

Rollouts are greedy (update.greedy_rollouts: the argmax of Eq. q), so that both devices train on the same rollouts
without sharing a random generator (CPU and CUDA draw different streams from one seed). Compared: the per-step
metrics the update logs (objective, advantages, SNIPS weights, rewards, entropy, gradient norm) and the weight change
of every trained parameter, ||dW_cuda - dW_cpu|| / ||dW_cpu||.

Tolerances, from the first run on an H100 (docs/gpu.md; seen in brackets): the metrics to rel 1e-4 in float32
[6e-6] and 1e-2 in bf16 [1e-3]. The weight change to 0.1 in float32 [0.046, the embedding] and 0.25 in bf16 [0.12]:
AdamW's first steps move each weight by about lr * sign(gradient), so a gradient component that is a sum of
near-cancelling terms (an item token's embedding row) moves the other way when the two devices add in another order;
the metrics of step 2, computed with the weights step 1 moved, agree to the tolerances above. A changed computation
(an advantage of the wrong sign, another anchor) moves the weight change by 1 and more.

Runs on CUDA only; skipped elsewhere (CI has no GPU). scripts/gpu-check.sh runs it on the GPU machine."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device (torch.cuda.is_available() is False on this machine); scripts/gpu-check.sh runs it "
    "on the GPU machine",
)

COMPARED = (
    "loss",
    "grad_norm",
    "entropy",
    "abpo/objective",
    "abpo/advantages/mean",
    "abpo/advantages/abs_mean",
    "abpo/advantages/min",
    "abpo/advantages/max",
    "abpo/snips/ess",
    "abpo/snips/w_max",
    "abpo/snips/e_old_mean",
    "abpo/reward/total_mean",
    "abpo/match_rate/positive",
    "abpo/match_rate/no_response",
)
TOL = {"float32": (1e-4, 1e-6, 0.1), "bf16": (1e-2, 1e-3, 0.25)}  # metrics rel, metrics abs, weight change rel


def _run(device: str, bf16: bool, load_tiny, rows, update_cfg, tmp_path, monkeypatch) -> dict:
    from abpo.train import distributed
    from abpo.train.dataset import to_hf_dataset
    from abpo.train.records import ABPOSettings
    from abpo.train.update import train_update

    # the CPU run on a machine with a GPU: abpo (grpo_args: use_cpu) asks abpo.train.distributed.cuda_available
    monkeypatch.setattr(distributed, "cuda_available", lambda: device == "cuda")
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # a process-wide singleton: it would keep the last device
    torch.manual_seed(0)
    model, tok = load_tiny()
    before = {n: p.detach().double().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}
    u = dataclasses.replace(update_cfg, bf16=bf16, greedy_rollouts=True, max_steps=2, save_steps=10)
    settings = ABPOSettings(
        variant="abpo",
        lambda_sc=0.5,
        scoring_batch_tokens=4096,
        constrained_rollouts=True,
        prompt_style="item_tokens",
        self_certainty_positions="answer",
    )
    trainer, _ = train_update(
        model,
        tok,
        to_hf_dataset(rows),
        u,
        settings,
        output_dir=tmp_path / f"{device}-{'bf16' if bf16 else 'fp32'}",
        seed=0,
        resume=False,
        grpo_overrides={"disable_tqdm": True},
        item_popularity={a: 1 + a % 7 for r in rows for a in r["candidates"]},
        quiet=True,
    )
    trained = trainer.accelerator.unwrap_model(trainer.model)
    assert next(trained.parameters()).device.type == device, "the update ran on another device than asked"
    steps = [h for h in trainer.state.log_history if "abpo/advantages/mean" in h]
    delta = {n: p.detach().double().cpu() - before[n] for n, p in trained.named_parameters() if n in before}
    return {"steps": steps, "delta": delta}


@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_the_update_on_cuda_matches_the_cpu(
    precision, load_tiny, item_update_rows, tiny_update_cfg, tmp_path, monkeypatch
):
    u = dataclasses.replace(tiny_update_cfg, group_size=5, max_completion_length=64)
    cpu = _run("cpu", False, load_tiny, item_update_rows, u, tmp_path, monkeypatch)
    gpu = _run("cuda", precision == "bf16", load_tiny, item_update_rows, u, tmp_path, monkeypatch)
    rel, abs_, w_rel = TOL[precision]
    assert len(cpu["steps"]) == len(gpu["steps"]) == 2
    report = []
    for step, (c, g) in enumerate(zip(cpu["steps"], gpu["steps"]), start=1):
        for k in COMPARED:
            report.append((step, k, float(c[k]), float(g[k])))
    worst = max(abs(g - c) / max(abs(c), abs_ / rel) for _, _, c, g in report)
    changes = {
        n: float((gpu["delta"][n] - d).norm() / d.norm().clamp_min(1e-12))
        for n, d in cpu["delta"].items()
        if float(d.norm()) > 0
    }
    print(f"\n{precision}: worst metric rel diff {worst:.2e}; weight change rel diff max {max(changes.values()):.2e}")
    for step, k, c, g in report:
        print(f"  step {step} {k:<28} cpu {c:+.6e} cuda {g:+.6e}")
    for step, k, c, g in report:
        assert g == pytest.approx(c, rel=rel, abs=abs_), f"{precision} step {step}: {k} cuda {g} vs cpu {c}"
    assert changes, "the update moved no weight"
    bad = {n: v for n, v in changes.items() if v > w_rel}
    assert not bad, f"{precision}: weight changes differ beyond {w_rel}: {bad}"
