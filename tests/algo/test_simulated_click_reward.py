"""abpo.algo.rewards.simulated_click_reward (issue 49's online upper bound): each rollout rewarded by the simulator's
click probability of the candidate it named, 0 when malformed; on a hand-computed case."""

from __future__ import annotations

import pytest
import torch

from abpo.algo.rewards import simulated_click_reward


def test_each_rollout_gets_its_candidates_click_probability_and_a_malformed_one_zero():
    p = torch.tensor([[0.1, 0.5, 0.2], [0.3, 0.0, 0.6]])
    chosen = torch.tensor([[0, 2, -1], [1, 1, 2]])
    want = torch.tensor([[0.1, 0.2, 0.0], [0.0, 0.0, 0.6]])
    assert torch.allclose(simulated_click_reward(chosen, p), want)
    assert simulated_click_reward(chosen, p).dtype == torch.float32


def test_shapes_and_probabilities_are_checked():
    p = torch.tensor([[0.1, 0.5, 0.2]])
    with pytest.raises(ValueError, match=r"rule: \[B, K\] and \[B, M\]"):
        simulated_click_reward(torch.tensor([0]), p)
    with pytest.raises(ValueError, match="chosen index >= 3"):
        simulated_click_reward(torch.tensor([[3]]), p)
    with pytest.raises(ValueError, match="example 0: a click probability outside"):
        simulated_click_reward(torch.tensor([[0]]), torch.tensor([[1.5, 0.0, 0.0]]))
