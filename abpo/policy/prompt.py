"""The prompt q (user history + candidate set C) and the answer format of docs/ABPO_SPEC.md
"Prompt and answer format", in two styles (``policy.prompt_style``).

``text`` (the paper's prompt; the smollm2 and gpu presets): one template, three parts in this order:

1. the user's history: item titles, oldest first, the most recent ``max_history`` of them;
2. the candidate set: one line per candidate, written exactly as a well-formed answer
   (``<item_id>ID</item_id><item>TITLE</item>``) so the answer is a copy of one line;
3. the instruction: pick the single most suitable next item, answer in that format.

``build_prompt`` gives the user message; ``render_chat`` wraps it in the tokenizer's chat template (ending at the
start of the assistant turn: the string the model continues); ``fit_prompt`` does both under a token budget,
dropping the OLDEST history items first and never cutting the candidate list (``PromptTooLongError`` when the
candidates alone do not fit).

``item_tokens`` (models with one vocabulary token per item, i.e. the tiny model; the tiny and demo presets):
the instruction, then the candidate set as item tokens ``<item_id>ID</item_id>`` back to back, then the history as
item tokens, oldest first and the most recent last (``build_item_token_prompt``). Each item is ONE token, so a
history of 200 items and 100 candidates is ~330 tokens, where the text style needs ~1,800 for 10 titles. The
history comes last so that the latest items sit right before the answer at the same relative positions whatever the
candidate count: the layout of next-item pre-training (abpo.policy.pretrain), where the next item is predicted
right after the last one. Over the budget the oldest history items are dropped first, as in the text style.

The answer r(a) of candidate a is ``format_answer(a, title(a))`` in both styles; ``parse_answer`` is the strict
parser used for the format reward and for HR@1-by-generation.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from abpo.config.policy import PROMPT_STYLES
from abpo.errors import ExpectedError

ID_OPEN, ID_CLOSE = "<item_id>", "</item_id>"
ITEM_OPEN, ITEM_CLOSE = "<item>", "</item>"
#: Markup tokens of the answer format (the tiny tokenizer makes each one token).
ANSWER_MARKUP = (ID_OPEN, ID_CLOSE, ITEM_OPEN, ITEM_CLOSE)

HISTORY_HEADER = "The user interacted with these items, oldest first:"
EMPTY_HISTORY = "(no history shown)"
CANDIDATES_HEADER = "Candidate items:"
INSTRUCTION = (
    "Recommend the single most suitable next item for this user from the candidate items. "
    f"Answer with exactly one candidate as {ID_OPEN}ID{ID_CLOSE}{ITEM_OPEN}TITLE{ITEM_CLOSE}."
)
#: Short on purpose: every token of the fixed text is paid in each of the ~97k SFT pairs and every scored prompt.
ITEM_TOKEN_INSTRUCTION = "Recommend the next item from the candidates."
ITEM_TOKEN_CANDIDATES_HEADER = "Candidates:"
ITEM_TOKEN_HISTORY_HEADER = "History:"
#: Every fixed string of the templates (the tiny tokenizer is trained on these too).
TEMPLATE_STRINGS = (
    HISTORY_HEADER,
    EMPTY_HISTORY,
    CANDIDATES_HEADER,
    INSTRUCTION,
    ITEM_TOKEN_INSTRUCTION,
    ITEM_TOKEN_CANDIDATES_HEADER,
    ITEM_TOKEN_HISTORY_HEADER,
)


class PromptTooLongError(ExpectedError, ValueError):
    """The candidate set alone (with no history) exceeds the prompt token budget."""


def _clean_title(title: str) -> str:
    # A title is shown on one line; newlines would break the one-candidate-per-line layout.
    return " ".join(str(title).split())


def format_answer(item_id: int, title: str) -> str:
    """The well-formed answer r(a) for item ``item_id``: ``<item_id>ID</item_id><item>TITLE</item>``."""
    return f"{ID_OPEN}{int(item_id)}{ID_CLOSE}{ITEM_OPEN}{_clean_title(title)}{ITEM_CLOSE}"


def item_token(item_id: int) -> str:
    """The item token of ``item_id``: its whole id markup ``<item_id>ID</item_id>``, the first token of its answer
    (one vocabulary token in a tokenizer with item tokens, abpo.policy.tokenizer)."""
    return f"{ID_OPEN}{int(item_id)}{ID_CLOSE}"


def build_item_token_prompt(
    history_ids: Sequence[int], candidate_ids: Sequence[int], max_history: int, *, show_candidates: bool = True
) -> str:
    """The user message of prompt q in the ``item_tokens`` style: the instruction, the candidates as item tokens
    (unless ``show_candidates`` is false: then C acts through the constraint alone), then the last ``max_history``
    history items as item tokens (oldest first, the most recent last). ``max_history <= 0`` shows no history. The
    candidate list is never shortened here."""
    if not candidate_ids:
        raise ValueError("build_item_token_prompt: the candidate set is empty")
    shown = list(history_ids)[-max_history:] if max_history > 0 else []
    lines = [ITEM_TOKEN_INSTRUCTION]
    if show_candidates:
        lines.append(ITEM_TOKEN_CANDIDATES_HEADER + "".join(item_token(a) for a in candidate_ids))
    lines.append(ITEM_TOKEN_HISTORY_HEADER + ("".join(item_token(h) for h in shown) if shown else EMPTY_HISTORY))
    return "\n".join(lines)


def prompt_style(policy_cfg: Any) -> str:
    """``policy.prompt_style``, checked."""
    style = getattr(policy_cfg, "prompt_style", "text")
    if style not in PROMPT_STYLES:
        raise ValueError(f"policy.prompt_style={style!r}; rule: one of {list(PROMPT_STYLES)}")
    return style


def check_item_tokens(tokenizer: Any, item_ids: Sequence[int]) -> list[int]:
    """The vocabulary ids of the item tokens of ``item_ids``; raises when one of them is not ONE token of
    ``tokenizer`` (the item_tokens style and choice scoring need a tokenizer with item tokens)."""
    toks = [item_token(i) for i in item_ids]
    ids = tokenizer.convert_tokens_to_ids(toks)
    unk = getattr(tokenizer, "unk_token_id", None)
    bad = [int(i) for i, t in zip(item_ids, ids) if t is None or (unk is not None and t == unk)]
    if bad:
        raise ValueError(
            f"policy.prompt_style=item_tokens: items {bad[:5]} have no item token in tokenizer "
            f"{getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)}; rule: the item_tokens style needs one "
            "vocabulary token per item (the tiny model's tokenizer, built on this catalog); use prompt_style=text"
        )
    return [int(t) for t in ids]


def _history_line(i: int, item: str | tuple[int, str]) -> str:
    """One history line: ``"i. TITLE"`` for a title, or the candidate-line format
    ``<item_id>ID</item_id><item>TITLE</item>`` for an ``(item_id, title)`` pair."""
    if isinstance(item, str):
        return f"{i}. {_clean_title(item)}"
    item_id, title = item
    return format_answer(item_id, title)


def build_prompt(
    history_titles: Sequence[str | tuple[int, str]], candidates: list[tuple[int, str]], max_history: int
) -> str:
    """The user message of prompt q: the last ``max_history`` history titles (oldest first, numbered), then every
    candidate as ``<item_id>ID</item_id><item>TITLE</item>`` in the given order, then the instruction.

    ``max_history <= 0`` shows no history. The candidate list is never shortened here.
    """
    if not candidates:
        raise ValueError("build_prompt: the candidate set is empty")
    shown = list(history_titles)[-max_history:] if max_history > 0 else []
    lines = [HISTORY_HEADER]
    if shown:
        lines += [_history_line(i, h) for i, h in enumerate(shown, 1)]
    else:
        lines.append(EMPTY_HISTORY)
    lines.append(CANDIDATES_HEADER)
    lines += [format_answer(item_id, title) for item_id, title in candidates]
    lines.append(INSTRUCTION)
    return "\n".join(lines)


def render_chat(tokenizer: Any, user_text: str) -> str:
    """The text the model continues: ``user_text`` as one user turn of the tokenizer's chat template, with the
    generation prompt (the start of the assistant turn) appended. Tokenize it with ``add_special_tokens=False``
    (the template already holds any BOS)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"render_chat: tokenizer {type(tokenizer).__name__} ({getattr(tokenizer, 'name_or_path', '?')}) "
            "has no chat template; the prompt format needs one"
        )
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": user_text}], tokenize=False, add_generation_prompt=True
    )


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a rendered prompt (no special tokens added: the chat template holds them)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_answer(tokenizer: Any, answer: str) -> list[int]:
    """Token ids of an answer r(a), tokenized on its own (the continuation of the prompt's ids)."""
    return list(tokenizer(answer, add_special_tokens=False)["input_ids"])


