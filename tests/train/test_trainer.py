"""ABPOTrainer: reward functions, the advantages it writes for each variant, e_old and self-certainty, and
end-to-end training with checkpoints (tiny 2-layer model; real TRL, transformers, peft)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from abpo.algo.advantages import anchored_advantages, group_advantages
from abpo.algo.rewards import anchor_reward, self_certainty
from abpo.algo.variants import get_variant
from abpo.train.records import ABPOSettings, CandidateSet, rollouts_per_example
from abpo.train.rewards import format_reward, match_reward


def _as_completion(text):
    return [{"role": "assistant", "content": text}]


def test_reward_functions_by_hand():
    cands = [[5, 7, 9]] * 4
    texts = [
        "<item_id>7</item_id><item>Seven</item>",  # well formed, = a_log
        "<item_id>9</item_id><item>Nine</item>",  # well formed, != a_log
        "<item_id>4</item_id><item>Four</item>",  # id not in C: malformed
        "7 please",  # malformed
    ]
    comps = [_as_completion(t) for t in texts]
    assert format_reward(None, comps, cands) == [1.0, 1.0, 0.0, 0.0]
    # click: +1 for matching a_log
    assert match_reward(None, comps, cands, a_log=[7] * 4, y=[1] * 4) == [1.0, 0.0, 0.0, 0.0]
    # no response: -1 for matching a_log
    assert match_reward(None, comps, cands, a_log=[7] * 4, y=[0] * 4) == [-1.0, 0.0, 0.0, 0.0]
    # plain-string completions (non-conversational datasets) work too
    assert format_reward(None, texts[:1], cands[:1]) == [1.0]


def test_rollouts_per_example():
    assert rollouts_per_example("abpo", 16) == 15  # anchor + G-1 rollouts
    assert rollouts_per_example("grpo", 16) == 16  # vanilla GRPO samples all G
    assert rollouts_per_example("C", 4) == 3
    with pytest.raises(ValueError, match="at least 2 rollouts"):
        rollouts_per_example("abpo", 2)


def _make(load_tiny, rows, update_cfg, tmp_path, variant, **overrides):
    from abpo.train.dataset import to_hf_dataset
    from abpo.train.grpo_args import grpo_config
    from abpo.train.trainer import ABPOTrainer

    model, tok = load_tiny()
    args = grpo_config(
        update_cfg, variant, output_dir=tmp_path / f"ckpt-{variant}", seed=0, disable_tqdm=True, **overrides
    )
    trainer = ABPOTrainer(
        model=model,
        args=args,
        settings=ABPOSettings(variant=variant, lambda_sc=0.5, scoring_batch_tokens=4096),
        train_dataset=to_hf_dataset(rows),
        processing_class=tok,
    )
    return trainer, tok


def test_trainer_refuses_shuffled_data_and_variant_a(load_tiny, update_rows, tiny_update_cfg, tmp_path):
    with pytest.raises(ValueError, match="shuffle_dataset must be False"):
        _make(load_tiny, update_rows, tiny_update_cfg, tmp_path, "abpo", shuffle_dataset=True)
    with pytest.raises(ValueError, match="variant A performs no update"):
        _make(load_tiny, update_rows, tiny_update_cfg, tmp_path, "none")


def _batch(trainer, rows):
    k = trainer.num_generations
    return [dict(r) for r in rows for _ in range(k)]


def test_anchor_variant_advantages_by_hand(load_tiny, update_rows, tiny_update_cfg, tmp_path):
    """(C): w = 1, no self-certainty. The advantages TRL will use are anchored_advantages of the gathered rollout
    rewards r = r_match + r_fmt and the anchor rewards 2 (y=1) / 0 (y=0), not TRL's own group advantages."""
    torch.manual_seed(0)
    trainer, _ = _make(load_tiny, update_rows, tiny_update_cfg, tmp_path, "anchor")
    batch = _batch(trainer, update_rows[:4])
    trainer.model.train()
    out = trainer._generate_and_score_completions(batch)
    k = trainer.num_generations
    rpf = trainer._abpo_rewards_per_func
    r_roll = (rpf[:, 0] + rpf[:, 1]).view(-1, k)
    y = torch.tensor([r["y"] for r in update_rows[:4]])
    r_log = anchor_reward(y, None, 0.0)
    assert r_log.tolist() == [2.0 if v else 0.0 for v in y.tolist()]
    expected = anchored_advantages(r_log, r_roll, torch.ones(4), 1e-4).reshape(-1)
    assert torch.allclose(out["advantages"], expected, atol=1e-6)


