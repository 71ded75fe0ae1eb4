"""ABPOTrainer against docs/ABPO_SPEC.md, point by point: constrained rollouts and their log-probs, the step-5
objective (every rollout weighs the same, whatever its length), the refused TRL loss types, the runtime guards
(one generation batch = one optimizer step, both strata in every batch, the logged tau), one prompt builder for
the log and the update, and the F advantages recomputed by hand from e_old, e0, the per-stratum w_hat and the
rewards."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from abpo.train.records import ABPOSettings, rollouts_per_example


def _make(load_tiny, rows, update_cfg, tmp_path, variant, settings=None, **overrides):
    from abpo.train.dataset import to_hf_dataset
    from abpo.train.grpo_args import grpo_config
    from abpo.train.trainer import ABPOTrainer

    model, tok = load_tiny()
    args = grpo_config(
        update_cfg, variant, output_dir=tmp_path / f"ckpt-{variant}", seed=0, disable_tqdm=True, **overrides
    )
    settings = settings or ABPOSettings(variant=variant, lambda_sc=0.5, scoring_batch_tokens=4096)
    trainer = ABPOTrainer(
        model=model, args=args, settings=settings, train_dataset=to_hf_dataset(rows), processing_class=tok
    )
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop before each step
    trainer.model.train()
    return trainer, tok


def _long(update_cfg):
    """Room for the longest answer of the fixture's small-vocabulary tokenizer (+ EOS)."""
    return dataclasses.replace(update_cfg, max_completion_length=64)


def _batch(trainer, rows):
    return [dict(r) for r in rows for _ in range(trainer.num_generations)]


def _grads(model, loss):
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)


def _same(ga, gb, atol=1e-6):
    return all((a is None and b is None) or torch.allclose(a, b, atol=atol) for a, b in zip(ga, gb))


# --------------------------------------------------------------------------------------- constrained rollouts


def test_constrained_rollouts_name_candidates_and_the_loss_uses_their_distribution(
    load_tiny, update_rows, tiny_update_cfg, tmp_path
):
    from abpo.algo.surrogate import clipped_surrogate

    torch.manual_seed(0)
    settings = ABPOSettings(variant="abpo", lambda_sc=0.5, scoring_batch_tokens=4096, constrained_rollouts=True)
    short, _ = _make(load_tiny, update_rows, tiny_update_cfg, tmp_path, "abpo", settings)
    with pytest.raises(ValueError, match="max_completion_length=24"):  # the fixture's 24 would cut long titles
        short._generate_and_score_completions(_batch(short, update_rows[:4]))
    trainer, tok = _make(load_tiny, update_rows, _long(tiny_update_cfg), tmp_path, "abpo", settings)
    batch = _batch(trainer, update_rows[:4])
    out = trainer._generate_and_score_completions(batch)
    rpf = trainer._abpo_rewards_per_func
    assert torch.all(rpf[:, 0] == 1.0), "every constrained rollout is well formed (format reward 1)"
    assert trainer._metrics["train"]["abpo/rollouts/well_formed"][-1] == 1.0
    assert "abpo_allowed" in out and out["abpo_allowed"].shape[:2] == out["completion_ids"].shape

    loss = trainer._compute_loss(trainer.model, out)
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    att = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    logq, _ = trainer._constrained_logps(trainer.model, ids, att, out["completion_ids"], out["abpo_allowed"])
    # only the item-id position carries probability mass (one token per id in the tiny tokenizer)
    assert ((logq != 0).sum(-1) == 1).all()
    expected = -clipped_surrogate(logq, logq.detach(), out["advantages"], out["completion_mask"], 0.2)
    assert torch.allclose(loss, expected, atol=1e-6)
    # the shared-prompt pass (each logged example's prompt once, its rollouts on its cache) = one forward per row
    ref, ref_ent = trainer._constrained_logps(
        trainer.model, ids, att, out["completion_ids"], out["abpo_allowed"], share_prompts=False
    )
    assert torch.allclose(logq, ref, atol=1e-5)
    assert _same(_grads(trainer.model, logq.sum()), _grads(trainer.model, ref.sum()), atol=1e-5)
    full, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, out["completion_ids"].size(1))
    unconstrained = -clipped_surrogate(full, full.detach(), out["advantages"], out["completion_mask"], 0.2)
    assert _same(_grads(trainer.model, loss), _grads(trainer.model, expected))
    assert not _same(_grads(trainer.model, loss), _grads(trainer.model, unconstrained), atol=1e-7), (
        "the constrained loss must not be the full-vocabulary one"
    )