def check_answers_fit(
    tokenizer: Any, titles: Mapping[int, str], cfg: Any, where: str, items: Iterable[int] | None = None
) -> None:
    """ConfigError when, with ``policy.constrained_rollouts``, the catalog's longest well-formed answer r(a) plus EOS
    (tokenized as :func:`encode_answer` does) takes more than ``update.max_completion_length`` tokens: the update's
    constrained rollouts refuse such a request (abpo.train.answers.AnswerTries), and only when one shows the item,
    possibly months later. Checked where the catalog and the tokenizer are first known together (``where``: pi_init's
    SFT, an adopted model's tokenizer), and again by an update over the candidates of the rows it trains on
    (``items``): a state bootstrapped under a larger limit and run with a smaller one failed in the middle of its
    update with a traceback. Free rollouts cut a long answer (no format reward): not refused."""
    from abpo.config.errors import ConfigError

    limit = int(cfg.update.max_completion_length)
    if not cfg.policy.constrained_rollouts or not titles:
        return
    items = sorted(titles) if items is None else sorted({int(i) for i in items if int(i) in titles})
    if not items:
        return
    longest, item = 0, items[0]
    for k in range(0, len(items), 4096):  # batches of the same per-answer encoding
        chunk = items[k : k + 4096]
        ids = tokenizer([format_answer(i, titles[i]) for i in chunk], add_special_tokens=False)["input_ids"]
        for i, a in zip(chunk, ids):
            if len(a) + 1 > longest:
                longest, item = len(a) + 1, i
    if longest > limit:
        raise ConfigError(
            f"{where}: update.max_completion_length={limit}: item {item} ({titles[item]!r}) answers in "
            f"{longest} tokens with EOS under the tokenizer of policy.model {cfg.policy.model!r}; rule: with "
            "policy.constrained_rollouts every candidate's answer <item_id>ID</item_id><item>TITLE</item> + EOS "
            f"must fit a rollout (the update refuses a request showing it): raise update.max_completion_length to "
            f"at least {longest}"
        )


