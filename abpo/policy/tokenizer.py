"""The `tiny` model's tokenizer: byte-level BPE trained with `tokenizers` on the catalog titles and the prompt
template, so any text round-trips (no unknown tokens), digits are single tokens and the answer markup
``<item_id> </item_id> <item> </item>`` are one token each.

Per-item tokens: every catalog item gets ONE token for its whole id markup ``<item_id>ID</item_id>`` (an added
token; added tokens are matched longest-first before the BPE, so ``<item_id>1234</item_id>`` is that one token
wherever it occurs: in the candidate lines, the history lines and the answers). Its embedding (tied with the output
head) is a per-item vector the model can learn popularity and co-occurrence in, and the first answer token is a
choice among items. The text is unchanged (a pretrained tokenizer just splits the digits); an id outside the
catalog still tokenizes as ``<item_id>`` + digits + ``</item_id>``.

Chat format (the template ``render_chat`` applies)::

    <|bos|><|user|>USER TEXT<|end|><|assistant|>ANSWER<|end|>

``<|end|>`` is the EOS token; ``<|pad|>`` pads.
"""

from __future__ import annotations

from collections.abc import Iterable

from abpo.policy.prompt import ANSWER_MARKUP, TEMPLATE_STRINGS, build_prompt, format_answer, item_token

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|end|>"
USER, ASSISTANT, SYSTEM = "<|user|>", "<|assistant|>", "<|system|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, USER, ASSISTANT, SYSTEM]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def training_corpus(titles: Iterable[str]) -> list[str]:
    """Texts the BPE merges are learnt from: each title, each title as an answer, and the template's fixed text
    (repeated so its words become tokens)."""
    titles = sorted({" ".join(str(t).split()) for t in titles})
    corpus = list(titles)
    corpus += [format_answer(i, t) for i, t in enumerate(titles)]
    # A few full prompts so the numbered-history and layout whitespace patterns are merged like real prompts:
    # 10 history titles and the rest as candidates; a short last chunk (a small catalog) keeps at least one
    # candidate, since a prompt needs one (any catalog of >= 1 title trains; full chunks are unchanged).
    for start in range(0, min(len(titles), 2000), 20):
        chunk = titles[start : start + 20]
        n_hist = min(10, len(chunk) - 1)
        corpus.append(build_prompt(chunk[:n_hist], list(enumerate(chunk[n_hist:], start)), 10))
    corpus += list(TEMPLATE_STRINGS) * 200
    return corpus


def train_tiny_tokenizer(titles: Iterable[str], vocab_size: int, item_ids: Iterable[int] = ()):
    """Train the byte-level BPE (``vocab_size`` tokens) and wrap it as a transformers ``PreTrainedTokenizerFast``
    with the chat template; then add one token per id in ``item_ids`` (``item_token``, ascending id order).

    Deterministic for a given title and id set (the corpus is sorted; the BPE trainer breaks ties
    deterministically).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(titles), trainer=trainer)
    tok.add_tokens(list(ANSWER_MARKUP))  # one token each, not special (kept by decode)
    ids = sorted({int(i) for i in item_ids})
    if ids:
        tok.add_tokens([AddedToken(item_token(i), normalized=False) for i in ids])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[USER, ASSISTANT, SYSTEM],
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "right"
    return fast