@pytest.mark.parametrize("variant", ["abpo_ll", "grpo"])
def test_single_choice_loss_runs_the_decoder_to_the_choice_only_with_the_same_loss_and_gradients(
    load_tiny, update_rows, tiny_update_cfg, tmp_path, variant
):
    """With one token per item id only a rollout's first position branches: the forced title tokens have q_theta = 1
    (log q = 0, no gradient; Eq. q of abpo.policy.constrained). The loss then runs the decoder over each distinct
    prompt of the micro-batch once and nothing of the completions, and its value and gradients (rollouts and, with
    abpo_ll, the logged items' likelihood rows) equal those of a forward per row over prompt + whole completion."""
    from functools import partial

    torch.manual_seed(0)
    settings = ABPOSettings(
        variant=variant,
        lambda_sc=0.5,
        scoring_batch_tokens=4096,
        constrained_rollouts=True,
        likelihood_weight=1.0 if variant == "abpo_ll" else 0.0,
    )
    trainer, _ = _make(load_tiny, update_rows, _long(tiny_update_cfg), tmp_path, variant, settings)
    out = trainer._generate_and_score_completions(_batch(trainer, update_rows[:4]))
    assert out["completion_mask"].sum(-1).min() > 3  # whole answers: item token, title markup, EOS
    decoder = trainer.accelerator.unwrap_model(trainer.model).get_decoder()
    fed = []
    hook = decoder.register_forward_pre_hook(lambda _m, _a, kw: fed.append(kw["input_ids"].shape), with_kwargs=True)
    try:
        loss = trainer._compute_loss(trainer.model, out)
    finally:
        hook.remove()
    distinct = torch.unique(torch.cat([out["prompt_ids"], out["prompt_mask"]], 1), dim=0).shape[0]
    assert fed == [torch.Size([distinct, out["prompt_ids"].size(1)])]  # the prompts once, no completion token
    new = _grads(trainer.model, loss)
    trainer._constrained_logps = partial(trainer._constrained_logps, share_prompts=False, trim_forced=False)
    ref_loss = trainer._compute_loss(trainer.model, out)
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=0)
    ref = _grads(trainer.model, ref_loss)
    assert sum(g is not None for g in new) > 0
    assert _same(new, ref, atol=1e-6)
    if variant == "abpo_ll":
        assert trainer._metrics["train"]["abpo/anchor/logp_mean"][-1] == pytest.approx(
            trainer._metrics["train"]["abpo/anchor/logp_mean"][-2], abs=1e-6
        )