@dataclass(frozen=True)
class FittedPrompt:
    """A prompt fitted to the token budget."""

    text: str  # chat-rendered: what the model continues
    user_text: str  # the user message (build_prompt's output)
    n_tokens: int
    history_shown: int  # history items in the prompt
    history_dropped: int  # oldest items dropped for the budget (beyond max_history)


def fit_prompt(
    tokenizer: Any,
    history_titles: Sequence[str | tuple[int, str]],  # titles, or (item_id, title) with policy.history_item_ids
    candidates: list[tuple[int, str]],
    *,
    max_history: int,
    max_prompt_tokens: int,
) -> FittedPrompt:
    """``build_prompt`` + ``render_chat`` under ``max_prompt_tokens``: keeps as many of the most recent (at most
    ``max_history``) history items as fit, dropping the oldest first; the candidate list is never cut.

    Raises ``PromptTooLongError`` when even the prompt with no history is over the budget.
    """
    history = list(history_titles)[-max_history:] if max_history > 0 else []

    def render(k: int) -> tuple[str, str, int]:
        user = build_prompt(history[len(history) - k :] if k else [], candidates, k)
        text = render_chat(tokenizer, user)
        return user, text, len(encode_prompt(tokenizer, text))

    user, text, n = render(len(history))
    if n <= max_prompt_tokens:
        return FittedPrompt(text, user, n, len(history), 0)
    user0, text0, n0 = render(0)
    if n0 > max_prompt_tokens:
        raise PromptTooLongError(
            f"prompt: the {len(candidates)} candidates alone take {n0} tokens, over policy.max_prompt_tokens="
            f"{max_prompt_tokens}; raise the budget or lower the candidate count"
        )
    # The token count grows with the number of history items kept: binary search the largest k that fits.
    lo, hi, best = 0, len(history), (user0, text0, n0, 0)
    while lo <= hi:
        mid = (lo + hi) // 2
        u, t, m = render(mid)
        if m <= max_prompt_tokens:
            best, lo = (u, t, m, mid), mid + 1
        else:
            hi = mid - 1
    u, t, m, k = best
    return FittedPrompt(t, u, m, k, len(history) - k)


