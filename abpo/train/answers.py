"""The candidate answers as the trainer's collaborators see them: their token ids and title lengths
(:class:`AnswerTokens`, cached per text) and the answer trie of each logged example's candidate set
(:class:`AnswerTries`: the constraint of constrained rollouts, Eq. q of abpo.policy.constrained, and the choice
positions r_sc of docs/ABPO_SPEC.md step 2 averages over)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from abpo.policy.prompt import ITEM_CLOSE, ITEM_OPEN, encode_answer

ANSWER_CACHE = 200_000  # answers (and titles) whose token ids / counts are kept
TRIE_CACHE = 20_000  # logged examples whose answer trie is kept (cleared when full)


class AnswerTokens:
    """Token ids of well-formed answers ``<item_id>ID</item_id><item>TITLE</item>`` under ``tokenizer`` (as SFT
    encodes them, abpo.policy.prompt.encode_answer) and the token count of their titles, each cached per text."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._ids: dict[str, list[int]] = {}
        self._title_len: dict[str, int] = {}

    def ids(self, text: str) -> list[int]:
        """The token ids of the answer ``text`` (no EOS)."""
        ids = self._ids.get(text)
        if ids is None:
            ids = encode_answer(self.tokenizer, text)
            if len(self._ids) < ANSWER_CACHE:
                self._ids[text] = ids
        return ids

    def ids_many(self, texts: Sequence[str]) -> list[list[int]]:
        """The token ids of each answer of ``texts`` (no EOS), those not cached yet tokenized in one batched call of
        the tokenizer (each on its own, as encode_answer does: a candidate set's answers at once, ~2x faster)."""
        fresh: dict[str, list[int]] = {}
        missing = [t for t in dict.fromkeys(texts) if t not in self._ids]
        if missing:
            for text, ids in zip(missing, self.tokenizer(missing, add_special_tokens=False)["input_ids"], strict=True):
                fresh[text] = list(ids)
                if len(self._ids) < ANSWER_CACHE:
                    self._ids[text] = fresh[text]
        return [fresh[t] if t in fresh else self._ids[t] for t in texts]

    def title_tokens(self, answer: str) -> int:
        """Token count of the title inside a candidate answer ``<item_id>ID</item_id><item>TITLE</item>``."""
        n = self._title_len.get(answer)
        if n is None:
            start = answer.find(ITEM_OPEN)
            end = answer.rfind(ITEM_CLOSE)
            title = answer[start + len(ITEM_OPEN) : end] if 0 <= start < end else answer
            n = len(self.tokenizer(title, add_special_tokens=False)["input_ids"])
            if len(self._title_len) < ANSWER_CACHE:
                self._title_len[answer] = n
        return n


class AnswerTries:
    """The answer trie of each dataset row's candidate set (abpo.policy.constrained.AnswerTrie, cached per logged
    example) and the positions r_sc averages over.

    ``constrained``: policy.constrained_rollouts (every candidate's answer + EOS must then fit
    ``max_completion_length``); ``sc_positions``: update.self_certainty_positions (``choice`` | ``answer``)."""

    def __init__(
        self,
        answers: AnswerTokens,
        *,
        eos_token_id: int,
        constrained: bool,
        max_completion_length: int,
        sc_positions: str,
    ):
        self.answers = answers
        self.eos_token_id = eos_token_id
        self.constrained = constrained
        self.max_completion_length = max_completion_length
        self.sc_positions = sc_positions
        self._tries: dict[str, Any] = {}

    def trie(self, row: dict):
        """The answer trie of one dataset row's candidate set (cached per logged example): the constraint of
        constrained rollouts, and where the answers branch (the choice positions of self-certainty)."""
        from abpo.policy.constrained import AnswerTrie

        key = str(row["request_id"])
        trie = self._tries.get(key)
        if trie is None:
            if len(self._tries) > TRIE_CACHE:
                self._tries.clear()
            answers = self.answers.ids_many(row["candidate_answers"])
            longest = max(len(a) for a in answers) + 1  # + EOS
            if self.constrained and longest > self.max_completion_length:
                raise ValueError(
                    f"logged example {key}: its longest candidate answer takes {longest} tokens with EOS, over "
                    f"update.max_completion_length={self.max_completion_length}; rule: with constrained rollouts every "
                    "candidate's answer must fit (a cut answer gets no format reward): raise the limit"
                )
            trie = AnswerTrie(answers, self.eos_token_id)
            self._tries[key] = trie
        return trie

    def sc_mask(self, row: dict, completion: Sequence[int]) -> list[int]:
        """The tokens r_sc of docs/ABPO_SPEC.md step 2 averages over, per update.self_certainty_positions:
        ``choice`` (default): where the row's candidate answers branch (``AnswerTrie.choice_mask``: the item token of
        an item-token model, the id tokens of a text model); ``answer``: every token of the completion (choice
        token, title tokens, EOS), the paper's (1/T) sum over t = 1..T."""
        if self.sc_positions == "answer":
            return [1] * len(completion)
        return self.trie(row).choice_mask(completion)
