"""The item_tokens prompt style: the prompt round trip, s_p on the item token, e0 = the constrained rollout
distribution at tau = 1, self-certainty on the choice positions only, and next-item pre-training."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch

from tests.sizes import TINY_MODEL


@pytest.fixture(scope="module")
def item_cfg(small_policy_cfg):
    return dataclasses.replace(small_policy_cfg, prompt_style="item_tokens", max_history=50)


def _ids(small_titles, a, b):
    return sorted(small_titles)[a:b]


# ------------------------------------------------------------------------------------------------ the prompt


def test_item_token_prompt_round_trip(tiny_tokenizer, small_titles, item_cfg):
    from abpo.policy.prompt import encode_prompt, item_token, request_prompt

    hist, cands = _ids(small_titles, 0, 30), _ids(small_titles, 100, 120)
    fp = request_prompt(
        tiny_tokenizer, [(i, small_titles[i]) for i in hist], [(i, small_titles[i]) for i in cands], item_cfg
    )
    ids = encode_prompt(tiny_tokenizer, fp.text)
    assert len(ids) == fp.n_tokens and fp.history_shown == 30 and fp.history_dropped == 0
    toks = tiny_tokenizer.convert_ids_to_tokens(ids)
    items = [t for t in toks if t.startswith("<item_id>") and t.endswith("</item_id>") and t[9:-10].isdigit()]
    # every candidate, then every history item, each as ONE token, in order; nothing else names an item
    assert items == [item_token(a) for a in cands] + [item_token(h) for h in hist]
    # the most recent history item is the last thing before the chat suffix (right before the answer)
    assert toks[toks.index(item_token(hist[-1])) + 1 :] == ["<|end|>", "<|assistant|>"]
    # decoding gives the text back
    assert tiny_tokenizer.decode(ids) == fp.text


def test_item_token_prompt_budget_drops_oldest_first(tiny_tokenizer, small_titles, item_cfg):
    from abpo.policy.prompt import PromptTooLongError, encode_prompt, fit_item_token_prompt

    hist, cands = _ids(small_titles, 0, 50), _ids(small_titles, 100, 120)
    full = fit_item_token_prompt(tiny_tokenizer, hist, cands, max_history=50, max_prompt_tokens=10_000)
    for budget in (full.n_tokens, full.n_tokens - 1, full.n_tokens - 17):
        fp = fit_item_token_prompt(tiny_tokenizer, hist, cands, max_history=50, max_prompt_tokens=budget)
        assert fp.n_tokens == len(encode_prompt(tiny_tokenizer, fp.text)) == budget
        assert fp.history_dropped == full.n_tokens - budget  # one token per item: exactly the excess, oldest first
        assert fp.user_text.endswith("".join(f"<item_id>{h}</item_id>" for h in hist[-fp.history_shown :]))
    with pytest.raises(PromptTooLongError, match="candidates alone"):
        fit_item_token_prompt(tiny_tokenizer, hist, cands, max_history=50, max_prompt_tokens=10)
    short = fit_item_token_prompt(tiny_tokenizer, hist, cands, max_history=5, max_prompt_tokens=10_000)
    assert short.history_shown == 5


def test_item_tokens_refuses_a_tokenizer_without_item_tokens(tiny_tokenizer, small_titles, item_cfg):
    from abpo.policy.prompt import request_prompt

    with pytest.raises(ValueError, match=r"items \[999999\] have no item token"):
        request_prompt(tiny_tokenizer, [], [(999999, "nope")], item_cfg)


def test_answer_format_is_the_same_in_both_styles(tiny_tokenizer, small_titles):
    from abpo.policy.prompt import encode_answer, format_answer, item_token

    a = sorted(small_titles)[7]
    ids = encode_answer(tiny_tokenizer, format_answer(a, small_titles[a]))
    assert tiny_tokenizer.convert_ids_to_tokens(ids[:1]) == [item_token(a)]  # the answer starts with its item token


# ------------------------------------------------------------------------------------------------ scoring


def _example(small_titles, user=1):
    from abpo.data.candidates import Example

    ids = sorted(small_titles)
    return Example(f"{user}:30", user, ids[:30], ids[200:220], ids[205])


def test_s_p_is_the_item_token_log_prob(tiny_model, tiny_tokenizer, small_titles, item_cfg):
    from abpo.policy.prompt import encode_prompt, example_prompt, item_token
    from abpo.policy.scoring import score_examples

    ex = _example(small_titles)
    s = score_examples(tiny_model, tiny_tokenizer, [ex], small_titles, item_cfg)[0].scores
    ids = encode_prompt(tiny_tokenizer, example_prompt(ex, small_titles, tiny_tokenizer, item_cfg).text)
    with torch.no_grad():
        logp = torch.log_softmax(tiny_model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
    want = logp[tiny_tokenizer.convert_tokens_to_ids([item_token(a) for a in ex.candidates])]
    torch.testing.assert_close(s, want, atol=1e-5, rtol=0)


def test_s_p_is_the_answer_mean_for_text(tiny_model, tiny_tokenizer, small_titles, small_policy_cfg):
    from abpo.policy.prompt import example_prompt
    from abpo.policy.scoring import candidate_answers, score_candidates_naive, score_examples

    cfg = dataclasses.replace(small_policy_cfg, prompt_style="text")
    ex = _example(small_titles)
    s = score_examples(tiny_model, tiny_tokenizer, [ex], small_titles, cfg)[0].scores
    naive = score_candidates_naive(
        tiny_model,
        tiny_tokenizer,
        example_prompt(ex, small_titles, tiny_tokenizer, cfg).text,
        candidate_answers(ex.candidates, small_titles),
    )
    torch.testing.assert_close(s, naive, atol=1e-4, rtol=0)


def test_scoring_batches_prompts_of_different_lengths(tiny_model, tiny_tokenizer, small_titles, item_cfg):
    """Left-padded groups give each prompt the scores it gets alone."""
    from abpo.data.candidates import Example
    from abpo.policy.scoring import score_examples

    ids = sorted(small_titles)
    exs = [Example(f"{u}:{n}", u, ids[:n], ids[200 + u : 220 + u], ids[205 + u]) for u, n in ((1, 3), (2, 40), (3, 0))]
    together = score_examples(tiny_model, tiny_tokenizer, exs, small_titles, item_cfg)
    for ex, sc in zip(exs, together):
        alone = score_examples(tiny_model, tiny_tokenizer, [ex], small_titles, item_cfg)[0].scores
        torch.testing.assert_close(sc.scores, alone, atol=1e-5, rtol=0)


def test_requests_that_share_a_prompt_run_it_once(tiny_model, tiny_tokenizer, small_titles, item_cfg, monkeypatch):
    """Without candidates in the prompt (policy.item_prompt_candidates false), a user's requests with different
    candidate sets share one prompt: score_examples runs each distinct prompt once (issue 60 point 3) and every
    request gets the scores of its own prompt as when every request's prompt ran (to float rounding: a forward's
    batch shape may move the last float32 bits: one scored version of a demo month came out bit-identical, the serve
    step's month-1 propensities moved by up to 4e-6 relative, docs/demo.md "How long it takes")."""
    from abpo.data.candidates import Example
    from abpo.policy import scoring
    from abpo.policy.prompt import check_item_tokens, example_prompt

    cfg = dataclasses.replace(item_cfg, item_prompt_candidates=False)
    ids = sorted(small_titles)
    exs = [
        Example(f"{u}:{k}", u, ids[u : u + 10 * u], ids[200 + 7 * k : 220 + 7 * k], ids[205 + 7 * k])
        for k in range(5)
        for u in (1, 2, 3)
    ]  # 15 requests, 3 distinct prompts
    ran = []
    real = scoring.next_token_logits
    monkeypatch.setattr(scoring, "next_token_logits", lambda m, p, **kw: (ran.append(len(p)), real(m, p, **kw))[1])
    got = scoring.score_examples(tiny_model, tiny_tokenizer, exs, small_titles, cfg)
    assert ran == [3]  # one call, each distinct prompt once
    p_ids = [
        tiny_tokenizer(example_prompt(ex, small_titles, tiny_tokenizer, cfg).text, add_special_tokens=False)[
            "input_ids"
        ]
        for ex in exs
    ]
    before = scoring.score_choice_batch(  # what score_examples did: every request's prompt run, 64 at a time
        tiny_model,
        p_ids,
        [check_item_tokens(tiny_tokenizer, list(ex.candidates)) for ex in exs],
        batch_tokens=cfg.scoring_batch_tokens,
    )
    assert ran[1:] == [15]
    for ex, sc, want in zip(exs, got, before, strict=True):
        assert sc.example is ex
        torch.testing.assert_close(sc.scores, want, atol=1e-6, rtol=0)
        assert int(sc.scores.argmax()) == int(want.argmax())