_FIXED_TOKENS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _item_token_overhead(tokenizer: Any, show_candidates: bool = True) -> tuple[int, int]:
    """Tokens of the item_tokens prompt besides its items: (with a history, with the empty-history marker). Each
    item is one added token, so the text between items tokenizes the same whatever the items (measured once per
    tokenizer on a 1-candidate, 1-item prompt)."""
    try:
        cached = _FIXED_TOKENS.get(tokenizer, {}).get(show_candidates)
    except TypeError:
        cached = None
    if cached is None:
        probe = next(iter(tokenizer.get_added_vocab()), None)
        item = None
        for tok in tokenizer.get_added_vocab():
            if tok.startswith(ID_OPEN) and tok.endswith(ID_CLOSE) and tok[len(ID_OPEN) : -len(ID_CLOSE)].isdigit():
                item = int(tok[len(ID_OPEN) : -len(ID_CLOSE)])
                break
        if item is None:
            raise ValueError(f"policy.prompt_style=item_tokens: tokenizer has no item tokens (first added: {probe!r})")
        c = 1 if show_candidates else 0
        with_h = (
            len(
                encode_prompt(
                    tokenizer,
                    render_chat(tokenizer, build_item_token_prompt([item], [item], 1, show_candidates=show_candidates)),
                )
            )
            - 1
            - c
        )
        no_h = (
            len(
                encode_prompt(
                    tokenizer,
                    render_chat(tokenizer, build_item_token_prompt([], [item], 0, show_candidates=show_candidates)),
                )
            )
            - c
        )
        cached = (with_h, no_h)
        try:
            _FIXED_TOKENS.setdefault(tokenizer, {})[show_candidates] = cached
        except TypeError:
            pass
    return cached


def fit_item_token_prompt(
    tokenizer: Any,
    history_ids: Sequence[int],
    candidate_ids: Sequence[int],
    *,
    max_history: int,
    max_prompt_tokens: int,
    show_candidates: bool = True,
) -> FittedPrompt:
    """``build_item_token_prompt`` + ``render_chat`` under ``max_prompt_tokens``: every item is one token, so the
    prompt with k >= 1 history items takes (its fixed text) + |C| + k tokens; the oldest items beyond the budget are
    dropped, the candidate list is never cut (``PromptTooLongError`` when the candidates alone do not fit). Raises
    when an item has no item token (``check_item_tokens``)."""
    history = list(history_ids)[-max_history:] if max_history > 0 else []
    check_item_tokens(tokenizer, [*candidate_ids, *history])
    with_h, no_h = _item_token_overhead(tokenizer, show_candidates)
    n_c = len(candidate_ids) if show_candidates else 0
    n0 = no_h + n_c
    k = max(0, min(len(history), max_prompt_tokens - with_h - n_c))
    if k == 0 and n0 > max_prompt_tokens:
        raise PromptTooLongError(
            f"prompt: the {len(candidate_ids)} candidates alone take {n0} tokens, over policy.max_prompt_tokens="
            f"{max_prompt_tokens}; raise the budget or lower the candidate count"
        )
    if k == 0:
        user = build_item_token_prompt([], candidate_ids, 0, show_candidates=show_candidates)
        return FittedPrompt(render_chat(tokenizer, user), user, n0, 0, len(history))
    user = build_item_token_prompt(history[len(history) - k :], candidate_ids, k, show_candidates=show_candidates)
    return FittedPrompt(render_chat(tokenizer, user), user, with_h + n_c + k, k, len(history) - k)


def request_prompt(
    tokenizer: Any,
    history: Sequence[tuple[int, str]],
    candidates: Sequence[tuple[int, str]],
    policy_cfg: Any,
) -> FittedPrompt:
    """THE prompt of a request (history and candidates as (item id, title) pairs): every caller that builds a
    prompt for the policy (SFT, evaluation, the logging policy's e0, the update's rollouts and e_old, serving)
    goes through here, so ``policy.history_item_ids``, ``policy.max_history`` and ``policy.max_prompt_tokens``
    mean the same thing everywhere (a prompt built one way and scored another would make e_old / e0 compare two
    different policies)."""
    if prompt_style(policy_cfg) == "item_tokens":
        return fit_item_token_prompt(
            tokenizer,
            [int(i) for i, _ in history],
            [int(i) for i, _ in candidates],
            max_history=policy_cfg.max_history,
            max_prompt_tokens=policy_cfg.max_prompt_tokens,
            show_candidates=bool(getattr(policy_cfg, "item_prompt_candidates", True)),
        )
    with_ids = bool(getattr(policy_cfg, "history_item_ids", False))
    return fit_prompt(
        tokenizer,
        [(int(i), t) if with_ids else t for i, t in history],
        [(int(i), t) for i, t in candidates],
        max_history=policy_cfg.max_history,
        max_prompt_tokens=policy_cfg.max_prompt_tokens,
    )