def test_constrained_logps_stop_at_the_last_branching_position_of_a_multi_token_choice(load_tiny):
    """Answers that branch at two positions (ids of several tokens, then a forced title): the constrained log-probs
    run the decoder up to the last branching position only, with the values, entropies and gradients of the
    whole completion (Eq. q: a forced step is log q = 0, entropy 0, whatever follows it)."""
    from accelerate import Accelerator

    from abpo.policy.constrained import AnswerTrie, allowed_tensor
    from abpo.train.rollouts import constrained_logps, positions_read

    model, tok = load_tiny()
    eos = tok.eos_token_id
    answers = [[10, 11, 12, 13, 14, 15], [10, 20, 12, 13, 16, 17], [10, 11, 12, 30, 31, 32]]
    trie = AnswerTrie(answers, eos)
    assert not trie.single_choice
    comps = [a + [eos] for a in answers] * 2
    allowed = allowed_tensor([trie] * len(comps), comps, 7)
    assert positions_read(allowed) == 4  # branches at positions 1 and 3; 4..6 forced
    prompts = [[5, 6, 7, 8], [9, 8, 7]] * 3
    ids = torch.full((6, 4 + 7), tok.pad_token_id)
    att = torch.zeros((6, 4 + 7), dtype=torch.long)
    for r, (p, c) in enumerate(zip(prompts, comps)):
        ids[r, 4 - len(p) : 4], att[r, 4 - len(p) : 4] = torch.tensor(p), 1
        ids[r, 4:], att[r, 4:] = torch.tensor(c), 1
    comp = torch.tensor(comps)
    acc = Accelerator(cpu=True)
    params = [p for p in model.parameters() if p.requires_grad]
    got = constrained_logps(acc, model, ids, att, comp, allowed, 0.7)
    ref = constrained_logps(acc, model, ids, att, comp, allowed, 0.7, share_prompts=False, trim_forced=False)
    for a, b in zip(got, ref):
        assert a.shape == b.shape == (6, 7)
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert (got[0] != 0).sum(-1).tolist() == [2, 1, 2] * 2  # log q where the row's answers branch (1 after 20)
    g_new = torch.autograd.grad(got[0].sum(), params, allow_unused=True)
    g_ref = torch.autograd.grad(ref[0].sum(), params, allow_unused=True)
    assert _same(g_new, g_ref, atol=1e-6) and any(g is not None for g in g_new)


def test_constrained_rollouts_carry_a_learning_signal_that_free_rollouts_do_not(
    load_tiny, update_rows, tiny_update_cfg, tmp_path
):
    """A short vanilla-GRPO update (no anchor: the rollouts are its only signal) on the untrained fixture model:
    with constrained rollouts every rollout is well formed, some match the logged item of a click, and most groups
    have rewards that differ; sampled freely, none is well formed and every group's rewards are equal."""
    from abpo.config.policy import PolicyConfig
    from abpo.policy.model import lora_config
    from abpo.train.dataset import to_hf_dataset
    from abpo.train.runs import rollout_signal
    from abpo.train.update import train_update

    rows = update_rows + [dict(r, request_id=r["request_id"] + "-b") for r in update_rows]  # 4 batches of 4
    u = dataclasses.replace(_long(tiny_update_cfg), group_size=8, max_steps=4, save_steps=100)
    signal = {}
    for constrained in (True, False):
        torch.manual_seed(0)
        model, tok = load_tiny()
        trainer, _ = train_update(
            model,
            tok,
            to_hf_dataset(rows),
            u if constrained else dataclasses.replace(u, max_completion_length=24),
            ABPOSettings(variant="grpo", scoring_batch_tokens=4096, constrained_rollouts=constrained),
            output_dir=tmp_path / str(constrained),
            seed=0,
            peft_config=lora_config(PolicyConfig(lora_r=4, lora_alpha=8)),
            resume=False,
            grpo_overrides={"disable_tqdm": True, "save_strategy": "no"},
        )
        history = [h for h in trainer.state.log_history if "abpo/advantages/mean" in h]
        assert len(history) == 4
        signal[constrained] = rollout_signal(history)
    on, off = signal[True], signal[False]
    assert on["format_reward"] == 1.0 and on["match_rate_positive"] > 0.05 and on["frac_reward_zero_std"] < 0.75
    assert off["format_reward"] == 0.0 and off["match_rate_positive"] == 0.0 and off["frac_reward_zero_std"] == 1.0


def test_constrained_rollouts_refuse_vllm_and_truncated_sampling(load_tiny, update_rows, tiny_update_cfg, tmp_path):
    settings = ABPOSettings(variant="abpo", scoring_batch_tokens=4096, constrained_rollouts=True)
    with pytest.raises(ValueError, match="top_p=0.9"):
        _make(load_tiny, update_rows, dataclasses.replace(tiny_update_cfg, top_p=0.9), tmp_path, "abpo", settings)


# ------------------------------------------------------------------------------------------ step 5 objective


