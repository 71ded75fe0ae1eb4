"""Step 2 of docs/ABPO_SPEC.md: format, match, self-certainty and total rewards, against hand-computed values."""

import ast
import math
from pathlib import Path

import pytest
import torch

from abpo.algo.rewards import (
    NO_ITEM,
    anchor_reward,
    chosen_items,
    format_reward,
    match_reward,
    self_certainty,
    self_certainty_from_token_kl,
    token_kl_from_uniform,
    total_reward,
)
from abpo.policy.prompt import format_answer

CANDS = [3, 17, 42]


def test_format_reward_strict_schema_and_candidate_membership():
    completions = [
        "<item_id>17</item_id><item>Heat (1995)</item>",  # well formed, in C -> 1
        "  <item_id>3</item_id><item>Toy Story (1995)</item>\n",  # surrounding whitespace allowed -> 1
        "<item_id>99</item_id><item>Not offered</item>",  # id not in C -> 0
        "<item_id>17</item_id><item>Heat (1995)</item> because...",  # trailing text -> 0
        "I recommend Heat (1995)",  # no schema -> 0
        "<item_id>17</item_id><item>Heat (1995)",  # truncated -> 0
        "<item_id>abc</item_id><item>Heat</item>",  # id not an integer -> 0
        "",  # empty -> 0
    ]
    r = format_reward(completions, [CANDS] * len(completions))
    assert r.dtype == torch.float32
    assert r.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_format_reward_with_titles_checks_the_title_and_accepts_a_parse_callable():
    titles = {3: "Toy Story (1995)", 17: "Heat (1995)"}
    good, wrong_title = format_answer(17, "Heat (1995)"), format_answer(17, "Casino (1995)")
    assert format_reward([good, wrong_title], [titles, titles]).tolist() == [1.0, 0.0]

    class Always:  # a custom parser: only .well_formed / .item_id are read
        well_formed, item_id = True, 3

    assert format_reward(["anything"], [CANDS], parse=lambda t, c: Always()).tolist() == [1.0]
    with pytest.raises(ValueError, match="one candidate set per completion"):
        format_reward([good, good], [CANDS])


def test_chosen_items_marks_malformed_with_no_item():
    ids = chosen_items([format_answer(42, "x"), "garbage", format_answer(5, "not in C")], [CANDS] * 3)
    assert ids.dtype == torch.int64
    assert ids.tolist() == [42, NO_ITEM, NO_ITEM]


def test_match_reward_sign_follows_feedback_and_malformed_never_match():
    # example 0: y=1, a_log=17; example 1: y=0, a_log=42
    chosen = torch.tensor([[17, 3, NO_ITEM], [42, NO_ITEM, 17]])
    logged = torch.tensor([17, 42])
    y = torch.tensor([1, 0])
    r = match_reward(chosen, logged, y)
    # y=1: +1[a=17] -> [1, 0, 0];  y=0: -1[a=42] -> [-1, 0, 0]
    assert r.tolist() == [[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]]
    # 1-D chosen (one completion per example) works the same way
    assert match_reward(torch.tensor([17, 3]), logged, y).tolist() == [1.0, 0.0]


def test_match_reward_rejects_bad_inputs():
    with pytest.raises(ValueError, match="logged item id is >= 0"):
        match_reward(torch.tensor([NO_ITEM]), torch.tensor([NO_ITEM]), torch.tensor([1]))  # -1 would "match"
    with pytest.raises(ValueError, match=r"y\[0\] = 2"):
        match_reward(torch.tensor([1]), torch.tensor([1]), torch.tensor([2]))
    with pytest.raises(ValueError, match="one value per example"):
        match_reward(torch.tensor([[1, 2]]), torch.tensor([1, 2]), torch.tensor([1, 0]))


def test_token_kl_from_uniform_hand_example():
    # V = 2, logits [0, log 3] -> p = [1/4, 3/4]
    # KL(U||p) = 1/2 log(1/2 / 1/4) + 1/2 log(1/2 / 3/4) = 1/2 log 2 + 1/2 log(2/3) = 1/2 log(4/3) = 0.1438410
    # also = -log 2 - 1/2 (log 1/4 + log 3/4) = -0.6931472 + 0.8369882 = 0.1438410
    kl = token_kl_from_uniform(torch.tensor([0.0, math.log(3.0)], dtype=torch.float64))
    assert kl.item() == pytest.approx(0.5 * math.log(4.0 / 3.0), abs=1e-12)
    # uniform logits -> 0 (KL of U from itself), whatever their common value
    assert token_kl_from_uniform(torch.full((7,), 123.0)).item() == pytest.approx(0.0, abs=1e-5)