def example_prompt(example: Any, titles: Mapping[int, str], tokenizer: Any, policy_cfg: Any) -> FittedPrompt:
    """The fitted prompt of an ``abpo.data.candidates.Example`` (history ids and candidate ids -> titles)."""
    missing = [i for i in [*example.history, *example.candidates] if i not in titles]
    if missing:
        raise KeyError(f"request {example.request_id}: item ids {missing[:5]} not in the catalog")
    return request_prompt(
        tokenizer,
        [(i, titles[i]) for i in example.history],
        [(i, titles[i]) for i in example.candidates],
        policy_cfg,
    )


# ----------------------------------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class ParsedAnswer:
    """Result of ``parse_answer``: ``item_id`` when well formed, else ``reason`` says what is wrong."""

    item_id: int | None
    reason: str | None
    title: str | None = None

    @property
    def well_formed(self) -> bool:
        return self.reason is None


def _bad(reason: str, title: str | None = None) -> ParsedAnswer:
    return ParsedAnswer(None, reason, title)


def _leading(pattern: re.Pattern[str], text: str) -> int:
    """The length of ``pattern``'s match at the start of ``text``; the patterns used (``\\s*``, ``\\d*``) match the
    empty string, so a match always exists."""
    m = pattern.match(text)
    if m is None:
        raise ValueError(f"parse_answer: pattern {pattern.pattern!r} must match the empty string")
    return m.end()


def _expect(text: str, pos: int, literal: str) -> int | str:
    """Match ``literal`` at ``pos``: the new position, ``"truncated"`` if text ends inside it, else ``"bad"``."""
    rest = text[pos : pos + len(literal)]
    if rest == literal:
        return pos + len(literal)
    if literal.startswith(rest):  # text ended part way (rest may be empty)
        return "truncated"
    return "bad"


_WS = re.compile(r"\s*")
_DIGITS = re.compile(r"\d*")


def parse_answer(text: str, candidate_ids: Sequence[int] | Mapping[int, str]) -> ParsedAnswer:
    """Strictly parse one answer ``<item_id>ID</item_id><item>TITLE</item>`` (whitespace allowed only around it).

    ``candidate_ids``: the ids of C, or a mapping id -> title (then the title must match the catalog's, up to
    whitespace). Reasons: ``empty``, ``truncated``, ``garbage: ...``, ``id not an integer``,
    ``trailing text after </item>``, ``id not in candidates``, ``title mismatch``.
    """
    if text is None or not text.strip():
        return _bad("empty")
    pos = _leading(_WS, text)
    # <item_id>
    r = _expect(text, pos, ID_OPEN)
    if r == "truncated":
        return _bad("truncated")
    if not isinstance(r, int):  # "bad"
        return _bad(f"garbage: expected {ID_OPEN} at char {pos}")
    pos = r
    # ID digits up to </item_id>
    end = text.find(ID_CLOSE, pos)
    if end < 0:
        tail = text[pos:]
        rem = tail[_leading(_DIGITS, tail) :]
        if ID_CLOSE.startswith(rem):  # digits, then nothing or part of </item_id>
            return _bad("truncated")
        return _bad(f"garbage: no {ID_CLOSE} after the id")
    raw_id = text[pos:end]
    if not raw_id.isdigit() or not raw_id.isascii():
        return _bad(f"id not an integer: {raw_id[:20]!r}")
    item_id = int(raw_id)
    pos = end + len(ID_CLOSE)
    # <item>
    r = _expect(text, pos, ITEM_OPEN)
    if r == "truncated":
        return _bad("truncated")
    if not isinstance(r, int):  # "bad"
        return _bad(f"garbage: expected {ITEM_OPEN} at char {pos}")
    pos = r
    end = text.find(ITEM_CLOSE, pos)
    if end < 0:
        return _bad("truncated")
    title = text[pos:end]
    rest = text[end + len(ITEM_CLOSE) :]
    if rest.strip():
        return _bad("trailing text after </item>", title)
    if item_id not in candidate_ids:
        return ParsedAnswer(None, "id not in candidates", title)
    if isinstance(candidate_ids, Mapping):
        if " ".join(title.split()) != _clean_title(candidate_ids[item_id]):
            return ParsedAnswer(None, "title mismatch", title)
    return ParsedAnswer(item_id, None, title)
