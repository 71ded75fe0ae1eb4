"""Step 3 of docs/ABPO_SPEC.md: SNIPS weight (stop-gradient) and its stratified self-normalisation."""

import math

import pytest
import torch

from abpo.algo.snips import (
    effective_sample_size,
    snips_weight,
    snips_weight_from_logprobs,
    stratified_self_normalise,
)


def test_snips_weight_hand_example_and_stop_gradient():
    # w = e_old / e0: 0.2/0.1 = 2, 0.05/0.2 = 0.25, 0.3/0.3 = 1
    e_old = torch.tensor([0.2, 0.05, 0.3], requires_grad=True)
    e0 = torch.tensor([0.1, 0.2, 0.3])
    w = snips_weight(e_old, e0)
    assert w.tolist() == pytest.approx([2.0, 0.25, 1.0])
    assert not w.requires_grad and w.grad_fn is None  # stop-gradient


def test_snips_weight_from_logprobs_equals_ratio_of_propensities():
    e_old, e0 = torch.tensor([0.2, 0.05, 1e-30]), torch.tensor([0.1, 0.2, 1e-31])
    w = snips_weight_from_logprobs(e_old.double().log().requires_grad_(), e0.double().log())
    assert w.tolist() == pytest.approx([2.0, 0.25, 10.0], rel=1e-6)
    assert not w.requires_grad


@pytest.mark.parametrize("bad_e0", [0.0, -0.1, 1.5, float("nan")])
def test_snips_weight_rejects_invalid_logging_propensity(bad_e0):
    with pytest.raises(ValueError, match=r"e0_log\[1\].*0 < e0 <= 1"):
        snips_weight(torch.tensor([0.5, 0.5]), torch.tensor([0.5, bad_e0]))


def test_stratified_self_normalise_hand_example():
    # B_1 = {0, 1}: mean w = (1 + 3)/2 = 2;  B_0 = {2, 3}: mean w = (2 + 6)/2 = 4;  delta = 0
    # w_hat = [1/2, 3/2, 2/4, 6/4] = [0.5, 1.5, 0.5, 1.5]
    w = torch.tensor([1.0, 3.0, 2.0, 6.0])
    y = torch.tensor([1, 1, 0, 0])
    assert stratified_self_normalise(w, y, delta=0.0).tolist() == pytest.approx([0.5, 1.5, 0.5, 1.5])
    # normalising over the whole batch instead (mean 3) would give [1/3, 1, 2/3, 2]: must not happen
    assert stratified_self_normalise(w, y, 0.0).tolist() != pytest.approx([1 / 3, 1.0, 2 / 3, 2.0])


def test_stratified_self_normalise_delta_and_interleaved_strata():
    # y interleaved; delta = 0.5: B_1 = {1, 3} mean (4 + 2)/2 = 3 -> /3.5;  B_0 = {0, 2} mean (1 + 1)/2 = 1 -> /1.5
    w = torch.tensor([1.0, 4.0, 1.0, 2.0])
    y = torch.tensor([0, 1, 0, 1])
    expected = [1 / 1.5, 4 / 3.5, 1 / 1.5, 2 / 3.5]
    assert stratified_self_normalise(w, y, delta=0.5).tolist() == pytest.approx(expected)


def test_each_stratum_is_scale_invariant_and_independent_of_the_other():
    g = torch.Generator().manual_seed(3)
    w = torch.rand(10, generator=g, dtype=torch.float64) * 3
    y = torch.tensor([1, 0, 0, 1, 1, 0, 1, 0, 0, 1])
    base = stratified_self_normalise(w, y, 0.0)
    # mean of w_hat inside each stratum is 1 (delta = 0)
    assert base[y == 1].mean().item() == pytest.approx(1.0) and base[y == 0].mean().item() == pytest.approx(1.0)
    # multiplying only the no-response weights by 7 leaves every w_hat unchanged (whole-batch would change B_1)
    scaled = w.clone()
    scaled[y == 0] *= 7
    assert torch.allclose(stratified_self_normalise(scaled, y, 0.0), base)


def test_missing_stratum_and_gradient():
    w = torch.tensor([2.0, 4.0], requires_grad=True)
    w_hat = stratified_self_normalise(w, torch.tensor([1, 1]), delta=0.0)  # B_0 empty: only B_1 normalised
    assert w_hat.tolist() == pytest.approx([2 / 3, 4 / 3])
    assert not w_hat.requires_grad


def test_stratified_self_normalise_rejects_bad_inputs():
    with pytest.raises(ValueError, match=r"y\[1\] = 3"):
        stratified_self_normalise(torch.ones(2), torch.tensor([1, 3]), 0.0)
    with pytest.raises(ValueError, match=r"w\[0\] = -1"):
        stratified_self_normalise(torch.tensor([-1.0, 1.0]), torch.tensor([1, 0]), 0.0)
    with pytest.raises(ValueError, match="delta >= 0"):
        stratified_self_normalise(torch.ones(2), torch.tensor([1, 0]), -1.0)
    with pytest.raises(ValueError, match="both"):
        stratified_self_normalise(torch.ones(3), torch.tensor([1, 0]), 0.0)


def test_effective_sample_size():
    # equal weights -> B; (1+3)^2 / (1+9) = 1.6
    assert effective_sample_size(torch.ones(5)).item() == pytest.approx(5.0)
    assert effective_sample_size(torch.tensor([1.0, 3.0])).item() == pytest.approx(1.6)
    assert effective_sample_size(torch.zeros(3)).item() == 0.0


def test_snips_weight_is_unbiased_in_expectation_under_e0():
    # E_{a ~ e0}[w(a)] = sum_a e0(a) e_old(a)/e0(a) = 1 (the reason self-normalising is sound)
    e0 = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    e_old = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    a = torch.multinomial(e0, 200_000, replacement=True, generator=g)
    w = snips_weight(e_old[a], e0[a])
    se = w.std().item() / math.sqrt(w.numel())
    assert abs(w.mean().item() - 1.0) < 4 * se


def test_weight_summary_equal_and_dominated_weights():
    import torch

    from abpo.algo.snips import weight_summary

    eq = weight_summary(torch.ones(10))
    assert eq["p50"] == eq["p99"] == eq["max"] == 1.0 and eq["ess"] == pytest.approx(10.0) and eq["ess_share"] == 1.0
    w = torch.tensor([1e-6] * 99 + [100.0])
    s = weight_summary(w)
    assert s["max"] == 100.0 and s["ess"] == pytest.approx(1.0, abs=1e-3) and s["rows"] == 100
    assert s["p50"] == pytest.approx(1e-6) and s["p99"] > s["p90"]
    empty = weight_summary(torch.tensor([]))
    assert empty["rows"] == 0 and empty["ess"] != empty["ess"]