def test_e_old_and_self_certainty_match_direct_computation(load_tiny, update_rows, tiny_update_cfg, tmp_path):
    """e_old from the trainer = e_p of the policy helper's scorer on the chat-rendered prompt; the batched,
    padded self-certainty = an unpadded forward per sequence through abpo.algo.rewards.self_certainty."""
    from abpo.policy.prompt import encode_answer, encode_prompt, render_chat
    from abpo.policy.scoring import propensity_of

    trainer, tok = _make(load_tiny, update_rows, tiny_update_cfg, tmp_path, "abpo")
    row = update_rows[1]
    text = render_chat(tok, row["prompt"][0]["content"])
    p_ids = encode_prompt(tok, text)
    e_old = trainer._e_old(p_ids, row["candidate_answers"], row["candidates"], row["a_log"])
    j = row["candidates"].index(row["a_log"])
    ref = propensity_of(trainer.model, tok, [text], [row["candidate_answers"]], [j], tau=1.0, batch_tokens=4096)
    assert e_old == pytest.approx(float(ref[0]), rel=1e-5)

    pairs = []
    for r in update_rows[:3]:
        pairs.append(
            (encode_prompt(tok, render_chat(tok, r["prompt"][0]["content"])), encode_answer(tok, r["anchor_text"]))
        )
    pairs.append((pairs[0][0], pairs[0][1][:3]))  # a short completion: padding of different lengths
    got = trainer._self_certainty(pairs)
    model = trainer.model
    for (p, c), val in zip(pairs, got):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + c])).logits[:, len(p) - 1 : len(p) + len(c) - 1]
        ref = self_certainty(logits, torch.ones(1, len(c)))
        assert val == pytest.approx(float(ref[0]), rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("positions", ["choice", "answer"])
def test_rollout_self_certainty_recorded_during_generation_equals_a_forward_pass(
    load_tiny, update_rows, tiny_update_cfg, tmp_path, positions
):
    """r_sc of the rollouts comes from the logits HF generate sampled them from (LM-head hook), with no extra
    forward; it must equal the padded forward pass over prompt + completion (`_self_certainty`) over the positions
    of update.self_certainty_positions (answer: every completion token), and a variant without self-certainty
    records nothing."""
    torch.manual_seed(0)
    trainer, _ = _make(load_tiny, update_rows, tiny_update_cfg, tmp_path, "abpo")
    trainer.abpo = dataclasses.replace(trainer.abpo, self_certainty_positions=positions)
    batch = _batch(trainer, update_rows[:4])
    trainer.model.train()
    out = trainer._generate_and_score_completions(batch)
    recorded = trainer._abpo_rollout_sc
    assert recorded is not None and len(recorded) == len(batch)
    p_ids = [r[m.bool()].tolist() for r, m in zip(out["prompt_ids"], out["prompt_mask"])]
    c_ids = [r[m.bool()].tolist() for r, m in zip(out["completion_ids"], out["completion_mask"])]
    assert len({len(c) for c in c_ids}) > 1 or max(len(c) for c in c_ids) > 1  # real completions, not empty
    forward = trainer._self_certainty(list(zip(p_ids, c_ids)), batch)  # over each row's positions
    assert recorded == pytest.approx(forward, rel=1e-4, abs=1e-5)
    every_token = trainer._self_certainty(list(zip(p_ids, c_ids)))  # no rows: every completion token
    if positions == "answer":
        assert recorded == pytest.approx(every_token, rel=1e-4, abs=1e-5)

    trainer_c, _ = _make(load_tiny, update_rows, tiny_update_cfg, tmp_path, "anchor")
    trainer_c.model.train()
    trainer_c._generate_and_score_completions(_batch(trainer_c, update_rows[:4]))
    assert trainer_c._abpo_rollout_sc is None


def test_b_and_f_give_different_advantages_on_the_same_rollouts(load_tiny, update_rows, tiny_update_cfg, tmp_path):
    """The same generation batch (same rollouts, same rewards) scored as ABPO (F) and as vanilla GRPO (B)."""
    torch.manual_seed(0)
    trainer, _ = _make(load_tiny, update_rows, tiny_update_cfg, tmp_path, "abpo")
    batch = _batch(trainer, update_rows[:4])
    trainer.model.train()
    out = trainer._generate_and_score_completions(batch)
    adv_f = out["advantages"].clone()
    rpf = trainer._abpo_rewards_per_func
    trainer.variant = get_variant("grpo")
    adv_b, metrics = trainer._abpo_advantages(batch, out, rpf, trainer.num_generations)
    k = trainer.num_generations
    assert torch.allclose(adv_b, group_advantages((rpf[:, 0] + rpf[:, 1]).view(-1, k), 1e-4).reshape(-1))
    assert not torch.allclose(adv_f, adv_b), "ABPO and vanilla GRPO advantages should differ on the same batch"
    assert "abpo/snips/w_mean" not in metrics  # B has no SNIPS


@pytest.mark.slow
def test_train_b_and_f_save_reloadable_lora(load_tiny, update_rows, tiny_update_cfg, tmp_path):
    """Variants B and F train for two optimizer steps each; the logged advantages differ and the saved LoRA
    adapter reloads onto the base model with identical logits."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from abpo.config.policy import PolicyConfig
    from abpo.policy.model import lora_config
    from abpo.train.dataset import to_hf_dataset
    from abpo.train.update import save_update, train_update

    logged = {}
    for variant in ("grpo", "abpo"):
        model, tok = load_tiny()
        u = dataclasses.replace(tiny_update_cfg, max_steps=2, save_steps=10)
        trainer, _ = train_update(
            model,
            tok,
            to_hf_dataset(update_rows),
            u,
            ABPOSettings(variant=variant, scoring_batch_tokens=4096),
            output_dir=tmp_path / variant,
            seed=0,
            peft_config=lora_config(PolicyConfig(lora_r=4, lora_alpha=8)),
            resume=False,
            grpo_overrides={"disable_tqdm": True},
        )
        assert trainer.state.global_step == 2
        logs = [h for h in trainer.state.log_history if "abpo/advantages/mean" in h]
        assert len(logs) == 2
        logged[variant] = [(h["abpo/advantages/mean"], h["abpo/advantages/std"]) for h in logs]
        adapter_dir, merged_dir = save_update(trainer, tok, tmp_path / variant, save_merged=True)
        assert (adapter_dir / "adapter_config.json").exists() and (merged_dir / "config.json").exists()

        ids = torch.tensor([tok("<|bos|><|user|>hello<|end|><|assistant|>", add_special_tokens=False)["input_ids"]])
        trained = trainer.accelerator.unwrap_model(trainer.model).eval()
        with torch.no_grad():
            want = trained(input_ids=ids).logits
        base, _ = load_tiny()
        reloaded = PeftModel.from_pretrained(base, adapter_dir).eval()
        merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
        with torch.no_grad():
            assert torch.allclose(reloaded(input_ids=ids).logits, want, atol=1e-5)
            assert torch.allclose(merged(input_ids=ids).logits, want, atol=1e-4)
        if variant == "abpo":
            # the untrained model's rollouts all score 0: GRPO's group-normalised advantages are then all 0 (no
            # gradient), while the anchor still gives ABPO a learning signal
            lora_b = [p for n, p in trained.named_parameters() if "lora_B" in n]
            assert any(p.abs().sum() > 0 for p in lora_b), "LoRA B is still zero: no update happened"
    assert logged["grpo"] != logged["abpo"]
    # vanilla GRPO advantages are centred on the rollouts' own mean; ABPO's are not (the anchor shifts them)
    assert all(abs(m) < 1e-5 for m, _ in logged["grpo"])


@pytest.mark.slow
def test_interrupted_update_resumes_to_the_same_result(load_tiny, update_rows, tiny_update_cfg, tmp_path):
    """Four steps uninterrupted vs. stopped after step 2 (checkpoint) and resumed: identical adapter weights."""
    from abpo.config.policy import PolicyConfig
    from abpo.policy.model import lora_config
    from abpo.train.callbacks import StopAfterStepCallback
    from abpo.train.dataset import to_hf_dataset
    from abpo.train.update import train_update

    rows = update_rows + [dict(r, request_id=r["request_id"] + "-b") for r in update_rows]  # 4 batches of 4
    u = dataclasses.replace(tiny_update_cfg, max_steps=4, save_steps=2, save_total_limit=0)
    peft = lora_config(PolicyConfig(lora_r=4, lora_alpha=8))
    settings = ABPOSettings(variant="abpo", scoring_batch_tokens=4096)

    def weights(trainer):
        m = trainer.accelerator.unwrap_model(trainer.model)
        return {n: p.detach().clone() for n, p in m.named_parameters() if "lora_" in n}

    model, tok = load_tiny()
    full, _ = train_update(
        model,
        tok,
        to_hf_dataset(rows),
        u,
        settings,
        output_dir=tmp_path / "full",
        seed=0,
        peft_config=peft,
        resume=False,
        grpo_overrides={"disable_tqdm": True},
    )
    model, tok = load_tiny()
    part, _ = train_update(
        model,
        tok,
        to_hf_dataset(rows),
        u,
        settings,
        output_dir=tmp_path / "cut",
        seed=0,
        peft_config=peft,
        resume=False,
        callbacks=[StopAfterStepCallback(2)],
        grpo_overrides={"disable_tqdm": True},
    )
    assert part.state.global_step == 2
    assert (tmp_path / "cut" / "checkpoints" / "checkpoint-2").is_dir()
    model, tok = load_tiny()
    resumed, resumed_from = train_update(
        model,
        tok,
        to_hf_dataset(rows),
        u,
        settings,
        output_dir=tmp_path / "cut",
        seed=0,
        peft_config=peft,
        resume=True,
        grpo_overrides={"disable_tqdm": True},
    )
    assert resumed_from and resumed_from.endswith("checkpoint-2")
    assert resumed.state.global_step == 4
    a, b = weights(full), weights(resumed)
    assert a.keys() == b.keys() and a
    for n in a:
        assert torch.equal(a[n], b[n]), f"{n} differs between the uninterrupted and the resumed update"
    # and the run really moved the weights between step 2 and step 4
    assert any(not torch.equal(weights(part)[n], a[n]) for n in a)


def test_metrics_reach_mlflow_every_step(load_tiny, update_rows, tiny_update_cfg, tmp_path):
    """The issue's per-step metrics land in a real (SQLite) MLflow run through MLflowStepCallback."""
    import mlflow
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.config import load_config
    from abpo.train.dataset import to_hf_dataset
    from abpo.train.update import train_update

    cfg = load_config("tiny", [f"paths.root={tmp_path / 'var'}"])
    model, tok = load_tiny()
    u = dataclasses.replace(tiny_update_cfg, max_steps=2, save_steps=10)
    with registry.start_run(cfg, "test-update", "update-F") as run:
        train_update(
            model,
            tok,
            to_hf_dataset(update_rows),
            u,
            ABPOSettings(variant="abpo", scoring_batch_tokens=4096),
            output_dir=tmp_path / "out",
            seed=0,
            resume=False,
            grpo_overrides={"disable_tqdm": True},
        )
    client = MlflowClient()
    keys = [
        "rewards/format_reward/mean",
        "rewards/match_reward/mean",
        "abpo/reward/self_certainty_mean",
        "abpo/reward/total_mean",
        "abpo/reward/anchor_mean",
        "abpo/match_rate/positive",
        "abpo/match_rate/no_response",
        "abpo/snips/w_mean",
        "abpo/snips/w_max",
        "abpo/snips/ess",
        "abpo/advantages/mean",
        "abpo/advantages/std",
        "entropy",
        "step_time",
        # the diagnostics of docs/diagnostics.md that are defined even when no rollout names a candidate
        "abpo/w_p50",
        "abpo/w_p90",
        "abpo/w_p99",
        "abpo/w_max",
        "abpo/w_ess",
        "abpo/w_ess_share",
        "abpo/zero_spread_share",
        "abpo/r_sc_group_std",
    ]
    for key in keys:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert steps == [1, 2], f"{key}: logged at steps {steps}"
    assert mlflow.active_run() is None


# ------------------------------------------------------------------------------------ item-token policy


@pytest.fixture
def item_rows(item_update_rows, item_policy_cfg):
    """The update_rows of 8 logged examples with the item_tokens prompt, and that policy config."""
    return item_update_rows, item_policy_cfg


def _make_items(load_tiny, rows, update_cfg, tmp_path, variant):
    from abpo.train.dataset import to_hf_dataset
    from abpo.train.grpo_args import grpo_config
    from abpo.train.trainer import ABPOTrainer

    model, tok = load_tiny()
    u = dataclasses.replace(update_cfg, max_completion_length=64)
    args = grpo_config(u, variant, output_dir=tmp_path / f"ckpt-{variant}", seed=0, disable_tqdm=True)
    settings = ABPOSettings(
        variant=variant, lambda_sc=0.5, scoring_batch_tokens=4096, constrained_rollouts=True, prompt_style="item_tokens"
    )
    return ABPOTrainer(
        model=model, args=args, settings=settings, train_dataset=to_hf_dataset(rows), processing_class=tok
    ), tok


def test_item_token_rollouts_e_old_and_self_certainty(load_tiny, item_rows, tiny_update_cfg, tmp_path, tiny_titles):
    """With the item_tokens prompt: rollouts are whole well-formed answers of the row's candidates (one forward,
    the forced title appended), the recorded r_sc is KL(U || pi(.|q)) at the item token (= the forward pass over
    the choice positions), and e_old is softmax over C of the item tokens' log-probs (= score_examples)."""
    from abpo.algo.rewards import token_kl_from_uniform
    from abpo.policy.prompt import check_item_tokens, encode_prompt, parse_answer, render_chat
    from abpo.policy.scoring import candidate_propensities

    rows, pol = item_rows
    torch.manual_seed(0)
    trainer, tok = _make_items(load_tiny, rows, tiny_update_cfg, tmp_path, "abpo")
    batch = _batch(trainer, rows[:4])
    trainer.model.train()
    out = trainer._generate_and_score_completions(batch)
    c_ids = [r[m.bool()].tolist() for r, m in zip(out["completion_ids"], out["completion_mask"])]
    p_ids = [r[m.bool()].tolist() for r, m in zip(out["prompt_ids"], out["prompt_mask"])]
    for row, c in zip(batch, c_ids):
        assert c[-1] == tok.eos_token_id
        assert parse_answer(tok.decode(c[:-1]), {a: tiny_titles[a] for a in row["candidates"]}).well_formed
    recorded = trainer._abpo_rollout_sc
    assert recorded == pytest.approx(trainer._self_certainty(list(zip(p_ids, c_ids)), batch), rel=1e-4, abs=1e-5)
    with torch.no_grad():
        z = trainer.model(input_ids=torch.tensor([p_ids[0]])).logits[:, -1]
    assert recorded[0] == pytest.approx(float(token_kl_from_uniform(z)[0]), rel=1e-4)

    row = rows[1]
    p = encode_prompt(tok, render_chat(tok, row["prompt"][0]["content"]))
    e_old = trainer._e_old(p, row["candidate_answers"], row["candidates"], row["a_log"])
    # the same prompt the trainer row holds, scored by the policy helper: log p(item token | q), softmax over C
    with torch.no_grad():
        logp = torch.log_softmax(trainer.model(input_ids=torch.tensor([p])).logits[0, -1].float(), -1)
    s = logp[check_item_tokens(tok, row["candidates"])]
    want = candidate_propensities(s, 1.0)[list(row["candidates"]).index(row["a_log"])]
    assert e_old == pytest.approx(float(want), rel=1e-5)


@pytest.mark.parametrize("how", ["full", "lora_embeddings", "lora"])
def test_update_moves_the_item_embeddings_when_configured(load_tiny, item_rows, tiny_update_cfg, tmp_path, how):
    """Full fine-tuning (policy.lora_r = 0) and LoRA with policy.lora_train_embeddings train the (tied) item
    embeddings and LM head; a LoRA on attention and MLP alone leaves them where they were."""
    from abpo.policy.model import lora_config
    from abpo.train.dataset import to_hf_dataset
    from abpo.train.update import train_update

    rows, pol = item_rows
    model, tok = load_tiny()
    before = model.get_input_embeddings().weight.detach().clone()
    cfg = {
        "full": dataclasses.replace(pol, lora_r=0),
        "lora_embeddings": dataclasses.replace(pol, lora_r=4, lora_alpha=8, lora_train_embeddings=True),
        "lora": dataclasses.replace(pol, lora_r=4, lora_alpha=8),
    }[how]
    u = dataclasses.replace(tiny_update_cfg, max_steps=2, save_steps=10, learning_rate=5e-2, max_completion_length=64)
    settings = ABPOSettings(
        variant="abpo", scoring_batch_tokens=4096, constrained_rollouts=True, prompt_style="item_tokens"
    )
    trainer, _ = train_update(
        model,
        tok,
        to_hf_dataset(rows),
        u,
        settings,
        output_dir=tmp_path / how,
        seed=0,
        peft_config=lora_config(cfg),
        resume=False,
        grpo_overrides={"disable_tqdm": True},
    )
    trained = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(trained, "merge_and_unload"):
        trained = trained.merge_and_unload()
    after = trained.get_input_embeddings().weight.detach()
    head = trained.get_output_embeddings().weight.detach()
    moved = float((after - before).abs().max())
    if how == "lora":
        assert moved == 0.0
    else:
        assert moved > 0.0
        torch.testing.assert_close(after, head)  # still tied


# ------------------------------------------------------------------------------ diagnostics (docs/diagnostics.md)


def _items_trainer(load_tiny, rows, update_cfg, tmp_path, variant, positions="choice", sharpen=1.0):
    """An item-token trainer with constrained rollouts; ``sharpen`` scales the final norm, i.e. every logit (the
    untrained fixture model is nearly uniform over its vocabulary: r_sc ~ 0.006 at every token)."""
    from abpo.train.dataset import to_hf_dataset
    from abpo.train.grpo_args import grpo_config
    from abpo.train.trainer import ABPOTrainer

    model, tok = load_tiny()
    with torch.no_grad():
        model.get_decoder().norm.weight.mul_(sharpen)
    u = dataclasses.replace(update_cfg, max_completion_length=64)
    args = grpo_config(u, variant, output_dir=tmp_path / f"ckpt-{variant}-{positions}", seed=0, disable_tqdm=True)
    settings = ABPOSettings(
        variant=variant,
        lambda_sc=0.5,
        scoring_batch_tokens=4096,
        constrained_rollouts=True,
        prompt_style="item_tokens",
        self_certainty_positions=positions,
    )
    trainer = ABPOTrainer(
        model=model,
        args=args,
        settings=settings,
        train_dataset=to_hf_dataset(rows),
        processing_class=tok,
        item_popularity={a: 1 + a % 7 for r in rows for a in r["candidates"]},
    )
    trainer.model.train()
    return trainer


def _step(trainer, rows):
    torch.manual_seed(0)
    out = trainer._generate_and_score_completions(_batch(trainer, rows))
    return out, {k: v[-1] for k, v in trainer._metrics["train"].items()}


def test_self_certainty_positions_choice_vs_answer(load_tiny, item_rows, tiny_update_cfg, tmp_path):
    """update.self_certainty_positions: with ``choice`` r_sc of an item-token model is KL(U || pi(.|q)) at the item
    token, the same for every rollout of a group and for the anchor, so E's advantages equal C's on the same
    rollouts; with ``answer`` it averages every answer token (title and EOS included), varies within a group and
    E's advantages differ from C's."""
    rows, _ = item_rows
    tiny_update_cfg = dataclasses.replace(tiny_update_cfg, group_size=6)  # 5 rollouts: groups with 3+ distinct rewards
    c_out, _ = _step(_items_trainer(load_tiny, rows, tiny_update_cfg, tmp_path, "anchor", sharpen=20.0), rows[:4])
    e_choice = _items_trainer(load_tiny, rows, tiny_update_cfg, tmp_path, "anchor_sc", "choice", sharpen=20.0)
    ec_out, ec_m = _step(e_choice, rows[:4])
    e_answer = _items_trainer(load_tiny, rows, tiny_update_cfg, tmp_path, "anchor_sc", "answer", sharpen=20.0)
    ea_out, ea_m = _step(e_answer, rows[:4])
    assert torch.equal(c_out["completion_ids"], ec_out["completion_ids"])  # the same rollouts in all three
    assert torch.equal(c_out["completion_ids"], ea_out["completion_ids"])
    assert ec_m["abpo/r_sc_group_std"] < 1e-6 and ea_m["abpo/r_sc_group_std"] > 1e-3
    assert torch.allclose(ec_out["advantages"], c_out["advantages"], atol=1e-5)
    assert (ea_out["advantages"] - c_out["advantages"]).abs().max() > 1e-2
    # answer's r_sc is the mean over every completion token: the forward pass with an all-ones mask
    p_ids = [r[m.bool()].tolist() for r, m in zip(ea_out["prompt_ids"], ea_out["prompt_mask"])]
    c_ids = [r[m.bool()].tolist() for r, m in zip(ea_out["completion_ids"], ea_out["completion_mask"])]
    batch = _batch(e_answer, rows[:4])
    neg = [i for i, x in enumerate(batch) if int(x["y"]) == 0]
    full = e_answer._self_certainty([(p_ids[i], c_ids[i]) for i in neg])  # no rows: every token counts
    assert len(c_ids[neg[0]]) > 2
    assert ea_m["abpo/reward/self_certainty_mean"] == pytest.approx(sum(full) / len(full), rel=1e-4)
    # the correlations over the update so far: r_sc vs the chosen item's popularity and title length
    assert -1.0 <= ea_m["abpo/r_sc_corr_title_len"] <= 1.0 and -1.0 <= ea_m["abpo/r_sc_corr_popularity"] <= 1.0
    assert len(e_answer._abpo_sc_trace["r_sc"]) == len(neg)
    with pytest.raises(ValueError, match="self_certainty_positions='all'"):
        _items_trainer(load_tiny, rows, tiny_update_cfg, tmp_path, "abpo", "all")


@pytest.mark.parametrize("variant", ["abpo", "grpo"])
def test_item_token_generation_batch_runs_each_prompt_once(load_tiny, item_rows, tiny_update_cfg, tmp_path, variant):
    """With one token per item id the rollouts (Eq. q), e_old (Eq. s_p on the item token, every variant: B's
    diagnostics) and r_sc at the choice position (the rollouts' and the anchors') all read pi_old's next-token logits
    after each prompt: scoring a generation batch runs the decoder over each of its distinct prompts once, and e_old
    and the anchors' r_sc equal the policy scorer's own forward passes."""
    rows, _ = item_rows
    trainer = _items_trainer(load_tiny, rows, dataclasses.replace(tiny_update_cfg, group_size=5), tmp_path, variant)
    decoder = trainer.accelerator.unwrap_model(trainer.model).get_decoder()
    fed = []
    hook = decoder.register_forward_pre_hook(lambda _m, _a, kw: fed.append(kw["input_ids"].shape[0]), with_kwargs=True)
    try:
        out, metrics = _step(trainer, rows[:4])
    finally:
        hook.remove()
    assert sum(fed) == 4  # 4 logged examples, 16 rollouts: each prompt once
    assert trainer._abpo_prompt_logits is None  # pi_old's logits do not outlive the generation batch
    batch = _batch(trainer, rows[:4])
    k = trainer.num_generations
    firsts = batch[::k]
    p_ids = [r[m.bool()].tolist() for r, m in zip(out["prompt_ids"], out["prompt_mask"])][::k]
    items = [CandidateSet(p, x["candidate_answers"], x["candidates"]) for p, x in zip(p_ids, firsts)]
    e_old = [
        float(d[list(x["candidates"]).index(x["a_log"])]) for d, x in zip(trainer.scorer.e_old_dists(items), firsts)
    ]
    if variant == "abpo":
        assert metrics["abpo/snips/e_old_mean"] == pytest.approx(sum(e_old) / len(e_old), rel=1e-6)
        eos = trainer.scorer.tokenizer.eos_token_id
        y = torch.tensor([int(x["y"]) for x in firsts])
        pairs = [(p, trainer.answers.ids(x["anchor_text"]) + [eos]) for p, x in zip(p_ids, firsts)]
        sc = torch.tensor(trainer._self_certainty(pairs, firsts)) * (y == 0)  # the forward over prompt + answer
        r_log = anchor_reward(y, sc, trainer.abpo.lambda_sc)
        assert metrics["abpo/reward/anchor_mean"] == pytest.approx(float(r_log.mean()), rel=1e-5)
        assert metrics["abpo/reward/anchor_mean"] != pytest.approx(float(anchor_reward(y, sc * 0, 0.5).mean()))
    else:
        assert metrics["abpo/w_max"] == pytest.approx(max(e / float(x["e0"]) for e, x in zip(e_old, firsts)), 1e-6)


def test_step_diagnostics_b_against_f_on_the_same_weights(load_tiny, item_rows, tiny_update_cfg, tmp_path):
    """Every variant logs the SNIPS weight summary of the step's logged rows (B too: the weights it ignores), and
    the gradient diagnostics against vanilla GRPO on its own rollouts: B against itself is gamma = cos = 1; F's
    weights are those its SNIPS step uses; gamma recomputed by hand from the rollouts and e_old."""
    from abpo.algo.advantages import group_advantages
    from abpo.algo.diagnostics import gamma_ratio, log_odds_push

    rows, _ = item_rows
    tiny_update_cfg = dataclasses.replace(tiny_update_cfg, group_size=8)  # enough rollouts to choose a^log
    b_trainer = _items_trainer(load_tiny, rows, tiny_update_cfg, tmp_path, "grpo")
    _, b = _step(b_trainer, rows[:4])
    f_trainer = _items_trainer(load_tiny, rows, tiny_update_cfg, tmp_path, "abpo")
    f_out, f = _step(f_trainer, rows[:4])
    keys = ["abpo/w_p50", "abpo/w_p90", "abpo/w_p99", "abpo/w_max", "abpo/w_ess", "abpo/w_ess_share"]
    for key in keys:
        assert b[key] == pytest.approx(f[key], rel=1e-6), key  # the same model and log: the same weights
    assert f["abpo/w_max"] == pytest.approx(f["abpo/snips/w_max"], rel=1e-6)
    assert f["abpo/w_ess_share"] == pytest.approx(f["abpo/snips/ess_fraction"], rel=1e-6)
    assert 0.0 <= f["abpo/zero_spread_share"] <= 1.0
    assert b["abpo/gamma_ratio"] == pytest.approx(1.0)  # (seeded: some rollout chose a^log in a group with spread)
    assert b["abpo/grad_cosine_vs_grpo"] == pytest.approx(1.0)
    assert -1.0 <= f["abpo/grad_cosine_vs_grpo"] <= 1.0

    # gamma of F by hand: pushes on a_log under F's advantages and under B's of B's rewards on F's rollouts
    batch = _batch(f_trainer, rows[:4])
    k = f_trainer.num_generations
    rpf = f_trainer._abpo_rewards_per_func
    r_b = (rpf[:, 0] + rpf[:, 1]).view(-1, k)
    adv_b = group_advantages(r_b, f_trainer.abpo.eps_std)
    adv_f = f_out["advantages"].view(-1, k)
    chosen = torch.tensor(f_trainer._abpo_chosen_local).view(-1, k)
    a_log = [list(batch[g * k]["candidates"]).index(batch[g * k]["a_log"]) for g in range(len(batch) // k)]
    pf = [log_odds_push(chosen[g], adv_f[g], a_log[g]) for g in range(len(a_log))]
    pb = [log_odds_push(chosen[g], adv_b[g], a_log[g]) for g in range(len(a_log))]
    assert f["abpo/gamma_ratio"] == pytest.approx(gamma_ratio(pf, pb), rel=1e-5)
    assert f["abpo/gamma_ratio"] != pytest.approx(1.0)  # the anchor changed the push on a^log


def test_step_diagnostics_with_a_request_drawn_twice_into_one_batch(load_tiny, item_rows, tiny_update_cfg, tmp_path):
    """A generation batch holding the same logged request twice (batch planning may repeat a row of the smaller
    stratum) has two groups and one record of the policy's candidate distribution: the diagnostics share it instead
    of failing (a StopIteration stopped a 6-round experiment in its 53rd cell)."""
    rows, _ = item_rows
    tiny_update_cfg = dataclasses.replace(tiny_update_cfg, group_size=8)
    f_trainer = _items_trainer(load_tiny, rows, tiny_update_cfg, tmp_path, "abpo")
    batch = [*rows[:3], rows[0]]
    _, f = _step(f_trainer, batch)
    assert -1.0 <= f["abpo/grad_cosine_vs_grpo"] <= 1.0 and "abpo/gamma_ratio" in f


@pytest.mark.slow
def test_an_update_killed_inside_a_checkpoint_save_resumes_from_the_last_whole_one(
    load_tiny, update_rows, tiny_update_cfg, tmp_path, monkeypatch, caplog
):
    """The process dies inside the Trainer's save of checkpoint-2 (after the adapter, before the optimizer and
    trainer_state.json): the next run skips it with one log line naming it and resumes from checkpoint-1 to the end.
    Before, every later run failed on checkpoint-2 (FileNotFoundError: trainer_state.json)."""
    import logging

    from transformers import Trainer

    from abpo.config.policy import PolicyConfig
    from abpo.policy.model import lora_config
    from abpo.train.dataset import to_hf_dataset
    from abpo.train.update import train_update

    u = dataclasses.replace(tiny_update_cfg, max_steps=3, save_steps=1, save_total_limit=0)
    kw = dict(
        output_dir=tmp_path / "out",
        seed=0,
        peft_config=lora_config(PolicyConfig(lora_r=4, lora_alpha=8)),
        resume=True,
        grpo_overrides={"disable_tqdm": True},
    )
    settings = ABPOSettings(variant="abpo", scoring_batch_tokens=4096)
    real = Trainer._save_optimizer_and_scheduler

    class Killed(BaseException):  # what SIGKILL does to the save: nothing after this point runs
        pass

    def dies_at_step_2(self, output_dir):
        if output_dir.endswith("checkpoint-2"):
            raise Killed(output_dir)
        return real(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_optimizer_and_scheduler", dies_at_step_2)
    model, tok = load_tiny()
    with pytest.raises(Killed):
        train_update(model, tok, to_hf_dataset(update_rows), u, settings, **kw)
    broken = tmp_path / "out" / "checkpoints" / "checkpoint-2"
    assert (broken / "adapter_model.safetensors").exists() and not (broken / "trainer_state.json").exists()
    monkeypatch.setattr(Trainer, "_save_optimizer_and_scheduler", real)

    model, tok = load_tiny()
    with caplog.at_level(logging.WARNING, logger="abpo.train.update"):
        trainer, resumed_from = train_update(model, tok, to_hf_dataset(update_rows), u, settings, **kw)
    assert resumed_from and resumed_from.endswith("checkpoint-1")
    assert trainer.state.global_step == 3
    assert any(f"not resuming from {broken}: no trainer_state.json" in r.getMessage() for r in caplog.records)
