"""s_p, e_p and a_log sampling (docs/ABPO_SPEC.md "Propensities"), on the very small tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from abpo.policy.prompt import encode_answer, encode_prompt, fit_prompt, format_answer
from abpo.policy.scoring import (
    candidate_answers,
    candidate_propensities,
    generate_answers,
    sample_logged_action,
    score_candidates,
    score_candidates_naive,
    top_k,
)
from abpo.policy.token_scoring import score_token_ids_batch


def _prompt(tok, titles, m, seed=0, history=5):
    rng = np.random.default_rng(seed)
    ids = list(titles)
    pick = [ids[i] for i in rng.choice(len(ids), size=m + history, replace=False)]
    cands, hist = pick[:m], pick[m:]
    fp = fit_prompt(
        tok, [titles[i] for i in hist], [(i, titles[i]) for i in cands], max_history=history, max_prompt_tokens=100_000
    )
    return fp.text, cands, candidate_answers(cands, titles)


@pytest.mark.parametrize("method", ["packed", "expand"])
@pytest.mark.parametrize("m,batch_tokens", [(7, 100_000), (30, 1), (30, 900)])
def test_shared_prefix_equals_naive(tiny_model, tiny_tokenizer, small_titles, m, batch_tokens, method):
    # batch_tokens=1 forces one candidate per chunk; 900 gives uneven chunks; 100k puts all in one chunk
    torch.manual_seed(0)
    prompt, cands, answers = _prompt(tiny_tokenizer, small_titles, m)
    shared = score_candidates(tiny_model, tiny_tokenizer, prompt, answers, batch_tokens=batch_tokens, method=method)
    naive = score_candidates_naive(tiny_model, tiny_tokenizer, prompt, answers)
    assert shared.shape == (m,)
    assert torch.allclose(shared, naive, atol=1e-4, rtol=0), (shared - naive).abs().max()
    # the scores differ between candidates (the test could not pass with a constant)
    assert shared.std() > 1e-3


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_scoring_masks_under_eager_attention_too(tiny_dir, tiny_tokenizer, small_titles, attn):
    """The packed scorer's 4-D mask must mask under every attention implementation: a boolean mask is ADDED to
    the scores by eager attention (True = +1; nothing masked: 3e-3 off before the additive mask)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation=attn).eval()
    prompt, _, answers = _prompt(tiny_tokenizer, small_titles, 12)
    packed = score_candidates(model, tiny_tokenizer, prompt, answers, batch_tokens=100_000, method="packed")
    naive = score_candidates_naive(model, tiny_tokenizer, prompt, answers)
    assert torch.allclose(packed, naive, atol=1e-5, rtol=0), (packed - naive).abs().max()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("batch_tokens,pack_tokens", [(100_000, 4096), (1, 1), (3000, 40)])