@pytest.mark.parametrize("show", [False, True])
def test_shared_prompts_are_built_once_and_are_each_requests_own(
    tiny_tokenizer, small_titles, item_cfg, show, monkeypatch
):
    """item_token_prompts gives every request exactly example_prompt's FittedPrompt and encode_prompt's ids, with
    each distinct prompt built once (the key: the history, and the candidates when the prompt shows them), and the
    same refusals for a request that shares its prompt."""
    from abpo.data.candidates import Example
    from abpo.policy import prompt as P
    from abpo.policy.scoring import item_token_prompts

    cfg = dataclasses.replace(item_cfg, item_prompt_candidates=show)
    ids = sorted(small_titles)
    exs = [
        Example(f"{u}:{k}", u, ids[u : u + 10 * u], ids[200 + 7 * (k % 2) : 220 + 7 * (k % 2)], ids[205])
        for k in range(4)
        for u in (0, 1, 2)
    ]  # 12 requests: 3 histories x 2 candidate sets
    calls = []
    real = P.example_prompt
    monkeypatch.setattr(
        "abpo.policy.scoring.example_prompt", lambda ex, *a: (calls.append(ex.request_id), real(ex, *a))[1]
    )
    fitted, p_ids = item_token_prompts(exs, small_titles, tiny_tokenizer, cfg)
    assert len(calls) == (6 if show else 3)
    for ex, fp, pid in zip(exs, fitted, p_ids, strict=True):
        want = real(ex, small_titles, tiny_tokenizer, cfg)
        assert fp == want and pid == P.encode_prompt(tiny_tokenizer, want.text)
    outside = Example("0:9", 0, exs[0].history, [*exs[0].candidates[:-1], 10**9], ids[205])
    with pytest.raises(KeyError, match="not in the catalog"):
        item_token_prompts([exs[0], outside], small_titles, tiny_tokenizer, cfg)
    if not show:
        with pytest.raises(ValueError, match="the candidate set is empty"):
            item_token_prompts([exs[0], Example("0:8", 0, exs[0].history, [], 0)], small_titles, tiny_tokenizer, cfg)