def test_self_certainty_hand_example_with_masking():
    # row 0: tokens t0 (p=[1/4,3/4]: KL 0.1438410) and t1 (uniform: KL 0) -> (1/2)(0.1438410 + 0) = 0.0719205
    # row 1: t0 only (the same p = [1/4, 3/4]: KL 0.1438410); t1 is padding holding inf logits
    #        -> 0.1438410 (padding must not count, and must not turn into NaN)
    lg3 = math.log(3.0)
    logits = torch.tensor([[[0.0, lg3], [5.0, 5.0]], [[0.0, lg3], [float("inf"), -float("inf")]]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]])
    r = self_certainty(logits, mask)
    half_log_4_3 = 0.5 * math.log(4.0 / 3.0)
    assert r.tolist() == pytest.approx([half_log_4_3 / 2, half_log_4_3], abs=1e-12)
    # the same from per-token KL values collected step by step (what the trainer records during generation)
    kl = torch.stack([token_kl_from_uniform(logits[:, t]) for t in range(2)], dim=1)
    assert self_certainty_from_token_kl(kl, mask).tolist() == pytest.approx(r.tolist(), abs=1e-12)
    with pytest.raises(ValueError, match=r"rule: both \[B, T\]"):
        self_certainty_from_token_kl(kl, mask[:, :1])


def test_self_certainty_matches_direct_kl_and_is_stable_for_large_logits():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g, dtype=torch.float64) * 4
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    logp = torch.log_softmax(logits, dim=-1)
    u = torch.full_like(logp, 1.0 / 11)
    direct = (u * (u.log() - logp)).sum(-1)  # sum_v U_v log(U_v / p_v)
    expected = torch.stack([direct[0, :3].mean(), direct[1].mean(), torch.tensor(0.0, dtype=torch.float64)])
    assert torch.allclose(self_certainty(logits, mask), expected, atol=1e-10)
    # bf16 / huge logits: no overflow, KL of a near one-hot over V is log V - ... stays finite
    big = torch.tensor([[[1e4, 0.0, 0.0, 0.0]]], dtype=torch.bfloat16)
    r = self_certainty(big, torch.ones(1, 1))
    assert torch.isfinite(r).all()
    # p ~ one-hot on V=4 with top logit z: log p = [~0, -z, -z, -z], so -log 4 - mean(log p) = -log 4 + 3z/4
    z = big[0, 0, 0].float().item()  # 1e4 as bf16 holds it
    assert r.item() == pytest.approx(-math.log(4) + 3 * z / 4, rel=1e-4)


def test_self_certainty_gradient_is_finite_and_masked():
    logits = (torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(1)) * 50).requires_grad_()
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    self_certainty(logits, mask).sum().backward()
    assert torch.isfinite(logits.grad).all()
    assert logits.grad[0, 2].abs().sum() == 0 and logits.grad[1, 1:].abs().sum() == 0  # padding: no gradient


def test_self_certainty_shape_errors():
    with pytest.raises(ValueError, match=r"logits \[B, T, V\] and mask \[B, T\]"):
        self_certainty(torch.zeros(2, 3, 4), torch.ones(2, 4))


def test_total_reward_adds_self_certainty_to_no_response_rows_only():
    # example 0 (y=1): r = r_match + r_fmt = [1+1, 0+0] = [2, 0]       (r_sc ignored)
    # example 1 (y=0): r = r_match + r_fmt + 0.5 r_sc = [-1+1+0.5*0.4, 0+1+0.5*2.0] = [0.2, 2.0]
    r_match = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    r_fmt = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    r_sc = torch.tensor([[9.0, 9.0], [0.4, 2.0]])
    y = torch.tensor([1, 0])
    r = total_reward(r_match, r_fmt, r_sc, y, lambda_sc=0.5)
    assert torch.allclose(r, torch.tensor([[2.0, 0.0], [0.2, 2.0]]))
    # without self-certainty (None or lambda 0): r = r_match + r_fmt
    assert total_reward(r_match, r_fmt, None, y, 0.5).tolist() == [[2.0, 0.0], [0.0, 1.0]]
    assert total_reward(r_match, r_fmt, r_sc, y, 0.0).tolist() == [[2.0, 0.0], [0.0, 1.0]]


def test_anchor_reward_is_the_reward_of_the_logged_items_text():
    # y=1: r_match = +1, r_fmt = 1 -> 2;  y=0: -1 + 1 + 0.1 * 3.0 = 0.3
    r = anchor_reward(torch.tensor([1, 0]), torch.tensor([7.0, 3.0]), lambda_sc=0.1)
    assert r.tolist() == pytest.approx([2.0, 0.3])
    assert anchor_reward(torch.tensor([1, 0]), None, 0.1).tolist() == [2.0, 0.0]


def test_algo_package_never_imports_trl():
    # abpo/algo must stay pure torch (the trainer in abpo/train wires it into TRL)
    for path in Path(__file__).resolve().parents[2].joinpath("abpo", "algo").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not any(n == "trl" or n.startswith("trl.") for n in names), f"{path.name} imports {names}"
