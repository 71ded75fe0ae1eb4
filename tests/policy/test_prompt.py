"""The prompt template, the answer format and the strict parser (abpo.policy.prompt)."""

from __future__ import annotations

import pytest

from abpo.policy.prompt import (
    CANDIDATES_HEADER,
    INSTRUCTION,
    PromptTooLongError,
    build_prompt,
    encode_prompt,
    fit_prompt,
    format_answer,
    parse_answer,
    render_chat,
)

TITLES = {7: "Heat (1995)", 42: "Toy Story (1995)", 1234: "Alien (1979)"}


def test_format_answer_is_the_spec_format():
    assert format_answer(42, "Toy Story (1995)") == "<item_id>42</item_id><item>Toy Story (1995)</item>"


def test_build_prompt_order_and_history_cap():
    text = build_prompt(["A", "B", "C", "D"], [(7, "Heat (1995)"), (42, "Toy Story (1995)")], max_history=2)
    lines = text.split("\n")
    # only the 2 most recent history items, oldest first, then the candidates in order, then the instruction
    assert lines[1:3] == ["1. C", "2. D"]
    assert "A" not in lines and "1. B" not in text
    i = lines.index(CANDIDATES_HEADER)
    assert lines[i + 1 : i + 3] == [format_answer(7, "Heat (1995)"), format_answer(42, "Toy Story (1995)")]
    assert lines[-1] == INSTRUCTION
    with pytest.raises(ValueError, match="empty"):
        build_prompt(["A"], [], 3)


@pytest.mark.parametrize(
    "text",
    ["<item_id>42</item_id><item>Toy Story (1995)</item>", "  <item_id>42</item_id><item>Toy Story  (1995)</item>\n"],
)
def test_parse_good(text):
    p = parse_answer(text, TITLES)
    assert p.well_formed and p.item_id == 42 and p.reason is None


@pytest.mark.parametrize(
    "text",
    [
        "<item_id>42</item_id><item>Toy Story (1995)</ite",
        "<item_id>42</item_id><item>Toy Story",
        "<item_id>42</item_id><it",
        "<item_id>42</item_",
        "<item_id>4",
        "<item_",
    ],
)
def test_parse_truncated(text):
    p = parse_answer(text, TITLES)
    assert not p.well_formed and p.item_id is None and p.reason == "truncated"


@pytest.mark.parametrize(
    "text,reason",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("I recommend Toy Story", "garbage"),
        ("<item>Toy Story (1995)</item>", "garbage"),
        ("<item_id>4x2</item_id><item>Toy Story (1995)</item>", "id not an integer"),
        ("<item_id></item_id><item>Toy Story (1995)</item>", "id not an integer"),
        ("<item_id>42</item_id>Toy Story (1995)</item>", "garbage"),
        ("<item_id>42</item_id><item>Toy Story (1995)</item> and also Heat", "trailing text"),
        (
            "<item_id>42</item_id><item>Toy Story (1995)</item><item_id>7</item_id><item>Heat (1995)</item>",
            "trailing text",
        ),
    ],
)
def test_parse_malformed(text, reason):
    p = parse_answer(text, TITLES)
    assert not p.well_formed and p.item_id is None and p.reason.startswith(reason)


def test_parse_wrong_id_and_title():
    assert parse_answer("<item_id>99</item_id><item>Toy Story (1995)</item>", TITLES).reason == "id not in candidates"
    # ids only: the title is not checked; with titles, a mismatch is malformed
    assert parse_answer("<item_id>7</item_id><item>Toy Story (1995)</item>", [7, 42]).item_id == 7
    assert parse_answer("<item_id>7</item_id><item>Toy Story (1995)</item>", TITLES).reason == "title mismatch"


def test_render_and_fit_drop_oldest_history_first(tiny_tokenizer):
    history = [f"Old Movie {i} (19{50 + i})" for i in range(10)]
    cands = [(i, t) for i, t in TITLES.items()]
    full = fit_prompt(tiny_tokenizer, history, cands, max_history=10, max_prompt_tokens=100_000)
    assert full.history_shown == 10 and full.history_dropped == 0
    assert full.text == render_chat(tiny_tokenizer, full.user_text)
    assert full.n_tokens == len(encode_prompt(tiny_tokenizer, full.text))
    assert full.text.endswith("<|assistant|>")
    budget = full.n_tokens - 5  # not enough for all 10: the oldest go first
    fitted = fit_prompt(tiny_tokenizer, history, cands, max_history=10, max_prompt_tokens=budget)
    assert fitted.n_tokens <= budget and 0 < fitted.history_shown < 10
    assert fitted.history_dropped == 10 - fitted.history_shown
    kept = history[-fitted.history_shown :]
    assert all(t in fitted.user_text for t in kept) and history[0] not in fitted.user_text
    # the largest history that fits was kept: one more item would not fit
    one_more = fit_prompt(
        tiny_tokenizer, history[-(fitted.history_shown + 1) :], cands, max_history=10, max_prompt_tokens=100_000
    )
    assert one_more.n_tokens > budget
    # every candidate survives
    assert all(format_answer(i, t) in fitted.user_text for i, t in cands)


def test_fit_errors_when_candidates_alone_do_not_fit(tiny_tokenizer):
    cands = [(i, t) for i, t in TITLES.items()]
    none = fit_prompt(tiny_tokenizer, [], cands, max_history=10, max_prompt_tokens=100_000)
    with pytest.raises(PromptTooLongError, match="3 candidates alone take"):
        fit_prompt(tiny_tokenizer, ["A (2000)"], cands, max_history=10, max_prompt_tokens=none.n_tokens - 1)


def test_tiny_tokenizer_has_one_token_per_catalog_item(tiny_tokenizer, small_titles):
    """<item_id>ID</item_id> is one token for a catalog id (in answers and candidate lines alike); a non-catalog
    id still round-trips as markup + single digits; years in titles stay digits."""
    from abpo.policy.prompt import item_token

    some = list(small_titles)[7]
    ans = format_answer(some, small_titles[some])
    ids = encode_prompt(tiny_tokenizer, ans)
    assert tiny_tokenizer.convert_ids_to_tokens(ids[0]) == item_token(some)
    assert tiny_tokenizer.decode(ids) == ans
    line_ids = encode_prompt(tiny_tokenizer, "x\n" + ans + "\n")
    assert ids[0] in line_ids
    other = encode_prompt(tiny_tokenizer, format_answer(987654321, "Heat (1995)"))
    toks = tiny_tokenizer.convert_ids_to_tokens(other)
    assert (
        toks[:2] == ["<item_id>", "9"] and "1" in toks and tiny_tokenizer.decode(other).startswith("<item_id>987654321")
    )


def test_history_items_may_carry_ids():
    text = build_prompt([(7, "Heat (1995)"), "Toy Story (1995)"], [(1234, "Alien (1979)")], max_history=5)
    assert text.split("\n")[1:3] == [format_answer(7, "Heat (1995)"), "2. Toy Story (1995)"]