def test_e0_is_the_constrained_rollout_distribution_at_tau_1(tiny_model, tiny_tokenizer, small_titles, item_cfg):
    """e_p(.|q) at tau = 1 over C equals (a) the masked softmax CandidateConstraint + generate sample the first token
    from, (b) the constrained policy's log q of the whole answer (forced tokens have q = 1), and (c) what
    sample_single_choice draws (chi-square)."""
    from scipy.stats import chisquare

    from abpo.policy.constrained import AnswerTrie, CandidateConstraint, constrained_token_logps, sample_single_choice
    from abpo.policy.prompt import encode_answer, encode_prompt, example_prompt
    from abpo.policy.scoring import candidate_answers, candidate_propensities, score_examples

    ex = _example(small_titles)
    e0 = candidate_propensities(score_examples(tiny_model, tiny_tokenizer, [ex], small_titles, item_cfg)[0].scores, 1.0)
    prompt = encode_prompt(tiny_tokenizer, example_prompt(ex, small_titles, tiny_tokenizer, item_cfg).text)
    answers = [encode_answer(tiny_tokenizer, a) for a in candidate_answers(ex.candidates, small_titles)]
    trie = AnswerTrie(answers, tiny_tokenizer.eos_token_id)
    assert trie.single_choice
    # (a) the logits processor's mask at the first step
    with torch.no_grad():
        z = tiny_model(input_ids=torch.tensor([prompt])).logits[:, -1].float()
    masked = CandidateConstraint([trie])(torch.tensor([prompt]), z.clone())
    p_first = torch.softmax(masked, -1)[0]
    firsts = [a[0] for a in answers]
    torch.testing.assert_close(p_first[firsts], e0.float(), atol=1e-5, rtol=0)
    assert float(p_first[firsts].sum()) == pytest.approx(1.0, abs=1e-5)
    # (b) log q_theta of each whole answer + EOS under the constraint = log e0
    comps = [a + [tiny_tokenizer.eos_token_id] for a in answers]
    T = max(len(c) for c in comps)
    from abpo.policy.constrained import allowed_tensor

    allowed = allowed_tensor([trie] * len(comps), comps, T)
    ids = torch.zeros((len(comps), T), dtype=torch.long)
    for r, c in enumerate(comps):
        ids[r, : len(c)] = torch.tensor(c)
    with torch.no_grad():
        full = [
            tiny_model.model(input_ids=torch.tensor([prompt + c[:-1]])).last_hidden_state[0, len(prompt) - 1 :]
            for c in comps
        ]
    hidden = torch.zeros((len(comps), T, full[0].shape[-1]))
    for r, h in enumerate(full):
        hidden[r, : h.shape[0]] = h
    logq, _ = constrained_token_logps(hidden, tiny_model.lm_head, ids, allowed, 1.0)
    torch.testing.assert_close(logq.sum(1), torch.log(e0.float()), atol=1e-4, rtol=0)
    # (c) the one-forward sampler draws from e0
    g = torch.Generator().manual_seed(0)
    n = 4000
    outs, _ = sample_single_choice(tiny_model, [prompt] * n, [trie] * n, 1.0, generator=g)
    assert all(o in comps for o in outs)  # whole answers with their forced title and EOS
    counts = np.array([sum(o[0] == f for o in outs) for f in firsts], dtype=float)
    expected = e0.double().numpy() * n
    keep = expected >= 5
    obs, exp = counts[keep], expected[keep]
    if (~keep).any():  # pool the rare candidates into one bin
        obs, exp = np.append(obs, counts[~keep].sum()), np.append(exp, expected[~keep].sum())
    stat = chisquare(obs, exp * obs.sum() / exp.sum())
    assert stat.pvalue > 1e-3


