"""Issue 59 point 11: a catalog whose longest candidate answer (with EOS) is over update.max_completion_length, with
constrained rollouts, passed the bootstrap and month 1 and failed a later month's update, the first time a request
showed that item. It is refused where the catalog and the tokenizer are first known together (pi_init's SFT, run by
the bootstrap, and `abpo arms adopt`), and again by each update over the candidates its rows show, naming the item,
its length and the key to raise."""

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


def test_an_update_under_a_smaller_limit_than_its_bootstrap_is_refused_before_it_trains(make_cfg, build_tiny_model):
    """A state bootstrapped under one limit and updated under a smaller one (`--set update.max_completion_length`):
    the update checks the answers of the candidates its rows show before anything trains (abpo.train.update
    .update_rows), in one line naming the item and the value to raise it to; before, the trainer's first request
    showing the item raised a ValueError traceback in the middle of the update."""
    import pyarrow.compute as pc
    from transformers import AutoTokenizer

    from abpo.cli import expected_errors
    from abpo.config.errors import ConfigError
    from abpo.data.loaders import load_dataset
    from abpo.data.synthetic import synthetic_impressions
    from abpo.monthly.common import retry_or_fail
    from abpo.train.update import update_rows

    cfg = make_cfg()
    titles = load_dataset(cfg.data).titles()
    tok = AutoTokenizer.from_pretrained(build_tiny_model(cfg.policy, titles))
    catalog = sorted(titles)
    table, _ = synthetic_impressions(
        64, "2026-01", n_users=8, item_ids=catalog, n_items=len(catalog), n_candidates=8, history_len=4
    )
    clicked = pc.equal(table.column("clicked"), 1)
    pos, neg = table.filter(clicked), table.filter(pc.invert(clicked))
    shown = {int(c) for cands in table.column("candidates").to_pylist() for c in cands}
    item, n = _longest(tok, {i: titles[i] for i in shown})
    update_rows(cfg, pos, neg, titles, tok)  # the preset's limit holds them
    cfg.update.max_completion_length = n - 1
    with pytest.raises(ConfigError) as e:
        update_rows(cfg, pos, neg, titles, tok)
    assert isinstance(e.value, expected_errors())  # the CLI prints it in one line
    assert retry_or_fail(e.value) == "fail"  # the DAG fails it at once, no retry
    msg = str(e.value)
    assert msg.startswith("the update's rows: update.max_completion_length=") and len(msg.splitlines()) == 1, msg
    assert f"item {item} " in msg and f"raise update.max_completion_length to at least {n}" in msg, msg
