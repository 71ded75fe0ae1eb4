"""The trainer's reward = simulated_click (issue 49's online upper bound, abpo.train.records.ABPOSettings.reward): the
rollouts of vanilla GRPO are rewarded r_fmt + P(click | named candidate) from the rows' candidate_click_prob, the
advantages are B's group advantages of those rewards, and anything that would read the logged feedback is refused
(tiny 2-layer model; real TRL, transformers)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from abpo.algo.variants import get_variant, rollout_advantages
from abpo.train.records import ABPOSettings


def _rows_with_click_probs(update_rows):
    out = []
    for i, r in enumerate(update_rows):
        m = len(r["candidates"])
        # a distinct, known probability per candidate (row-dependent), none equal to r_match's values
        out.append({**r, "candidate_click_prob": [round(0.05 + 0.9 * ((i + 3 * j) % m) / m, 4) for j in range(m)]})
    return out


def _trainer(load_tiny, rows, update_cfg, tmp_path, settings):
    from abpo.train.dataset import to_hf_dataset
    from abpo.train.grpo_args import grpo_config
    from abpo.train.trainer import ABPOTrainer

    model, tok = load_tiny()
    args = grpo_config(update_cfg, settings.variant, output_dir=tmp_path / "ckpt", seed=0, disable_tqdm=True)
    trainer = ABPOTrainer(
        model=model, args=args, settings=settings, train_dataset=to_hf_dataset(rows), processing_class=tok
    )
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    return trainer


def test_rollouts_are_rewarded_by_the_click_probability_of_the_candidate_they_name(
    load_tiny, tiny_titles, tiny_policy_cfg, tiny_update_cfg, make_impressions, tmp_path
):
    """Item-token prompts and constrained rollouts (the presets' setting): every rollout names a candidate."""
    from abpo.train.dataset import BatchingReport, build_update_rows

    _, tok = load_tiny()
    pol = dataclasses.replace(tiny_policy_cfg, prompt_style="item_tokens")
    raw = make_impressions(tiny_titles, 4)
    built = build_update_rows([raw], tiny_titles, tok, pol, examples_per_batch=4, report=BatchingReport())
    rows = _rows_with_click_probs(built)
    u = dataclasses.replace(tiny_update_cfg, group_size=5, max_completion_length=64)
    st = ABPOSettings(
        variant="grpo",
        scoring_batch_tokens=4096,
        reward="simulated_click",
        constrained_rollouts=True,
        prompt_style="item_tokens",
    )
    torch.manual_seed(0)
    trainer = _trainer(load_tiny, rows, u, tmp_path, st)
    k = trainer.num_generations
    batch = [dict(r) for r in rows[:4] for _ in range(k)]
    out = trainer._generate_and_score_completions(batch)
    chosen = trainer._abpo_chosen_local
    rpf = trainer._abpo_rewards_per_func.float()
    r_fmt = rpf[:, 0]
    r_sim = torch.tensor([x["candidate_click_prob"][c] if c >= 0 else 0.0 for x, c in zip(batch, chosen)])
    r = (r_fmt + r_sim).view(4, k)
    y = torch.tensor([x["y"] for x in rows[:4]])
    want = rollout_advantages(get_variant("grpo"), None, r, y, None, delta=st.delta, eps_std=st.eps_std).reshape(-1)
    assert torch.allclose(out["advantages"].float(), want.float(), atol=1e-6)
    assert out["advantages"].abs().sum() > 0 and r_sim.std() > 0  # the rollouts named different candidates
    m = trainer._metrics["train"]
    assert m["abpo/reward/simulated_click_mean"][-1] == pytest.approx(float(r_sim.mean()), abs=1e-6)
    # the logged feedback is not in the reward: the same rollouts with every y flipped get the same advantages
    flipped = [{**x, "y": 1 - x["y"]} for x in batch]
    trainer._abpo_rewards_per_func = trainer._abpo_rewards_per_func  # the same gathered r_fmt
    adv_flipped, _ = trainer._abpo_advantages(flipped, out, trainer._abpo_rewards_per_func, k)
    assert torch.allclose(adv_flipped.float(), out["advantages"].float(), atol=1e-6)


def test_anything_reading_the_logged_feedback_and_a_missing_column_are_refused(
    load_tiny, update_rows, tiny_update_cfg, tmp_path
):
    rows = _rows_with_click_probs(update_rows)
    for st, match in (
        (ABPOSettings(variant="abpo", reward="simulated_click"), r"variant F \(abpo\)'s anchor"),
        (ABPOSettings(variant="grpo", reward="simulated_click", no_response_weight=0.08), "no_response_weight=0.08"),
        (ABPOSettings(variant="grpo", reward="simulated_click", click_weight=0.0), "click_weight=0.0"),
        (ABPOSettings(variant="grpo", reward="simulated_click", likelihood_weight=1.0), "likelihood_weight"),
        (ABPOSettings(variant="grpo", reward="clicks"), r"reward='clicks'; rule: one of \['logged'"),
    ):
        with pytest.raises(ValueError, match=match):
            _trainer(load_tiny, rows, tiny_update_cfg, tmp_path, st)
    with pytest.raises(ValueError, match="lacks column candidate_click_prob"):
        _trainer(
            load_tiny, update_rows, tiny_update_cfg, tmp_path, ABPOSettings(variant="grpo", reward="simulated_click")
        )
    # off by default: the rows' extra column changes nothing for the paper's reward
    assert ABPOSettings().reward == "logged"
    _trainer(load_tiny, rows, tiny_update_cfg, tmp_path, dataclasses.replace(ABPOSettings(variant="grpo")))


def test_the_column_is_carried_from_the_logged_rows_and_checked(
    tiny_titles, tiny_policy_cfg, load_tiny, make_impressions
):
    from abpo.train.dataset import BatchingReport, UpdateDataError, build_update_rows, to_hf_dataset

    _, tok = load_tiny()
    raw = make_impressions(tiny_titles, 4)
    with_p = [{**r, "candidate_click_prob": [0.1] * len(r["candidates"])} for r in raw]
    rows = build_update_rows([with_p], tiny_titles, tok, tiny_policy_cfg, examples_per_batch=4, report=BatchingReport())
    assert to_hf_dataset(rows)["candidate_click_prob"][0] == [0.1] * len(raw[0]["candidates"])
    plain = build_update_rows([raw], tiny_titles, tok, tiny_policy_cfg, examples_per_batch=4, report=BatchingReport())
    assert "candidate_click_prob" not in to_hf_dataset(plain).column_names
    bad = [{**with_p[0], "candidate_click_prob": [0.1]}, *with_p[1:]]
    with pytest.raises(
        UpdateDataError, match=r"impression imp-0-0: candidate_click_prob .* one probability in \[0, 1\]"
    ):
        build_update_rows([bad], tiny_titles, tok, tiny_policy_cfg, examples_per_batch=4, report=BatchingReport())
    with pytest.raises(UpdateDataError, match="on some rows only"):
        to_hf_dataset([rows[0], plain[1]])