# ----------------------------------------------------------------------------------------- self-certainty


def test_choice_mask_marks_only_the_item_token(tiny_tokenizer, small_titles):
    from abpo.policy.constrained import AnswerTrie
    from abpo.policy.prompt import encode_answer
    from abpo.policy.scoring import candidate_answers

    cands = sorted(small_titles)[10:20]
    answers = [encode_answer(tiny_tokenizer, a) for a in candidate_answers(cands, small_titles)]
    trie = AnswerTrie(answers, tiny_tokenizer.eos_token_id)
    comp = answers[3] + [tiny_tokenizer.eos_token_id]
    assert trie.choice_mask(comp) == [1] + [0] * (len(comp) - 1)
    # a free completion that leaves the trie: the step off it and everything after are free choices
    off = [answers[3][0], answers[3][1], 5, 6]
    assert trie.choice_mask(off) == [1, 0, 1, 1]
    # multi-token ids (a text tokenizer): the trie branches on each id token, not on the forced title
    t2 = AnswerTrie([[1, 2, 9, 9, 9], [1, 3, 8, 8], [4, 7]], eos_token_id=0)
    assert t2.choice_mask([1, 2, 9, 9, 9, 0]) == [1, 1, 0, 0, 0, 0]


def test_self_certainty_ignores_forced_tokens(tiny_model, tiny_tokenizer, small_titles):
    """r_sc with the choice mask depends on the item token's position only: changing the logits at forced
    positions changes nothing, changing them at the choice position does."""
    from abpo.algo.rewards import self_certainty
    from abpo.policy.constrained import AnswerTrie
    from abpo.policy.prompt import encode_answer
    from abpo.policy.scoring import candidate_answers

    cands = sorted(small_titles)[10:20]
    answers = [encode_answer(tiny_tokenizer, a) for a in candidate_answers(cands, small_titles)]
    trie = AnswerTrie(answers, tiny_tokenizer.eos_token_id)
    comp = answers[0] + [tiny_tokenizer.eos_token_id]
    mask = torch.tensor([trie.choice_mask(comp)])
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, len(comp), 50, generator=g)
    base = self_certainty(logits, mask)
    forced = logits.clone()
    forced[0, 1:] = torch.randn(len(comp) - 1, 50, generator=g) * 10  # a sharply certain title copy
    torch.testing.assert_close(self_certainty(forced, mask), base)
    assert not torch.allclose(self_certainty(forced, torch.ones_like(mask)), base)  # the old all-token mean moves
    chosen = logits.clone()
    chosen[0, 0] *= 10
    assert float(self_certainty(chosen, mask)) > float(base)