def test_every_rollout_weighs_the_same_whatever_its_length(load_tiny, update_rows, tiny_update_cfg, tmp_path):
    """The spec's objective is a mean over rollouts of min(s A, clip(s) A) with the sequence ratio s: its gradient
    is mean_j A_j grad log pi(a_j|q), a SUM over each rollout's tokens. TRL's grpo loss averages the tokens of each
    rollout (a 1/T_j weight: short titles weigh more). The trainer's loss must have the spec's gradient."""
    from abpo.algo.surrogate import clipped_surrogate

    torch.manual_seed(0)
    trainer, _ = _make(load_tiny, update_rows, tiny_update_cfg, tmp_path, "abpo")
    out = trainer._generate_and_score_completions(_batch(trainer, update_rows[:4]))
    T = out["completion_mask"].size(1)
    for i in range(out["completion_mask"].size(0)):  # rollouts of different lengths (the untrained model rarely stops)
        out["completion_mask"][i, max(2, T - 3 * i) :] = 0
    lengths = out["completion_mask"].sum(-1)
    assert len(set(lengths.tolist())) > 1
    loss = trainer._compute_loss(trainer.model, out)
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    att = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    logp, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, out["completion_ids"].size(1))
    adv, mask = out["advantages"], out["completion_mask"]
    spec = -clipped_surrogate(logp, logp.detach(), adv, mask, 0.2, ratio_level="sequence")
    by_hand = -((logp * mask).sum(-1) * adv).mean()  # s = 1 in value: grad = mean_j A_j sum_t grad log pi
    token = -clipped_surrogate(logp, logp.detach(), adv, mask, 0.2, ratio_level="token")
    g = _grads(trainer.model, loss)
    assert _same(g, _grads(trainer.model, spec)) and _same(g, _grads(trainer.model, by_hand), atol=1e-5)
    assert not _same(g, _grads(trainer.model, token), atol=1e-7)


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo", "dr_grpo", "cispo"])
def test_loss_types_that_break_the_rollout_mean_are_refused(
    load_tiny, update_rows, tiny_update_cfg, tmp_path, loss_type
):
    with pytest.raises(ValueError, match="loss_type="):
        _make(load_tiny, update_rows, dataclasses.replace(tiny_update_cfg, loss_type=loss_type), tmp_path, "abpo")


def test_one_generation_batch_is_one_optimizer_step(load_tiny, update_rows, tiny_update_cfg, tmp_path):
    with pytest.raises(ValueError, match="steps_per_generation=1 != gradient_accumulation_steps=2"):
        _make(load_tiny, update_rows, tiny_update_cfg, tmp_path, "abpo", gradient_accumulation_steps=2)


def test_a_generation_batch_without_both_strata_is_refused(load_tiny, update_rows, tiny_update_cfg, tmp_path):
    trainer, _ = _make(load_tiny, update_rows, tiny_update_cfg, tmp_path, "abpo")
    clicks = [r for r in update_rows if r["y"] == 1][:4]
    with pytest.raises(RuntimeError, match="holds only y = 1 rows"):
        trainer._generate_and_score_completions(_batch(trainer, clicks))


def test_vanilla_grpo_can_sample_as_many_rollouts_as_abpo():
    from abpo.config import load_config
    from abpo.train.grpo_args import grpo_kwargs

    assert rollouts_per_example("grpo", 4) == 4
    assert rollouts_per_example("grpo", 4, equal_samples=True) == 3 == rollouts_per_example("abpo", 4)
    cfg = load_config("tiny", ["update.grpo_equal_samples=true"])
    assert grpo_kwargs(cfg.update, "grpo", output_dir="x", seed=0)["num_generations"] == cfg.update.group_size - 1


def test_gpu_preset_has_no_vllm_importance_sampling_and_samples_freely():
    from abpo.config import load_config
    from abpo.train.grpo_args import grpo_kwargs

    cfg = load_config("gpu")
    assert grpo_kwargs(cfg.update, "abpo", output_dir="x", seed=0)["vllm_importance_sampling_correction"] is False
    assert cfg.policy.constrained_rollouts is False
    assert (
        load_config("tiny").policy.constrained_rollouts is True and load_config("smollm2").policy.constrained_rollouts
    )


