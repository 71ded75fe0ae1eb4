"""sft.item_init (abpo.policy.item_init, Eq. item-init): the item tokens' rows from ALS factors of the training
sequences before stage 1; the rows equal the rescaled factors for items with a training interaction and stay random
otherwise, only x_{1:T} is read, the tied LM head sees the same rows, and the default (random) leaves pi_init as it
was."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.sizes import TINY_MODEL


def _item_rows(model, tok, items):
    from abpo.policy.prompt import check_item_tokens

    idx = torch.tensor(check_item_tokens(tok, sorted(items)))
    return model.get_input_embeddings().weight[idx].detach().double().numpy(), idx


def test_rows_are_the_rescaled_als_factors_and_the_tied_head_reads_them(tiny_dir, small_titles, tmp_path):
    """Items with a training interaction get c * q_i (c: the random item rows' mean norm over the factors' mean norm),
    the others and every non-item token keep their rows; the LM head is the same matrix, also after a reload."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from abpo.policy.item_init import als_item_factors, init_item_embeddings

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    catalog = sorted(small_titles)
    rng = np.random.default_rng(0)
    train = {u: [catalog[int(k)] for k in rng.choice(60, size=8, replace=False)] for u in range(40)}
    seen = {i for s in train.values() for i in s}
    before = model.get_input_embeddings().weight.detach().clone()
    rows0, idx = _item_rows(model, tok, catalog)

    res = init_item_embeddings(model, tok, train, catalog, method="als", seed=3)

    hidden = before.shape[1]
    q = als_item_factors(train, catalog, rank=hidden, seed=3)
    mask = np.array([i in seen for i in catalog])
    c = np.linalg.norm(rows0, axis=1).mean() / np.linalg.norm(q[mask], axis=1).mean()
    rows, _ = _item_rows(model, tok, catalog)
    assert res.n_items == len(catalog) and res.n_initialised == len(seen) and res.scale == pytest.approx(c)
    np.testing.assert_allclose(rows[mask], c * q[mask], rtol=1e-5, atol=1e-7)
    assert np.array_equal(rows[~mask], rows0[~mask])  # no training interaction: the random row, bit for bit
    # one scalar: the set rows have the random init's mean norm
    assert np.linalg.norm(rows[mask], axis=1).mean() == pytest.approx(np.linalg.norm(rows0, axis=1).mean(), rel=1e-5)
    others = torch.ones(before.shape[0], dtype=torch.bool)
    others[idx] = False
    assert torch.equal(model.get_input_embeddings().weight[others], before[others])  # non-item tokens untouched
    head = model.get_output_embeddings().weight
    assert head.data_ptr() == model.get_input_embeddings().weight.data_ptr()  # tied: one matrix
    assert np.array_equal(head[idx].detach().double().numpy(), rows)
    model.save_pretrained(tmp_path / "m")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert torch.equal(again.get_output_embeddings().weight[idx], model.get_input_embeddings().weight[idx])


def _toy(n_items: int, n_users: int, seed: int):
    """Users of 6 to 9 distinct items among 1..n_items-2 (history, 2 update items, the target); user 1's target is
    item n_items, user 2's last update item n_items - 1: neither occurs anywhere else."""
    rng = np.random.default_rng([seed, n_items, n_users])
    seqs = {}
    for u in range(1, n_users + 1):
        seqs[u] = [int(i) + 1 for i in rng.choice(n_items - 2, size=int(rng.integers(6, 10)), replace=False)]
    seqs[1][-1] = n_items
    seqs[2][-2] = n_items - 1
    return seqs


@pytest.mark.parametrize(("n_items", "n_users"), [(30, 12), (150, 45)])
def test_only_training_interactions_are_read(make_dataset, build_tiny_model, tmp_path, monkeypatch, n_items, n_users):
    """On two differently sized datasets: the factorisation is fitted on x_{1:T} (stage 1's own training dict) and
    nothing else; an item only in a held-out target, and one only in an update range, keep their random rows."""
    import abpo.policy.item_init as item_init
    from abpo.config import load_config
    from abpo.data.splits import split_users
    from abpo.policy.sft import item_init_stage, training_sequences

    cfg = load_config("tiny", [f"paths.root={tmp_path}", *TINY_MODEL, "sft.item_init=als"])
    d = cfg.data
    d.min_history, d.update_steps, d.train_candidates, d.eval_candidates, d.max_users = 2, 2, 4, 5, 0
    ds = make_dataset(_toy(n_items, n_users, 0), n_items=n_items)
    splits, _ = split_users(ds, d)
    by_user = {s.user_id: s for s in splits}
    assert by_user[1].target == n_items and n_items - 1 in by_user[2].update  # the two distinctive items held out

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_model(cfg.policy, ds.titles())
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    fitted = []
    als = item_init.als_item_factors
    monkeypatch.setattr(item_init, "als_item_factors", lambda seqs, *a, **k: fitted.append(seqs) or als(seqs, *a, **k))
    catalog = sorted(ds.titles())
    rows0, _ = _item_rows(model, tok, catalog)
    res = item_init_stage(model, tok, ds, splits, cfg)
    rows, _ = _item_rows(model, tok, catalog)

    assert fitted == [{s.user_id: s.history for s in splits}] == [training_sequences(splits)]
    train_items = {i for s in splits for i in s.history}
    assert n_items not in train_items and n_items - 1 not in train_items
    assert res.n_initialised == len(train_items) > 0
    changed = {catalog[k] for k in np.flatnonzero(np.any(rows != rows0, axis=1))}
    assert changed == train_items  # exactly the items of x_{1:T}: targets and update items alone keep their rows
    assert model.config.hidden_size == 32 and rows.shape == (n_items, 32)


