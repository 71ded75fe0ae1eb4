"""docs/update-variants.md "No-response weight" (abpo.algo.stratum_weight): kappa of Eqs. N1-N2, the weighted
advantages and the no-response share of |A|, on small hand-computed cases."""

import math

import pytest
import torch

from abpo.algo.stratum_weight import no_response_abs_share, no_response_weight, stratum_weighted_advantages
from abpo.algo.surrogate import clipped_surrogate


def test_kappa_fixed_and_click_rate_by_hand():
    assert no_response_weight("fixed", 1.0) == 1.0  # the paper
    assert no_response_weight("fixed", 0.08) == 0.08
    assert no_response_weight("click_rate", 1.0, 0.2) == pytest.approx(0.25)  # 0.2 / 0.8
    assert no_response_weight("click_rate", 1.0, 0.05) == pytest.approx(0.05 / 0.95)  # the loop's CTR: ~0.053
    assert no_response_weight("click_rate", 2.0, 0.2) == pytest.approx(0.5)  # the scale multiplies c/(1-c)
    with pytest.raises(ValueError, match="no click rate"):
        no_response_weight("click_rate", 1.0, None)
    for c in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="0 < c < 1"):
            no_response_weight("click_rate", 1.0, c)
    with pytest.raises(ValueError, match="no_response_weight_rule = 'ctr'"):
        no_response_weight("ctr", 1.0, 0.2)
    with pytest.raises(ValueError, match="finite and >= 0"):
        no_response_weight("fixed", -0.1)


def test_kappa_is_the_ratio_of_baselined_advantages():
    """A bandit policy gradient with reward y and baseline c: |A(y=0)| / |A(y=1)| = |0 - c| / |1 - c| (Eq. N2)."""
    for c in (0.05, 0.09, 0.3, 0.7):
        assert no_response_weight("click_rate", 1.0, c) == pytest.approx(abs(0 - c) / abs(1 - c))


def test_weighted_advantages_and_their_share_by_hand():
    adv = torch.tensor([[1.0, -1.0], [0.5, -0.5], [2.0, 0.0]])
    y = torch.tensor([1, 0, 0])
    out = stratum_weighted_advantages(adv, y, 0.25)
    assert out.tolist() == [[1.0, -1.0], [0.125, -0.125], [0.5, 0.0]]
    # the no-response rows carry |A| 1 + 2 = 3 of 5 before weighting, 0.25 + 0.5 = 0.75 of 2.75 after
    assert no_response_abs_share(adv, y) == pytest.approx(3 / 5)
    assert no_response_abs_share(out, y) == pytest.approx(0.75 / 2.75)
    assert math.isnan(no_response_abs_share(torch.zeros(2, 3), torch.tensor([1, 0])))
    # kappa = 1 (the paper) returns the advantages bit for bit; kappa = 0 leaves only the clicks
    assert torch.equal(stratum_weighted_advantages(adv, y, 1.0), adv)
    assert stratum_weighted_advantages(adv, y, 0.0)[1:].abs().sum() == 0
    with pytest.raises(ValueError, match="kappa"):
        stratum_weighted_advantages(adv, y, -1.0)
    with pytest.raises(ValueError, match=r"\[B, K\] and \[B\]"):
        stratum_weighted_advantages(adv, torch.tensor([1, 0]), 0.5)


def test_click_weight_scales_the_clicked_rows_only_by_hand():
    """nu_1 = update.click_weight (Eq. N1): 0 leaves the no-response rows alone (issue 49's no-responses-only
    update), 2 doubles the clicked rows' advantages, kappa still scales the rest."""
    adv = torch.tensor([[1.0, -1.0], [0.5, -0.5], [2.0, 0.0]])
    y = torch.tensor([1, 0, 0])
    only_no_response = stratum_weighted_advantages(adv, y, 1.0, 0.0)
    assert only_no_response.tolist() == [[0.0, 0.0], [0.5, -0.5], [2.0, 0.0]]
    assert no_response_abs_share(only_no_response, y) == pytest.approx(1.0)
    assert stratum_weighted_advantages(adv, y, 0.5, 2.0).tolist() == [[2.0, -2.0], [0.25, -0.25], [1.0, 0.0]]
    with pytest.raises(ValueError, match=r"nu_1 \(update.click_weight\)"):
        stratum_weighted_advantages(adv, y, 1.0, float("nan"))


def test_scaling_advantages_is_weighing_the_surrogate_rows_even_when_clipped():
    """min(s kA, clip(s) kA) = k min(s A, clip(s) A) for k >= 0: the weighted advantages give the nu-weighted
    mean of the rows' clipped terms, with ratios inside and outside the clip range (Eq. N1)."""
    # one-token completions; ratios s = 1.5 (clipped to 1.2 when A > 0), 0.5 (clipped to 0.8 when A < 0), 1.0, 1.1
    logp_old = torch.log(torch.tensor([[[0.2]], [[0.4]], [[0.3]], [[0.5]]])).view(2, 2, 1)
    s = torch.tensor([[1.5, 0.5], [1.0, 1.1]])
    logp_new = (logp_old.squeeze(-1) + torch.log(s)).unsqueeze(-1)
    mask = torch.ones_like(logp_new)
    adv = torch.tensor([[1.0, -2.0], [0.5, -1.0]])  # example 0 clicked, example 1 no response
    y = torch.tensor([1, 0])
    kappa = 0.1
    # by hand: row terms min(sA, clip(s)A): 1.2*1, 0.8*-2 = -1.6 (min(-1, -1.6)), 1.0*0.5, 1.1*-1
    rows = torch.tensor([[1.2, -1.6], [0.5, -1.1]])
    want = (rows[0].sum() + kappa * rows[1].sum()) / 4
    got = clipped_surrogate(logp_new, logp_old, stratum_weighted_advantages(adv, y, kappa), mask, 0.2)
    assert float(got) == pytest.approx(float(want), rel=1e-6)