# ----------------------------------------------------------------------------------------- pre-training


def test_windows_cover_every_transition_once():
    from abpo.policy.pretrain import windows

    seq = list(range(23))
    ws = windows(seq, 5)
    pairs = [(w[i], w[i + 1]) for w in ws for i in range(len(w) - 1)]
    assert pairs == [(i, i + 1) for i in range(22)]
    assert all(len(w) <= 5 for w in ws)
    assert windows([1], 5) == [] and windows([1, 2], 2) == [[1, 2]]
    with pytest.raises(ValueError, match="at least 2"):
        windows(seq, 1)


def test_pretraining_learns_a_sequential_pattern(tiny_dir, small_titles, caplog):
    """On synthetic sequences where item k is always followed by item k+1, next-item pre-training drives the
    validation loss far below the uniform log|items| and keeps the best epoch; each epoch is logged."""
    import math

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from abpo.policy.pretrain import pretrain_next_item

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    ids = sorted(small_titles)[:40]
    rng = np.random.default_rng(0)
    seqs = {}
    for u in range(60):
        s = int(rng.integers(0, 20))
        seqs[u] = [ids[(s + k) % 40] for k in range(12)]
    train = {u: s[:10] for u, s in seqs.items()}
    val = {u: (s[:10], s[10:]) for u, s in seqs.items() if u % 5 == 0}
    with caplog.at_level(logging.INFO, logger="abpo.policy.pretrain"):
        res = pretrain_next_item(
            model,
            tok,
            train,
            val,
            item_ids=list(small_titles),
            epochs=12,
            learning_rate=1e-2,
            batch_size=16,
            max_length=8,
            patience=3,
        )
    assert sum(m.startswith("pretrain: epoch ") for m in caplog.messages) == res.epochs_run
    assert res.n_train_positions == 60 * 9 and res.n_val_positions == 12 * 2
    assert res.val_losses[res.best_epoch - 1] == min(res.val_losses)
    assert min(res.val_losses) < 0.5 * math.log(len(small_titles))
    assert res.val_hr10[res.best_epoch - 1] > 0.5


# ------------------------------------------------------------------------------- pi_init on any catalog


def _small_sft_cfg(tmp_path, data_dir, fmt="movielens", **data):
    from abpo.config import load_config

    cfg = load_config(
        "tiny",
        [f"paths.root={tmp_path / 'var'}", f"data.dataset_dir={data_dir}", f"data.format={fmt}", *TINY_MODEL],
    )
    d = cfg.data
    d.train_candidates, d.eval_candidates, d.update_steps, d.min_history = 4, 5, 1, 3
    for k, v in data.items():
        setattr(d, k, v)
    s = cfg.sft
    s.pretrain_epochs, s.pretrain_patience, s.max_steps, s.batch_size, s.logging_steps = 2, 1, 3, 8, 1
    s.eval_generation, s.eval_max_users = False, 20
    return cfg


@pytest.mark.parametrize("n_items", [10, 11, 21, 2001])
def test_pi_init_builds_and_trains_on_any_movielens_catalog(movielens_dir, tmp_path, n_items):
    """Both stages of pi_init (next-item pre-training, answer-format SFT) and its evaluation run on MovieLens-format
    directories of several catalog sizes."""
    from abpo.policy.sft import train_sft

    d = movielens_dir(n_items, n_users=30, ratings_per_user=5 if n_items < 20 else 9)
    cfg = _small_sft_cfg(tmp_path, d)
    res = train_sft(cfg, validation_fraction=cfg.experiment.validation_fraction, log_mlflow=False, register=False)
    assert (res.model_dir / "config.json").exists()
    assert set(res.stage_seconds) == {"pretrain", "sft"}
    assert res.metrics["n_users"] > 0 and 0.0 <= res.metrics["HR@5"] <= 1.0