def test_batched_scoring_of_many_prompts_equals_naive(
    tiny_dir, tiny_tokenizer, small_titles, attn, batch_tokens, pack_tokens
):
    """Several prompts of different lengths (left-padded in one group, or one per group) with candidate sets of
    different sizes, packed in rows of various sizes: every s_p equals one naive forward per candidate."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation=attn).eval()
    tok = tiny_tokenizer
    reqs = [_prompt(tok, small_titles, m, seed=s, history=h) for m, s, h in ((5, 1, 0), (17, 2, 5), (9, 3, 2))]
    got = score_token_ids_batch(
        model,
        [encode_prompt(tok, p) for p, _, _ in reqs],
        [[encode_answer(tok, a) for a in ans] for _, _, ans in reqs],
        batch_tokens=batch_tokens,
        pack_tokens=pack_tokens,
    )
    assert [g.shape for g in got] == [(5,), (17,), (9,)]
    for g, (p, _, ans) in zip(got, reqs):
        naive = score_candidates_naive(model, tok, p, ans)
        assert torch.allclose(g, naive, atol=1e-4, rtol=0), (g - naive).abs().max()
    with pytest.raises(ValueError, match="2 prompts for 1 answer lists"):
        score_token_ids_batch(model, [[1], [2]], [[[3]]], batch_tokens=10)


def test_score_is_mean_token_logprob_by_hand(tiny_model, tiny_tokenizer, small_titles):
    prompt, cands, answers = _prompt(tiny_tokenizer, small_titles, 3, seed=1)
    p = encode_prompt(tiny_tokenizer, prompt)
    a = encode_answer(tiny_tokenizer, answers[0])
    with torch.no_grad():
        logits = tiny_model(torch.tensor([p + a])).logits[0]
    lp = torch.log_softmax(logits, -1)
    by_hand = sum(lp[len(p) - 1 + i, t].item() for i, t in enumerate(a)) / len(a)  # Eq. s_p
    s = score_candidates(tiny_model, tiny_tokenizer, prompt, answers, batch_tokens=4096)
    assert s[0].item() == pytest.approx(by_hand, abs=1e-4)


def test_propensities_sum_to_one_and_follow_tau():
    s = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    for tau in (0.1, 1.0, 5.0):
        e = candidate_propensities(s, tau)
        assert e.sum().item() == pytest.approx(1.0, abs=1e-6)
        assert torch.all(e > 0)
        assert torch.equal(e.argsort(), s.argsort())  # monotone in s
    # softmax(s/tau) exactly
    assert torch.allclose(candidate_propensities(s, 2.0), torch.exp(s / 2) / torch.exp(s / 2).sum())
    # lower tau is sharper
    assert candidate_propensities(s, 0.1).max() > candidate_propensities(s, 5.0).max()
    with pytest.raises(ValueError, match="tau"):
        candidate_propensities(s, 0.0)


def test_propensities_of_model_scores_sum_to_one(tiny_model, tiny_tokenizer, small_titles):
    prompt, _, answers = _prompt(tiny_tokenizer, small_titles, 20, seed=2)
    e = candidate_propensities(score_candidates(tiny_model, tiny_tokenizer, prompt, answers, batch_tokens=4096), 1.0)
    assert e.shape == (20,) and e.sum().item() == pytest.approx(1.0, abs=1e-5)


def test_sampling_frequencies_match_propensities():
    """Chi-square goodness of fit of 5k draws of a_log ~ Categorical(e0) (fixed seed)."""
    from scipy.stats import chisquare

    e0 = candidate_propensities(torch.tensor([0.0, -0.3, -1.0, -2.0, -0.1, -4.0]), 1.0).numpy().astype(np.float64)
    rng = np.random.default_rng(123)
    n = 5_000
    counts = np.zeros(len(e0))
    for _ in range(n):
        j, p = sample_logged_action(e0, rng)
        assert p == pytest.approx(e0[j])  # the stored propensity is e0(a_log|q)
        counts[j] += 1
    stat, pval = chisquare(counts, e0 / e0.sum() * n)
    assert pval > 0.001, (counts / n, e0)
    # and it would detect a wrong distribution
    assert chisquare(counts, np.full(len(e0), n / len(e0))).pvalue < 1e-6


def test_sampling_rejects_non_distribution():
    with pytest.raises(ValueError, match="not a distribution"):
        sample_logged_action(np.array([0.5, 0.6]), np.random.default_rng(0))


def test_top_k_orders_by_score():
    assert top_k(torch.tensor([0.1, 0.9, 0.5, 0.9]), [10, 11, 12, 13], 3) == [11, 13, 12]


def test_save_reload_gives_identical_scores(tiny_model, tiny_tokenizer, small_titles, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from abpo.policy.model import save_policy

    prompt, _, answers = _prompt(tiny_tokenizer, small_titles, 10, seed=3)
    with torch.no_grad():  # move the weights away from the fresh init so the check is not trivial
        for p in tiny_model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    before = score_candidates(tiny_model, tiny_tokenizer, prompt, answers, batch_tokens=4096)
    save_policy(tiny_model, tiny_tokenizer, tmp_path / "m")
    model2 = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    tok2 = AutoTokenizer.from_pretrained(tmp_path / "m")
    after = score_candidates(model2, tok2, prompt, answers, batch_tokens=4096)
    assert torch.equal(before, after)


def test_generate_answers_runs_and_decodes(tiny_model, tiny_tokenizer, small_titles):
    prompt, _, _ = _prompt(tiny_tokenizer, small_titles, 3, seed=4)
    out = generate_answers(tiny_model, tiny_tokenizer, [prompt, prompt], max_new_tokens=5, batch_size=2)
    assert len(out) == 2 and out[0] == out[1]  # greedy and left padding: identical prompts, identical answers
    assert tiny_tokenizer.padding_side == "right"  # restored


def test_answer_tokens_roundtrip(tiny_tokenizer, small_titles):
    for i, t in list(small_titles.items())[:50]:
        a = format_answer(i, t)
        assert tiny_tokenizer.decode(encode_answer(tiny_tokenizer, a)) == a


@pytest.mark.parametrize("head", ["linear", "linear+bias", "module"])
def test_chunked_lm_head_logprobs_equal_a_full_log_softmax(head):
    from abpo.policy.token_scoring import _token_logprobs

    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 300, bias=head == "linear+bias")
    mod = torch.nn.Sequential(lin) if head == "module" else lin  # not a plain Linear: the module itself is called
    hidden, targets = torch.randn(150, 16), torch.randint(0, 300, (150,))  # 150 = 2 full chunks of 64 + a rest
    ref = torch.log_softmax(lin(hidden).double(), dim=-1).gather(-1, targets[:, None])[:, 0]
    got = _token_logprobs(mod, hidden, targets, rows=64)
    assert got.dtype == torch.float64 and got.shape == (150,)
    assert torch.allclose(got, ref, atol=1e-5)
    assert _token_logprobs(mod, hidden[:0], targets[:0]).shape == (0,)


def test_a_tau_below_its_bound_is_refused_and_at_the_bound_softmax_stays_finite():
    """policy.tau = 1e-320 (subnormal, > 0) made s / tau overflow and e_p NaN at serving; the bound
    (abpo.config.policy.TAU_MIN) is where every finite float32 score still gives a finite softmax."""
    from abpo.config.policy import TAU_MIN
    from abpo.errors import UsageError

    scores = torch.tensor([[-3.4e38, -1.0, 0.0, -2.5]], dtype=torch.float32)
    for tau in (1e-320, 0.0, -1.0, float("nan")):
        with pytest.raises(UsageError, match=r"policy.tau .*: rule: >= 0.001"):
            candidate_propensities(scores, tau)
    e = candidate_propensities(scores, TAU_MIN)
    assert torch.isfinite(e).all() and float(e.sum()) == pytest.approx(1.0)
