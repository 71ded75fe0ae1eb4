"""Candidate-constrained rollouts (abpo.policy.constrained): the answer trie, the logits processor inside a real
HF `generate` with a different candidate set per row, and the constrained log-probs (Eq. q) against a brute-force
masked softmax over the full vocabulary."""

from __future__ import annotations

import pytest
import torch

from abpo.policy.constrained import (
    PAD_ALLOWED,
    AnswerTrie,
    CandidateConstraint,
    ConstrainedRolloutError,
    allowed_tensor,
    check_sampling,
    constrained_token_logps,
)
from abpo.policy.prompt import encode_answer, encode_prompt, format_answer, parse_answer, request_prompt


def test_trie_allows_only_answer_continuations():
    trie = AnswerTrie([[1, 5, 2, 7, 8], [1, 6, 2, 9], [1, 50, 2]], eos_token_id=0)
    assert sorted(trie.root) == [1]
    assert sorted(trie.walk([1])) == [5, 6, 50]  # the id position: one choice per candidate
    assert sorted(trie.walk([1, 6])) == [2]  # then the rest of that answer only
    assert trie.walk([1, 6, 2, 9]) == {0: {}}  # EOS ends it
    assert trie.walk([1, 4]) is None
    assert trie.allowed_per_position([1, 50, 2, 0]) == [[1], [5, 6, 50], [2], [0]]
    with pytest.raises(ConstrainedRolloutError, match="not an allowed continuation"):
        trie.allowed_per_position([1, 4])
    with pytest.raises(ValueError, match="empty candidate set"):
        AnswerTrie([], 0)


def test_sampling_truncation_is_refused():
    check_sampling(top_p=1.0, top_k=0, min_p=None)
    with pytest.raises(ValueError, match="top_p=0.9"):
        check_sampling(top_p=0.9, top_k=0, min_p=None)
    with pytest.raises(ValueError, match="top_k=5"):
        check_sampling(top_p=1.0, top_k=5, min_p=None)


def _prompts_and_sets(tok, titles, policy_cfg, n_rows, m):
    ids = sorted(titles)
    rows = []
    for r in range(n_rows):
        cands = ids[r * m : (r + 1) * m]  # a different candidate set per row
        hist = ids[200 + r : 203 + r]
        fp = request_prompt(tok, [(i, titles[i]) for i in hist], [(c, titles[c]) for c in cands], policy_cfg)
        rows.append((fp.text, cands))
    return rows


