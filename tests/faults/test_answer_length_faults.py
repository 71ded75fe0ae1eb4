"""Issue 59 point 11: a catalog whose longest candidate answer (with EOS) is over update.max_completion_length, with
constrained rollouts, passed the bootstrap and month 1 and failed a later month's update, the first time a request
showed that item. It is refused where the catalog and the tokenizer are first known together (pi_init's SFT, run by
the bootstrap, and `abpo arms adopt`), naming the item, its length and the key to raise."""

from __future__ import annotations

import pytest


def _longest(tokenizer, titles) -> tuple[int, int]:
    """(item, tokens with EOS) of the catalog's longest answer, counted one answer at a time as the update does."""
    from abpo.policy.prompt import encode_answer, format_answer

    return max(
        ((i, len(encode_answer(tokenizer, format_answer(i, t))) + 1) for i, t in titles.items()), key=lambda x: x[1]
    )


def test_the_catalogs_longest_answer_over_the_limit_is_refused_naming_item_length_and_key(make_cfg, build_tiny_model):
    from transformers import AutoTokenizer

    from abpo.config.errors import ConfigError
    from abpo.data.loaders import load_dataset
    from abpo.policy.prompt import check_answers_fit

    cfg = make_cfg()
    titles = load_dataset(cfg.data).titles()
    tok = AutoTokenizer.from_pretrained(build_tiny_model(cfg.policy, titles))
    item, n = _longest(tok, titles)
    assert n <= cfg.update.max_completion_length  # the preset's limit holds its catalog (configs/tiny.yaml: 64)
    check_answers_fit(tok, titles, cfg, "pi_init's SFT")
    cfg.update.max_completion_length = n - 1
    with pytest.raises(ConfigError) as e:
        check_answers_fit(tok, titles, cfg, "pi_init's SFT")
    msg = str(e.value)
    assert len(msg.splitlines()) == 1, msg
    assert f"update.max_completion_length={n - 1}" in msg and f"item {item} " in msg and f"{n} tokens" in msg, msg
    assert repr(titles[item]) in msg and f"raise update.max_completion_length to at least {n}" in msg, msg
    cfg.policy.constrained_rollouts = False  # free rollouts cut a long answer (no format reward), nothing fails
    check_answers_fit(tok, titles, cfg, "pi_init's SFT")


def test_the_bootstrap_refuses_a_limit_the_catalog_does_not_fit_before_it_trains(abpo, state):
    rc, out, err = abpo("arms", "bootstrap", "--set", "update.max_completion_length=20")
    err = "\n".join(line for line in err.splitlines() if " INFO " not in line)  # MLflow's own store set-up
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "update.max_completion_length=20: item " in err and "tokens with EOS" in err, err
    assert "raise update.max_completion_length to at least" in err, err
    assert not (state / "models" / "pi_init").exists()  # refused before the SFT trained anything