def test_random_is_the_old_path_bit_for_bit(tiny_dir, small_titles, make_cfg):
    """sft.item_init=random (the default) touches nothing and draws no random number: the model after
    item_init_stage + stage 1 is bit-identical to stage 1 alone, as pi_init was trained before the option."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from abpo.config import load_config
    from abpo.data.splits import UserSplit
    from abpo.policy.sft import item_init_stage, pretrain_stage

    assert load_config("tiny").sft.item_init == "random"
    cfg = make_cfg("sft.pretrain_epochs=2", "sft.pretrain_batch_size=8")
    ids = sorted(small_titles)[:30]
    rng = np.random.default_rng(1)
    splits = [
        UserSplit(u, [ids[int(k)] for k in rng.choice(30, size=6, replace=False)], [ids[u % 30]], ids[(u + 7) % 30])
        for u in range(24)
    ]

    class _Catalog:
        def titles(self):
            return small_titles

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    states = []
    for with_init in (False, True):
        model = AutoModelForCausalLM.from_pretrained(tiny_dir)
        torch.manual_seed(0)
        np.random.seed(0)
        if with_init:
            torch_state, np_state = torch.get_rng_state(), np.random.get_state()
            res = item_init_stage(model, tok, _Catalog(), splits, cfg)
            assert res.n_initialised == 0 and torch.equal(torch.get_rng_state(), torch_state)
            assert np.array_equal(np.random.get_state()[1], np_state[1])
        pretrain_stage(model, tok, _Catalog(), splits, cfg, validation_fraction=0.3)
        states.append(model.state_dict())
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


@pytest.mark.parametrize("n_items", [11, 60])
def test_pi_init_trains_with_als_item_init(movielens_dir, tmp_path, n_items):
    """Both stages after the ALS rows, through train_sft (what `abpo sft` and benchmarks/policy_quality.py run with
    --set sft.item_init=als), on MovieLens-format directories of two catalog sizes."""
    from abpo.config import load_config
    from abpo.policy.sft import train_sft

    d = movielens_dir(n_items, n_users=24, ratings_per_user=5 if n_items < 20 else 9)
    cfg = load_config(
        "tiny",
        [f"paths.root={tmp_path / 'var'}", f"data.dataset_dir={d}", *TINY_MODEL, "sft.item_init=als"],
    )
    c = cfg.data
    c.train_candidates, c.eval_candidates, c.update_steps, c.min_history = 4, 5, 1, 3
    s = cfg.sft
    s.pretrain_epochs, s.pretrain_patience, s.max_steps, s.batch_size, s.logging_steps = 1, 1, 2, 8, 1
    s.eval_generation, s.eval_max_users = False, 10
    res = train_sft(cfg, validation_fraction=cfg.experiment.validation_fraction, log_mlflow=False, register=False)
    assert set(res.stage_seconds) == {"item_init", "pretrain", "sft"}
    assert (res.model_dir / "config.json").exists() and 0.0 <= res.metrics["HR@5"] <= 1.0


def test_item_init_needs_item_tokens_and_a_known_method(tiny_model, tiny_tokenizer, small_titles):
    from abpo.policy.item_init import init_item_embeddings

    with pytest.raises(ValueError, match="sft.item_init='svd'; rule: one of"):
        init_item_embeddings(tiny_model, tiny_tokenizer, {1: [1]}, list(small_titles), method="svd")
    with pytest.raises(ValueError, match="sft.item_init=als sets the item tokens' rows"):
        init_item_embeddings(tiny_model, tiny_tokenizer, {1: [10**9]}, [10**9], method="als")
