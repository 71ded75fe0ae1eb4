"""docs/ABPO_SPEC.md "Variants": the (A)-(F) switch table and how each variant turns rewards into advantages."""

import pytest
import torch

from abpo.algo.advantages import anchored_advantages, anchored_baseline, group_advantages
from abpo.algo.variants import VARIANTS, anchor_weights, get_variant, rollout_advantages
from abpo.train.runs import UpdateRun

R_LOG = torch.tensor([2.0, 2.0, 0.05, 0.05], dtype=torch.float64)
R_ROLL = torch.tensor([[1.0, 0.0, 2.0], [1.0, 1.0, 0.0], [1.0, -0.9, 1.1], [0.0, 1.2, 1.0]], dtype=torch.float64)
Y = torch.tensor([1, 1, 0, 0])
W = torch.tensor([1.0, 3.0, 0.5, 1.5], dtype=torch.float64)  # raw SNIPS weights e_old / e0


def test_switch_table_matches_the_spec():
    table = {v.letter: (v.name, v.anchor, v.snips, v.self_certainty, v.update) for v in VARIANTS.values()}
    assert table == {
        "A": ("none", False, False, False, False),  # no update
        "B": ("grpo", False, False, False, True),  # vanilla GRPO
        "C": ("anchor", True, False, False, True),  # + anchoring only (w = 1)
        "D": ("anchor_snips", True, True, False, True),  # + anchoring + SNIPS
        "E": ("anchor_sc", True, False, True, True),  # + anchoring + self-certainty
        "F": ("abpo", True, True, True, True),  # ABPO
        # issue 49 (docs/update-variants.md): B, D or F plus the update settings they fix
        "G": ("grpo_cr", False, False, False, True),
        "H": ("abpo_cr", True, True, True, True),
        "I": ("abpo_ll", True, True, True, True),
        "J": ("wll", True, True, False, True),
        "K": ("abpo_offpolicy", True, True, True, True),
        "L": ("grpo_ll", False, False, False, True),
    }
    assert all(VARIANTS[name].name == name for name in VARIANTS)
    assert all(not v.presets for v in VARIANTS.values() if v.letter in "ABCDEF")  # the paper's rows fix nothing
    presets = {v.name: dict(v.presets) for v in VARIANTS.values() if v.presets}
    assert presets == {
        "grpo_cr": {"no_response_weight_rule": "click_rate"},
        "abpo_cr": {"no_response_weight_rule": "click_rate"},
        "abpo_ll": {"likelihood_weight": 1.0},
        "wll": {"surrogate_weight": 0.0, "likelihood_weight": 1.0},
        "abpo_offpolicy": {"offpolicy_weight": 1.0},
        "grpo_ll": {"likelihood_weight": 1.0},
    }


def test_get_variant_by_name_or_letter_and_an_update_runs_default():
    assert get_variant("F") is get_variant("abpo") is get_variant(" ABPO ") is VARIANTS["abpo"]
    assert get_variant("b").name == "grpo"
    assert get_variant(UpdateRun().variant).letter == "F"
    with pytest.raises(ValueError, match="unknown variant 'ppo'.*A=none.*F=abpo"):
        get_variant("ppo")


def test_effective_lambda_sc():
    assert VARIANTS["abpo"].effective_lambda_sc(0.3) == 0.3
    assert VARIANTS["anchor_sc"].effective_lambda_sc(0.3) == 0.3
    assert VARIANTS["anchor_snips"].effective_lambda_sc(0.3) == 0.0
    assert VARIANTS["grpo"].effective_lambda_sc(0.3) == 0.0


def test_variant_B_is_plain_group_normalisation_and_ignores_the_anchor():
    a = rollout_advantages(VARIANTS["grpo"], R_LOG, R_ROLL, Y, W, delta=1e-6, eps_std=1e-4)
    assert torch.allclose(a, group_advantages(R_ROLL, 1e-4))
    b = rollout_advantages(VARIANTS["grpo"], None, R_ROLL, Y, None, delta=1e-6, eps_std=1e-4)
    assert torch.equal(a, b)


def test_variants_C_and_E_use_unit_anchor_weight():
    for name in ("anchor", "anchor_sc"):
        a = rollout_advantages(VARIANTS[name], R_LOG, R_ROLL, Y, W, delta=1e-6, eps_std=1e-4)
        assert torch.allclose(a, anchored_advantages(R_LOG, R_ROLL, torch.ones(4, dtype=torch.float64), 1e-4))
    # w = 1: the baseline is the plain mean of the G rewards: example 0, (2 + 1 + 0 + 2)/4 = 1.25
    assert anchored_baseline(R_LOG, R_ROLL, anchor_weights(VARIANTS["anchor"], None, Y, 0.0).double())[0] == 1.25


def test_variants_D_and_F_use_stratified_snips():
    # w_hat: B_1 = {0, 1} mean (1 + 3)/2 = 2 -> [0.5, 1.5];  B_0 = {2, 3} mean (0.5 + 1.5)/2 = 1 -> [0.5, 1.5]
    w_hat = torch.tensor([0.5, 1.5, 0.5, 1.5], dtype=torch.float64)
    for name in ("anchor_snips", "abpo"):
        assert anchor_weights(VARIANTS[name], W, Y, 0.0).tolist() == pytest.approx(w_hat.tolist())
        a = rollout_advantages(VARIANTS[name], R_LOG, R_ROLL, Y, W, delta=0.0, eps_std=1e-4)
        assert torch.allclose(a, anchored_advantages(R_LOG, R_ROLL, w_hat, 1e-4))
    # whole-batch normalisation (mean 1.5) would give [2/3, 2, 1/3, 1]: different advantages
    whole = anchored_advantages(R_LOG, R_ROLL, W / W.mean(), 1e-4)
    assert not torch.allclose(a, whole, atol=1e-3)
    # and the SNIPS variants differ from unit weights on the same batch
    assert not torch.allclose(
        a, rollout_advantages(VARIANTS["anchor"], R_LOG, R_ROLL, Y, W, delta=0.0, eps_std=1e-4), atol=1e-3
    )


def test_variant_errors():
    with pytest.raises(ValueError, match="performs no update"):
        rollout_advantages(VARIANTS["none"], R_LOG, R_ROLL, Y, W, delta=0.0, eps_std=1e-4)
    with pytest.raises(ValueError, match="needs the SNIPS weights"):
        rollout_advantages(VARIANTS["abpo"], R_LOG, R_ROLL, Y, None, delta=0.0, eps_std=1e-4)
    with pytest.raises(ValueError, match="needs the anchor rewards"):
        rollout_advantages(VARIANTS["anchor"], None, R_ROLL, Y, W, delta=0.0, eps_std=1e-4)
    with pytest.raises(ValueError, match="has no anchor"):
        anchor_weights(VARIANTS["grpo"], W, Y, 0.0)
