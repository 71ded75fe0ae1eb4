"""Issue 49's variants in the trainer (docs/update-variants.md): the settings each variant fixes and the refusal of a
conflicting config, the no-response weight on the advantages TRL uses, the logged items' own terms in the loss
(checked against an independent forward pass), and a short training of every new variant on item-token prompts with
constrained rollouts (tiny 2-layer model; real TRL, transformers, peft)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from abpo.algo.variants import VARIANTS, get_variant
from abpo.config.update import UpdateConfig
from abpo.train.grpo_args import settings_for, variant_update_config
from abpo.train.records import ABPOSettings
from tests.sizes import TINY_UPDATE

MONTH = "2025-02"  # the month the `abpo update` test lands and trains on
NEW = ("grpo_cr", "abpo_cr", "abpo_ll", "wll", "abpo_offpolicy", "grpo_ll")


def test_variant_presets_apply_and_a_conflicting_setting_is_refused():
    u = UpdateConfig()
    for name in ("none", "grpo", "anchor", "anchor_snips", "anchor_sc", "abpo"):
        assert variant_update_config(u, name) is u  # A-F fix nothing
    assert variant_update_config(u, "grpo_cr").no_response_weight_rule == "click_rate"
    wll = variant_update_config(u, "J")
    assert (wll.surrogate_weight, wll.likelihood_weight) == (0.0, 1.0)
    assert variant_update_config(u, "abpo_offpolicy").offpolicy_weight == 1.0
    # the variant's own value set explicitly is fine; another value is refused, naming the key and the rule
    same = dataclasses.replace(u, likelihood_weight=1.0)
    assert variant_update_config(same, "abpo_ll").likelihood_weight == 1.0
    with pytest.raises(ValueError, match=r"update.likelihood_weight=0.5: variant I \(abpo_ll\) fixes"):
        variant_update_config(dataclasses.replace(u, likelihood_weight=0.5), "abpo_ll")
    # a setting the variant does not fix composes with it (kappa on F + likelihood, beta on anything)
    mixed = variant_update_config(dataclasses.replace(u, no_response_weight=0.1, beta=0.05), "abpo_ll")
    assert (mixed.no_response_weight, mixed.likelihood_weight, mixed.beta) == (0.1, 1.0, 0.05)


def test_config_keys_are_validated_and_reach_the_trainer_settings():
    from abpo.config import load_config
    from abpo.config.errors import ConfigError

    cfg = load_config("tiny", ["update.no_response_weight_rule=click_rate", "update.no_response_weight=2.0"])
    st = settings_for(cfg, "grpo", click_rate=0.2)
    assert st.no_response_kappa() == pytest.approx(0.5)  # 2 x 0.2 / 0.8
    assert settings_for(load_config("tiny"), "abpo").no_response_kappa() == 1.0  # the paper
    assert not settings_for(load_config("tiny"), "abpo").anchor_terms
    assert settings_for(load_config("tiny"), "abpo").click_weight == 1.0  # the paper
    assert settings_for(load_config("tiny", ["update.click_weight=0"]), "grpo").click_weight == 0.0
    st = settings_for(load_config("tiny"), "abpo_offpolicy")
    assert st.anchor_terms and st.offpolicy_weight == 1.0 and st.offpolicy_gamma == 0.1
    for bad, rule in (
        ("update.no_response_weight_rule=ctr", "one of fixed, click_rate"),
        ("update.no_response_weight=-1", ">= 0"),
        ("update.offpolicy_gamma=0", "> 0"),
        ("update.likelihood_weight=-0.5", ">= 0"),
        ("update.click_weight=-1", ">= 0"),
    ):
        with pytest.raises(ConfigError, match=rule):
            load_config("tiny", [bad])
    with pytest.raises(ValueError, match="no click rate"):
        settings_for(load_config("tiny"), "grpo_cr").no_response_kappa()


def test_every_new_variant_is_a_row_an_update_variant_and_an_arm_variant():
    """Rows of `abpo experiment`, `abpo update --variant` and an arm's ArmEntry.refreshed_by all resolve a variant
    through get_variant; each new one has its own letter (its update directory) and label."""
    from abpo.experiment.rows import row_key, row_label, variant_of
    from abpo.train.runs import UpdateRun

    letters = [get_variant(n).letter for n in NEW]
    assert letters == ["G", "H", "I", "J", "K", "L"]
    for name in NEW:
        assert row_key(name) == name == variant_of(name)
        assert row_label(name).startswith(f"({get_variant(name).letter}) ")
        assert get_variant(UpdateRun(variant=name).variant).update
    assert len({v.letter for v in VARIANTS.values()}) == len(VARIANTS)


# ----------------------------------------------------------------------------------------------- in the trainer


def _make(load_tiny, rows, update_cfg, tmp_path, settings, **overrides):
    from abpo.train.dataset import to_hf_dataset
    from abpo.train.grpo_args import grpo_config
    from abpo.train.trainer import ABPOTrainer

    model, tok = load_tiny()
    args = grpo_config(
        update_cfg, settings.variant, output_dir=tmp_path / f"ckpt-{settings.variant}", seed=0, disable_tqdm=True
    )
    trainer = ABPOTrainer(
        model=model, args=args, settings=settings, train_dataset=to_hf_dataset(rows), processing_class=tok
    )
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    return trainer, tok


def _batch(trainer, rows):
    return [dict(r) for r in rows for _ in range(trainer.num_generations)]


def _anchor_logps(trainer, out) -> torch.Tensor:
    """l_theta(a^log | q) of each logged example (its first row), from a forward of (prompt, answer + EOS) alone."""
    k = trainer.num_generations
    out_l = []
    for i in range(0, out["prompt_ids"].size(0), k):
        p = out["prompt_ids"][i][out["prompt_mask"][i].bool()]
        a = out["abpo_anchor_ids"][i][out["abpo_anchor_mask"][i].bool()]
        logits = trainer.model(input_ids=torch.cat([p, a])[None]).logits[0, len(p) - 1 : -1]
        out_l.append(torch.log_softmax(logits.float(), -1).gather(1, a[:, None]).sum())
    return torch.stack(out_l)


def test_no_response_weight_scales_the_no_response_rows_advantages_on_the_same_rollouts(
    load_tiny, update_rows, tiny_update_cfg, tmp_path
):
    base = dict(lambda_sc=0.5, scoring_batch_tokens=4096)
    outs, trainers = {}, {}
    # F and H (F + kappa): anchored advantages are non-zero even where the tiny model's rollouts all score alike
    for name, extra in (("abpo", {}), ("abpo_cr", {"no_response_weight_rule": "click_rate", "click_rate": 0.2})):
        torch.manual_seed(0)
        settings = ABPOSettings(variant=name, **base, **extra)
        trainer, _ = _make(load_tiny, update_rows, tiny_update_cfg, tmp_path, settings)
        outs[name] = trainer._generate_and_score_completions(_batch(trainer, update_rows[:4]))
        trainers[name] = trainer
    assert torch.equal(outs["abpo"]["completion_ids"], outs["abpo_cr"]["completion_ids"])  # the same rollouts
    k = trainers["abpo"].num_generations
    y = torch.tensor([r["y"] for r in update_rows[:4]]).repeat_interleave(k)
    nu = torch.where(y == 0, 0.25, 1.0)  # kappa = 0.2 / 0.8
    assert torch.allclose(outs["abpo_cr"]["advantages"], outs["abpo"]["advantages"] * nu, atol=1e-7)
    m = trainers["abpo_cr"]._metrics["train"]
    assert m["abpo/no_response_weight"][-1] == pytest.approx(0.25)
    assert m["abpo/no_response_weight_click_rate"][-1] == pytest.approx(0.2)
    share_b = trainers["abpo"]._metrics["train"]["abpo/advantages/no_response_abs_share"][-1]
    share_g = m["abpo/advantages/no_response_abs_share"][-1]
    a = outs["abpo"]["advantages"].abs()
    assert a[y == 0].sum() > 0 and a[y == 1].sum() > 0
    assert share_b == pytest.approx(float(a[y == 0].sum() / a.sum()))
    assert share_g == pytest.approx(float(0.25 * a[y == 0].sum() / (a[y == 1].sum() + 0.25 * a[y == 0].sum())))
    assert "abpo/no_response_weight" not in trainers["abpo"]._metrics["train"]  # the paper's update: not logged


@pytest.mark.parametrize("term", ["likelihood", "offpolicy"])
def test_anchor_terms_enter_the_loss_as_an_independent_forward_computes_them(
    load_tiny, update_rows, tiny_update_cfg, tmp_path, term
):
    """Text prompts, free rollouts: the loss = -(step-5 surrogate) - J_LL or J_off, with l_theta(a^log | q) from a
    separate forward of (prompt, logged answer + EOS) and the coefficients on one row per logged example."""
    from abpo.algo.anchor_terms import offpolicy_anchor_surrogate, weighted_log_likelihood
    from abpo.algo.surrogate import clipped_surrogate

    torch.manual_seed(0)
    weights = {"likelihood_weight": 1.0} if term == "likelihood" else {"offpolicy_weight": 1.0}
    settings = ABPOSettings(variant="abpo", lambda_sc=0.5, scoring_batch_tokens=4096, **weights)
    u = dataclasses.replace(tiny_update_cfg, max_completion_length=64)
    trainer, tok = _make(load_tiny, update_rows, u, tmp_path, settings)
    rows = update_rows[:4]
    out = trainer._generate_and_score_completions(_batch(trainer, rows))
    k = trainer.num_generations
    ll, off = out["abpo_anchor_ll_coef"], out["abpo_anchor_off_coef"]
    coef = ll if term == "likelihood" else off
    assert (coef.view(4, k)[:, 1:] == 0).all()  # one term per logged example, on its first row
    y = torch.tensor([r["y"] for r in rows])
    if term == "likelihood":
        assert ((coef.view(4, k)[:, 0] != 0) == (y == 1)).all()  # clicks only
        assert float(coef.sum()) == pytest.approx(float((y == 1).sum()) / 4, rel=1e-4)  # sum w_hat over B_1 = |B_1|
    else:
        assert (torch.sign(coef.view(4, k)[:, 0]) == torch.where(y == 1, 1.0, -1.0)).all()  # clicks up, no-resp down
    loss = trainer._compute_loss(trainer.model, out)

    # independently: rollouts' token log-probs alone, and each anchor's through its own forward
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    att = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, out["completion_ids"].size(1))
    surrogate = clipped_surrogate(logps, logps.detach(), out["advantages"], out["completion_mask"], 0.2)
    anchor_l = _anchor_logps(trainer, out)
    sel = torch.arange(0, 4 * k, k)
    if term == "likelihood":
        j = weighted_log_likelihood(anchor_l, ll[sel])
    else:
        j = offpolicy_anchor_surrogate(anchor_l, anchor_l.detach(), out["abpo_anchor_log_e0"][sel], off[sel], 0.2, 0.1)
    assert float(loss.detach()) == pytest.approx(float((-surrogate - j).detach()), abs=1e-5)
    assert float(j.detach()) != 0.0
    name = "abpo/anchor/logp_mean"
    want = float(anchor_l[ll[sel] != 0].mean() if term == "likelihood" else anchor_l[off[sel] != 0].mean())
    assert trainer._metrics["train"][name][-1] == pytest.approx(want, abs=1e-4)


def test_surrogate_weight_zero_needs_a_term_and_leaves_only_the_likelihood(
    load_tiny, update_rows, tiny_update_cfg, tmp_path
):
    from abpo.algo.anchor_terms import weighted_log_likelihood

    with pytest.raises(ValueError, match="at least one term"):
        _make(load_tiny, update_rows, tiny_update_cfg, tmp_path, ABPOSettings(variant="wll", surrogate_weight=0.0))
    torch.manual_seed(0)
    settings = ABPOSettings(variant="wll", scoring_batch_tokens=4096, surrogate_weight=0.0, likelihood_weight=1.0)
    u = dataclasses.replace(tiny_update_cfg, max_completion_length=64)
    trainer, _ = _make(load_tiny, update_rows, u, tmp_path, settings)
    out = trainer._generate_and_score_completions(_batch(trainer, update_rows[:4]))
    loss = trainer._compute_loss(trainer.model, out)
    k = trainer.num_generations
    c = out["abpo_anchor_ll_coef"][torch.arange(0, 4 * k, k)]
    assert int((c != 0).sum()) >= 1
    # the loss is -J_LL alone: the rollouts' surrogate (advantages non-zero) weighs 0
    assert out["advantages"].abs().sum() > 0
    want = -weighted_log_likelihood(_anchor_logps(trainer, out), c)
    assert float(loss.detach()) == pytest.approx(float(want.detach()), abs=1e-5)


def test_wll_loss_on_single_choice_rollouts_runs_only_the_prompts_with_a_likelihood_term(
    load_tiny, item_update_rows, tiny_update_cfg, tmp_path
):
    """wll's rollouts weigh 0 in its loss (update.surrogate_weight = 0). With one token per item id the loss then runs
    the decoder over the prompts of the logged examples with a likelihood term (the clicks) alone, and its value, its
    gradients and its logged metrics equal those of the loss that scores the rollouts too (the reference: without
    the rollouts' entropy from the generation logits); the rollouts' entropy is the constrained choice's under the
    same pi_old, read from the logits they were drawn from."""
    from functools import partial

    torch.manual_seed(0)
    settings = ABPOSettings(
        variant="wll",
        scoring_batch_tokens=4096,
        surrogate_weight=0.0,
        likelihood_weight=1.0,
        constrained_rollouts=True,
        prompt_style="item_tokens",
    )
    u = dataclasses.replace(tiny_update_cfg, group_size=5, max_completion_length=64)
    trainer, _ = _make(load_tiny, item_update_rows, u, tmp_path, settings)
    out = trainer._generate_and_score_completions(_batch(trainer, item_update_rows[:4]))
    k = trainer.num_generations
    clicked = int((out["abpo_anchor_ll_coef"][torch.arange(0, 4 * k, k)] != 0).sum())
    assert 0 < clicked < 4 and out["abpo_rollout_entropy"].shape == (4 * k,)
    decoder = trainer.accelerator.unwrap_model(trainer.model).get_decoder()
    fed = []
    hook = decoder.register_forward_pre_hook(lambda _m, _a, kw: fed.append(kw["input_ids"].shape[0]), with_kwargs=True)
    try:
        loss = trainer._compute_loss(trainer.model, out)
    finally:
        hook.remove()
    assert fed == [clicked]  # the clicked examples' prompts, once each
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    new = {key: v[-1] for key, v in trainer._metrics["train"].items()}
    reference = {key: v for key, v in out.items() if key != "abpo_rollout_entropy"}
    trainer._constrained_logps = partial(trainer._constrained_logps, share_prompts=False, trim_forced=False)
    ref_loss = trainer._compute_loss(trainer.model, reference)
    ref_grads = torch.autograd.grad(ref_loss, params, allow_unused=True)
    ref = {key: v[-1] for key, v in trainer._metrics["train"].items()}
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=0)
    assert all((a is None) == (b is None) for a, b in zip(grads, ref_grads))
    for a, b in zip(grads, ref_grads):
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    for key in ("entropy", "clip_ratio/region_mean", "abpo/objective", "abpo/anchor/logp_mean", "abpo/anchor/rho_mean"):
        assert new[key] == pytest.approx(ref[key], abs=1e-6), key
    assert new["entropy"] > 0.01


def test_every_new_variant_trains_on_item_tokens_with_constrained_rollouts(
    load_tiny, item_update_rows, item_policy_cfg, tiny_update_cfg, tmp_path
):
    """Two optimizer steps of each new variant (item-token prompts, constrained rollouts: the preset's setting),
    with the KL term on for one of them: it trains, moves the weights and logs its terms' metrics."""
    from abpo.policy.model import lora_config
    from abpo.train.dataset import to_hf_dataset
    from abpo.train.update import train_update

    rows, pol = item_update_rows, item_policy_cfg
    u = dataclasses.replace(tiny_update_cfg, group_size=5, max_completion_length=64, max_steps=2, save_steps=10)
    for name in NEW:
        st = dataclasses.replace(
            settings_for_variant(name),
            constrained_rollouts=True,
            prompt_style="item_tokens",
            click_rate=0.5,
        )
        torch.manual_seed(0)
        model, tok = load_tiny()
        uu = dataclasses.replace(u, beta=0.05) if name == "abpo_offpolicy" else u
        trainer, _ = train_update(
            model,
            tok,
            to_hf_dataset(rows),
            uu,
            st,
            output_dir=tmp_path / name,
            seed=0,
            peft_config=lora_config(dataclasses.replace(pol, lora_r=4, lora_alpha=8)),
            resume=False,
            grpo_overrides={"disable_tqdm": True},
            quiet=True,
        )
        steps = [h for h in trainer.state.log_history if "abpo/advantages/mean" in h]
        assert trainer.state.global_step == 2 and len(steps) == 2, name
        assert all(math.isfinite(h["loss"]) for h in trainer.state.log_history if "loss" in h), name
        if st.anchor_terms:
            assert all(math.isfinite(h["abpo/anchor/logp_mean"]) for h in steps), name
        if name in ("grpo_cr", "abpo_cr"):
            assert all(h["abpo/no_response_weight"] == pytest.approx(1.0) for h in steps), name  # c = 0.5
        if name == "abpo_offpolicy":
            assert all("kl" in h for h in steps), name  # beta composes with the anchor's own term
        moved = [p for n, p in trainer.model.named_parameters() if p.requires_grad and "lora_B" in n]
        assert any(float(p.detach().abs().sum()) > 0 for p in moved), name  # LoRA B starts at 0: it trained


def settings_for_variant(name: str) -> ABPOSettings:
    """ABPOSettings of a variant with its presets (as settings_for builds them from a config)."""
    u = variant_update_config(UpdateConfig(), name)
    return ABPOSettings(
        variant=name,
        lambda_sc=0.5,
        scoring_batch_tokens=4096,
        no_response_weight=u.no_response_weight,
        no_response_weight_rule=u.no_response_weight_rule,
        surrogate_weight=u.surrogate_weight,
        likelihood_weight=u.likelihood_weight,
        offpolicy_weight=u.offpolicy_weight,
        offpolicy_gamma=u.offpolicy_gamma,
    )


@pytest.mark.slow
def test_abpo_update_cli_trains_a_new_variant_with_its_presets_and_a_composed_kappa(
    tmp_path, tiny_model_dir, tiny_titles, make_impressions, ingested_impressions
):
    """`abpo update --variant abpo_ll` on a real warehouse and MLflow store: the run logs the preset it trained with
    (update.likelihood_weight 1), a composed no-response weight (scale 0.5 x c/(1-c), c of the rows trained on) and
    the logged items' metrics at every step."""
    import mlflow
    from mlflow import MlflowClient

    from abpo.cli import main
    from abpo.config import load_config

    root = tmp_path / "var"
    sets = [
        f"paths.root={root}",
        *TINY_UPDATE,
        "update.no_response_weight_rule=click_rate",
        "update.no_response_weight=0.5",
    ]
    cfg = load_config("tiny", sets)
    ingested_impressions(cfg, make_impressions(tiny_titles, 16), MONTH)
    argv = ["update", "--variant", "abpo_ll", "--init-model", str(tiny_model_dir)]
    assert main([*argv, *(a for s in sets for a in ("--set", s))]) == 0
    out_dir = cfg.paths.resolve("models") / f"update-I-{MONTH}_{MONTH}-seed0"
    assert (out_dir / "update.json").exists()
    mlflow.set_tracking_uri(cfg.paths.tracking_uri())
    (run,) = MlflowClient().search_runs(
        [MlflowClient().get_experiment_by_name(cfg.update.mlflow_experiment).experiment_id]
    )
    p = run.data.params
    assert p["update.variant"] == "abpo_ll" and p["update.likelihood_weight"] == "1.0"
    assert p["data.positive_rows"] == "6" and p["data.no_response_rows"] == "6"  # c = 0.5: kappa = 0.5 x 1
    hist = MlflowClient().get_metric_history(run.info.run_id, "abpo/no_response_weight")
    assert [m.value for m in hist] == pytest.approx([0.5, 0.5])
    assert [m.step for m in MlflowClient().get_metric_history(run.info.run_id, "abpo/anchor/logp_mean")] == [1, 2]