def test_generate_with_per_row_candidate_sets_always_names_a_candidate(
    tiny_model, tiny_tokenizer, small_titles, small_policy_cfg
):
    """An untrained model samples garbage freely; under the constraint every sampled answer of every row parses as
    well formed with an id of THAT row's candidate set, even though the rows' sets differ within one batch."""
    tok = tiny_tokenizer
    rows = _prompts_and_sets(tok, small_titles, small_policy_cfg, n_rows=6, m=5)
    tries = [
        AnswerTrie([encode_answer(tok, format_answer(c, small_titles[c])) for c in cands], tok.eos_token_id)
        for _, cands in rows
    ]
    prompt_ids = [encode_prompt(tok, text) for text, _ in rows]
    enc = tok.pad({"input_ids": prompt_ids}, padding_side="left", return_tensors="pt")
    torch.manual_seed(0)
    out_free = tiny_model.generate(**enc, do_sample=True, max_new_tokens=40, pad_token_id=tok.pad_token_id)
    free = tok.batch_decode(out_free[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert sum(parse_answer(t, cands).well_formed for t, (_, cands) in zip(free, rows)) < len(rows)

    chosen = []
    for seed in range(3):
        torch.manual_seed(seed)
        out = tiny_model.generate(
            **enc,
            do_sample=True,
            max_new_tokens=40,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            logits_processor=[CandidateConstraint(tries)],
        )
        texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        for (_, cands), text in zip(rows, texts):
            parsed = parse_answer(text, {c: small_titles[c] for c in cands})
            assert parsed.well_formed, (text, parsed.reason)
            chosen.append(parsed.item_id)
    assert len(set(chosen)) > len(rows)  # sampled, not a fixed answer per row


def test_constrained_logps_equal_a_masked_full_vocabulary_softmax(
    tiny_model, tiny_tokenizer, small_titles, small_policy_cfg
):
    """log q_theta (Eq. q) from the LM head rows of the allowed tokens only = log_softmax of the full logits / T
    restricted to S_t; forced positions are exactly 0 and carry no gradient; the entropy is the restricted one."""
    tok = tiny_tokenizer
    rows = _prompts_and_sets(tok, small_titles, small_policy_cfg, n_rows=3, m=4)
    tries, comps = [], []
    for r, (_, cands) in enumerate(rows):
        answers = [encode_answer(tok, format_answer(c, small_titles[c])) for c in cands]
        tries.append(AnswerTrie(answers, tok.eos_token_id))
        comps.append(answers[r % len(answers)] + [tok.eos_token_id])
    T = max(len(c) for c in comps)
    comp = torch.full((len(comps), T), tok.pad_token_id)
    for r, c in enumerate(comps):
        comp[r, : len(c)] = torch.tensor(c)
    allowed = allowed_tensor(tries, comps, T)
    assert allowed.shape[:2] == (3, T) and (allowed[:, :, 0] != PAD_ALLOWED).sum() == sum(len(c) for c in comps)
    prompts = [encode_prompt(tok, text) for text, _ in rows]
    P = max(len(p) for p in prompts)
    ids = torch.full((3, P + T), tok.pad_token_id)
    att = torch.zeros((3, P + T), dtype=torch.long)
    for r, (p, c) in enumerate(zip(prompts, comps)):
        ids[r, P - len(p) : P] = torch.tensor(p)
        att[r, P - len(p) : P] = 1
        ids[r, P : P + len(c)] = torch.tensor(c)
        att[r, P : P + len(c)] = 1
    model = tiny_model.train()
    temperature = 0.7
    hidden = model.get_decoder()(input_ids=ids, attention_mask=att).last_hidden_state[:, P - 1 : P + T - 1]
    logq, ent = constrained_token_logps(hidden, model.get_output_embeddings(), comp, allowed, temperature)
    full = model.get_output_embeddings()(hidden).float() / temperature  # [3, T, V]
    for r, c in enumerate(comps):
        for t, tok_id in enumerate(c):
            s = [int(a) for a in allowed[r, t] if a != PAD_ALLOWED]
            ref = torch.log_softmax(full[r, t, s], -1)
            assert logq[r, t].item() == pytest.approx(float(ref[s.index(tok_id)]), abs=1e-5)
            assert float(ent[r, t]) == pytest.approx(float(-(ref.exp() * ref).sum()), abs=1e-5)
            if len(s) == 1:
                assert float(logq[r, t]) == 0.0
    assert (logq[:, :] != 0).sum() == 3  # one branching position (the item id) per answer with the tiny tokenizer
    logq.sum().backward()
    assert model.get_output_embeddings().weight.grad is not None
    with pytest.raises(ConstrainedRolloutError):
        bad = comp.clone()
        t_branch = int(((allowed[0] != PAD_ALLOWED).sum(-1) > 1).nonzero()[0])
        bad[0, t_branch] = tok.eos_token_id  # not an allowed id
        constrained_token_logps(hidden.detach(), model.get_output_embeddings(), bad, allowed, 1.0)


def test_single_choice_rollouts_run_each_distinct_prompt_once_and_draw_what_one_forward_per_row_draws(
    tiny_model, tiny_tokenizer, small_titles, small_policy_cfg
):
    """TRL's sampler repeats a logged example's prompt for each of its rollouts: ``sample_single_choice`` runs the
    decoder over each distinct prompt once, and under one generator draws exactly what a forward per row followed by
    the same per-row categorical draws of Eq. q gives (the RNG is consumed row by row, in the rows' order)."""
    from abpo.policy.constrained import sample_single_choice
    from abpo.policy.token_scoring import next_token_logits

    tok = tiny_tokenizer
    sets = _prompts_and_sets(tok, small_titles, small_policy_cfg, n_rows=3, m=6)
    tries = [
        AnswerTrie([encode_answer(tok, format_answer(c, small_titles[c])) for c in cands], tok.eos_token_id)
        for _, cands in sets
    ]
    assert all(t.single_choice for t in tries)
    g = 5  # rollouts per prompt, next to each other (TRL's RepeatSampler); the last prompt once more at the end
    order = [r for r in range(len(sets)) for _ in range(g)] + [2]
    prompt_ids = [encode_prompt(tok, sets[r][0]) for r in order]
    rows_fed = []
    hook = tiny_model.get_decoder().register_forward_pre_hook(
        lambda _m, _a, kw: rows_fed.append(int(kw["input_ids"].shape[0])), with_kwargs=True
    )
    try:
        outs, logits = sample_single_choice(
            tiny_model, prompt_ids, [tries[r] for r in order], 0.7, generator=torch.Generator().manual_seed(3)
        )
    finally:
        hook.remove()
    assert sum(rows_fed) == len(sets)  # one forward row per distinct prompt, not one per rollout
    z = next_token_logits(tiny_model, prompt_ids, batch_tokens=16384)  # the reference: every row's own forward
    torch.testing.assert_close(logits.logits[logits.rows(prompt_ids)], z, atol=1e-5, rtol=0)
    gen = torch.Generator().manual_seed(3)
    expected = []
    for r, i in enumerate(order):
        allowed = torch.tensor(sorted(tries[i].root), dtype=torch.long)
        first = int(allowed[torch.multinomial(torch.softmax(z[r, allowed] / 0.7, -1), 1, generator=gen)])
        expected.append([first, *tries[i].forced_tail(first)])
    assert outs == expected
    assert len({o[0] for o in outs}) > len(sets)  # sampled per rollout, not one answer per prompt
