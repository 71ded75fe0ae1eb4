"""The trainer's answer tokens (abpo.train.answers): a candidate set's answers tokenized in one batched call give the
ids abpo.policy.prompt.encode_answer gives each on its own (the ids SFT trained on and the constraint allows)."""

from __future__ import annotations


def test_a_candidate_sets_answers_tokenized_together_equal_each_on_its_own(load_tiny, tiny_titles):
    from abpo.policy.prompt import encode_answer, format_answer
    from abpo.train.answers import AnswerTokens

    _, tok = load_tiny()
    texts = [format_answer(i, t) for i, t in sorted(tiny_titles.items())]
    texts += [format_answer(7, "Amélie (Le fabuleux destin d'Amélie Poulain) (2001)"), texts[0]]  # a repeat
    answers = AnswerTokens(tok)
    first = answers.ids(texts[3])  # one already cached
    calls = []
    tokenizer_call = type(tok).__call__

    def counting(self, text, *a, **kw):
        calls.append(text)
        return tokenizer_call(self, text, *a, **kw)

    type(tok).__call__ = counting
    try:
        together = answers.ids_many(texts)
    finally:
        type(tok).__call__ = tokenizer_call
    assert together == [encode_answer(tok, t) for t in texts]
    assert together[3] == first
    assert len(calls) == 1 and len(calls[0]) == len(set(texts)) - 1  # one call, for the answers not cached yet
    assert answers.ids_many(texts) == together  # now every one cached
