"""The `tiny` model's tokenizer: byte-level BPE trained with `tokenizers` on the catalog titles and the prompt
template, so any text round-trips (no unknown tokens), digits are single tokens (item ids are generated digit by
digit) and the answer markup ``<item_id> </item_id> <item> </item>`` are one token each.

Chat format (the template ``render_chat`` applies)::

    <|bos|><|user|>USER TEXT<|end|><|assistant|>ANSWER<|end|>

``<|end|>`` is the EOS token; ``<|pad|>`` pads.
"""

from __future__ import annotations

from collections.abc import Iterable

from abpo.policy.prompt import ANSWER_MARKUP, TEMPLATE_STRINGS, build_prompt, format_answer

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
    # A few full prompts so the numbered-history and layout whitespace patterns are merged like real prompts.
    for start in range(0, min(len(titles), 2000), 20):
        chunk = titles[start : start + 20]
        corpus.append(build_prompt(chunk[:10], list(enumerate(chunk[10:], start)), 10))
    corpus += list(TEMPLATE_STRINGS) * 200
    return corpus


def train_tiny_tokenizer(titles: Iterable[str], vocab_size: int):
    """Train the byte-level BPE and wrap it as a transformers ``PreTrainedTokenizerFast`` with the chat template.

    Deterministic for a given title set (the corpus is sorted; the BPE trainer breaks ties deterministically).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
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