# ------------------------------------------------------------------------------------ the log and the update


def test_update_rows_refuse_a_log_written_with_another_tau(tiny_titles, tiny_policy_cfg, load_tiny, make_impressions):
    from abpo.train.dataset import UpdateDataError, example_row

    _, tok = load_tiny()
    row = make_impressions(tiny_titles, 1)[0]
    example_row(row, tiny_titles, tok, tiny_policy_cfg)  # softmax(tau=1.0) and policy.tau = 1.0
    with pytest.raises(UpdateDataError, match=r"logged with softmax\(tau=0.5\) but policy.tau=1.0"):
        example_row(dict(row, logging_policy="softmax(tau=0.5)"), tiny_titles, tok, tiny_policy_cfg)
    with pytest.raises(UpdateDataError, match="is not softmax"):
        example_row(dict(row, logging_policy="popularity"), tiny_titles, tok, tiny_policy_cfg)


def test_update_rows_take_a_ranker_logged_row_with_its_propensity(
    tiny_titles, tiny_policy_cfg, load_tiny, make_impressions
):
    """arms.update_logs = all: a row a ranker arm logged keeps the ranker's e0 (no tau to match); a malformed ranker
    rule or a zero temperature is still refused."""
    from abpo.train.dataset import UpdateDataError, example_row

    _, tok = load_tiny()
    row = dict(
        make_impressions(tiny_titles, 1)[0], logging_policy="softmax(score/T, T=0.1) ml_retrain", propensity=0.0625
    )
    assert example_row(row, tiny_titles, tok, tiny_policy_cfg)["e0"] == 0.0625
    for bad in ("softmax(score/T, T=0) popularity", "softmax(score/T, T=0.5)", "softmax(score/T, T=x) popularity"):
        with pytest.raises(UpdateDataError, match="is not softmax"):
            example_row(dict(row, logging_policy=bad), tiny_titles, tok, tiny_policy_cfg)


def test_update_rows_take_a_uniform_logged_row_only_at_one_over_the_candidate_count(
    tiny_titles, tiny_policy_cfg, load_tiny, make_impressions
):
    """The experiment's uniform logger (experiment.logger = uniform) writes logging_policy "uniform" with e0 = 1/|C|:
    the update takes such a row with that e0 (it failed with "is not softmax" before: the uniform_paper regime could
    not train), and refuses a "uniform" row whose propensity is not 1/|C|."""
    from abpo.train.dataset import UpdateDataError, example_row

    _, tok = load_tiny()
    row = make_impressions(tiny_titles, 1)[0]
    m = len(row["candidates"])
    uniform = dict(row, logging_policy="uniform", propensity=1.0 / m)
    assert example_row(uniform, tiny_titles, tok, tiny_policy_cfg)["e0"] == pytest.approx(1.0 / m)
    with pytest.raises(
        UpdateDataError, match=r"logged uniform with propensity 0.5 .*rule: a uniform logger's e0 is 1/\|C\|"
    ):
        example_row(dict(uniform, propensity=0.5), tiny_titles, tok, tiny_policy_cfg)


def test_update_prompt_is_the_prompt_the_log_was_scored_with(tiny_titles, tiny_policy_cfg, load_tiny, make_impressions):
    """With policy.history_item_ids the logged e0 was scored on a prompt whose history shows item ids; the update's
    rollouts and e_old must use that same prompt."""
    from abpo.data.candidates import Example
    from abpo.policy.prompt import example_prompt
    from abpo.train.dataset import example_row

    _, tok = load_tiny()
    row = make_impressions(tiny_titles, 1)[0]
    for with_ids in (False, True):
        policy = dataclasses.replace(tiny_policy_cfg, history_item_ids=with_ids)
        ex = Example(
            request_id="r",
            user_id=0,
            history=list(row["history"]),
            candidates=list(row["candidates"]),
            positive=row["item_id"],
        )
        logged = example_prompt(ex, tiny_titles, tok, policy).user_text
        assert example_row(row, tiny_titles, tok, policy)["prompt"][0]["content"] == logged


