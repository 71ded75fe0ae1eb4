"""The tiny tokenizer and model build on a catalog of any size (training_corpus never builds an empty candidate
list), and every catalog item id is one token."""

from __future__ import annotations

from pathlib import Path

import pytest

from abpo.config.paths import PathsConfig


def _titles(movielens_dir, n_items: int) -> dict[int, str]:
    from abpo.data.loaders import load_movielens

    return load_movielens(movielens_dir(n_items, n_users=2, ratings_per_user=3)).titles()


@pytest.mark.parametrize("n", [1, 10, 11, 21, 2001])
def test_training_corpus_prompts_always_have_candidates(n):
    from abpo.policy.prompt import CANDIDATES_HEADER
    from abpo.policy.tokenizer import training_corpus

    corpus = training_corpus(f"Film {i} ({1950 + i % 70})" for i in range(n))
    prompts = [c for c in corpus if CANDIDATES_HEADER + "\n" in c]  # whole prompts, not template strings
    assert len(prompts) == (min(n, 2000) + 19) // 20
    assert all("<item_id>" in p.split(CANDIDATES_HEADER + "\n", 1)[1] for p in prompts)


def test_training_corpus_unchanged_for_full_chunks():
    from abpo.policy.prompt import build_prompt
    from abpo.policy.tokenizer import training_corpus

    titles = [f"T{i:03d}" for i in range(40)]
    corpus = training_corpus(titles)
    assert build_prompt(titles[:10], list(enumerate(titles[10:20], 0)), 10) in corpus
    assert build_prompt(titles[20:30], list(enumerate(titles[30:40], 20)), 10) in corpus


@pytest.mark.parametrize("n", [1, 10, 11, 21, 2001])
def test_tiny_tokenizer_and_model_on_any_catalog_size(n, movielens_dir, small_policy_cfg, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from abpo.policy.model import build_tiny
    from abpo.policy.prompt import item_token
    from abpo.policy.tokenizer import train_tiny_tokenizer

    titles = _titles(movielens_dir, n)
    assert len(titles) == n
    tok = train_tiny_tokenizer(titles.values(), small_policy_cfg.tiny_vocab_size, item_ids=titles)
    for i in titles:
        ids = tok(item_token(i), add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids[0]) == item_token(i)
    torch.set_num_threads(1)
    d = build_tiny(small_policy_cfg, PathsConfig(root=str(tmp_path / "var")), titles, seed=0)
    tok2 = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d)
    assert model.config.vocab_size == len(tok2) >= len(titles)
    some = max(titles)
    ids = tok2(f"{item_token(some)} {titles[some]}", add_special_tokens=False)["input_ids"]
    assert tok2.convert_ids_to_tokens(ids[0]) == item_token(some)
    with torch.no_grad():
        assert model(torch.tensor([ids])).logits.shape == (1, len(ids), len(tok2))


AMAZON = Path(__file__).resolve().parents[3] / "shared" / "data" / "amazon18"


@pytest.mark.skipif(not (AMAZON / "index").is_dir(), reason=f"{AMAZON} absent (not vendored)")
@pytest.mark.parametrize("domain", ["Office_Products", "Industrial_and_Scientific"])
def test_tiny_tokenizer_on_amazon18_titles(domain):
    from abpo.data.loaders import load_amazon18
    from abpo.policy.prompt import item_token
    from abpo.policy.tokenizer import train_tiny_tokenizer

    titles = load_amazon18(AMAZON, domain).titles()
    tok = train_tiny_tokenizer(titles.values(), 800, item_ids=titles)
    ids = tok([item_token(i) for i in titles], add_special_tokens=False)["input_ids"]
    assert all(len(x) == 1 for x in ids) and len({x[0] for x in ids}) == len(titles)