def test_pi_init_on_a_one_item_catalog_says_why(movielens_dir, tmp_path):
    """One item cannot make a candidate set with a distractor: the tokenizer builds, and SFT stops with the rule."""
    from abpo.policy.sft import train_sft

    d = movielens_dir(1, n_users=5, ratings_per_user=1)
    cfg = _small_sft_cfg(tmp_path, d)
    with pytest.raises(ValueError, match="D_sup is empty"):
        train_sft(cfg, validation_fraction=cfg.experiment.validation_fraction, log_mlflow=False, register=False)


@pytest.mark.parametrize("domain", ["Office_Products", "Industrial_and_Scientific"])
def test_pi_init_on_amazon18(tmp_path, domain):
    import os
    from pathlib import Path

    from abpo.policy.sft import train_sft

    src = Path(
        os.environ.get("ABPO_AMAZON18_DIR", Path(__file__).resolve().parents[3] / "shared" / "data" / "amazon18")
    )
    if not src.is_dir():
        pytest.skip(f"{src} absent (the Amazon-2018 domains are read in place, never vendored)")
    cfg = _small_sft_cfg(tmp_path, src, fmt="amazon18", amazon_domain=domain, max_users=60, update_steps=2)
    # TINY_MODEL's 600-token vocabulary spells an Amazon title in up to ~140 tokens (Office_Products: 137 with EOS);
    # pi_init's SFT refuses a catalog whose answers do not fit a rollout (issue 59 point 11)
    cfg.update.max_completion_length = 256
    res = train_sft(cfg, validation_fraction=cfg.experiment.validation_fraction, log_mlflow=False, register=False)
    assert (res.model_dir / "config.json").exists() and res.metrics["n_users"] > 0


def test_choice_loss_records_mask_only_the_item_token(tiny_tokenizer, small_titles, item_cfg, small_policy_cfg):
    from abpo.policy.prompt import item_token
    from abpo.policy.sft import sft_records

    ex = _example(small_titles)
    full = sft_records([ex], small_titles, tiny_tokenizer, item_cfg, "answer")[0]
    choice = sft_records([ex], small_titles, tiny_tokenizer, item_cfg, "choice")[0]
    assert full["input_ids"] == choice["input_ids"]
    on = [t for t, m in zip(choice["input_ids"], choice["completion_mask"]) if m]
    assert tiny_tokenizer.convert_ids_to_tokens(on) == [item_token(ex.positive)]
    assert sum(full["completion_mask"]) > 10  # the whole answer and EOS
    with pytest.raises(ValueError, match="needs policy.prompt_style=item_tokens"):
        sft_records(
            [ex], small_titles, tiny_tokenizer, dataclasses.replace(small_policy_cfg, prompt_style="text"), "choice"
        )
    with pytest.raises(ValueError, match="sft.loss_tokens='x'"):
        sft_records([ex], small_titles, tiny_tokenizer, item_cfg, "x")


def test_item_prompt_without_candidates(tiny_tokenizer, small_titles, item_cfg):
    """policy.item_prompt_candidates=false: the prompt holds the instruction and the history only; the budget
    arithmetic still holds."""
    from abpo.policy.prompt import encode_prompt, fit_item_token_prompt, item_token, request_prompt

    cfg = dataclasses.replace(item_cfg, item_prompt_candidates=False)
    hist, cands = _ids(small_titles, 0, 30), _ids(small_titles, 100, 120)
    fp = request_prompt(
        tiny_tokenizer, [(i, small_titles[i]) for i in hist], [(i, small_titles[i]) for i in cands], cfg
    )
    assert not any(item_token(a) in fp.text for a in cands)
    assert fp.n_tokens == len(encode_prompt(tiny_tokenizer, fp.text))
    for budget in (fp.n_tokens - 1, fp.n_tokens - 20):
        cut = fit_item_token_prompt(
            tiny_tokenizer, hist, cands, max_history=50, max_prompt_tokens=budget, show_candidates=False
        )
        assert cut.n_tokens == len(encode_prompt(tiny_tokenizer, cut.text)) == budget