# ----------------------------------------------------------------------------------- F advantages by hand


def test_abpo_advantages_recomputed_by_hand(load_tiny, update_rows, tiny_update_cfg, tmp_path):
    """F: r = r_match + r_fmt (+ lambda r_sc if y = 0) for rollouts and anchor; w = e_old/e0 with e_old from a naive
    forward per candidate; w_hat = w / (mean of w over the row's stratum + delta); b, sigma, A of step 4 - all in
    plain Python here, against the advantages the trainer hands to TRL."""
    from abpo.policy.prompt import encode_answer, encode_prompt, render_chat
    from abpo.policy.scoring import score_candidates_naive

    torch.manual_seed(1)
    lam, delta, eps_std = 0.5, 1e-6, 1e-4
    settings = ABPOSettings(
        variant="abpo",
        lambda_sc=lam,
        delta=delta,
        eps_std=eps_std,
        scoring_batch_tokens=4096,
        constrained_rollouts=True,
    )
    trainer, tok = _make(load_tiny, update_rows, _long(tiny_update_cfg), tmp_path, "abpo", settings)
    rows = update_rows[:4]
    out = trainer._generate_and_score_completions(_batch(trainer, rows))
    k = trainer.num_generations
    rpf = trainer._abpo_rewards_per_func.tolist()
    sc_roll = (
        trainer._abpo_rollout_sc
    )  # KL(U||p_t) means recorded while sampling (checked equal to a forward elsewhere)
    model = trainer.model
    V = model.config.vocab_size

    def self_certainty(prompt_ids, completion_ids):
        with torch.no_grad():
            z = model(input_ids=torch.tensor([prompt_ids + completion_ids])).logits[0].double()
        z = z[len(prompt_ids) - 1 : len(prompt_ids) + len(completion_ids) - 1]
        return float((torch.logsumexp(z, -1) - z.mean(-1) - math.log(V)).mean())

    e_old, r_log, r_roll = [], [], []
    for i, row in enumerate(rows):
        text = render_chat(tok, row["prompt"][0]["content"])
        s = score_candidates_naive(model, tok, text, row["candidate_answers"]).double()
        e = torch.softmax(s, 0)
        e_old.append(float(e[row["candidates"].index(row["a_log"])]))
        p_ids = encode_prompt(tok, text)
        if row["y"] == 1:
            r_log.append(1.0 + 1.0)  # match with itself + well formed
        else:
            sc = self_certainty(p_ids, encode_answer(tok, row["anchor_text"]) + [tok.eos_token_id])
            r_log.append(-1.0 + 1.0 + lam * sc)
        grp = []
        for j in range(k):
            n = i * k + j
            r = rpf[n][0] + rpf[n][1]
            if row["y"] == 0:
                r += lam * sc_roll[n]
            grp.append(r)
        r_roll.append(grp)
    w = [eo / row["e0"] for eo, row in zip(e_old, rows)]
    w_hat = []
    for i, row in enumerate(rows):
        same = [w[m] for m, other in enumerate(rows) if other["y"] == row["y"]]
        w_hat.append(w[i] / (sum(same) / len(same) + delta))
    expected = []
    for i in range(len(rows)):
        denom = w_hat[i] + k  # w_hat + G - 1, with k = G - 1 rollouts
        b = (w_hat[i] * r_log[i] + sum(r_roll[i])) / denom
        var = (w_hat[i] * (r_log[i] - b) ** 2 + sum((r - b) ** 2 for r in r_roll[i])) / denom
        sigma = math.sqrt(var + eps_std)
        expected += [(r - b) / sigma for r in r_roll[i]]
    assert out["advantages"].tolist() == pytest.approx(expected, rel=1e-4, abs=1e-5)
