"""abpo.data.prepare: the dataset as the loop prepares it, counted (what `abpo demo` logs as its prepare step)."""

from __future__ import annotations

from abpo.data.prepare import prepare_counts


def test_the_counts_are_the_prepared_datasets(make_cfg):
    from abpo.data.candidates import build_bandit_requests, build_sup_examples
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users

    cfg = make_cfg("data.max_users=40")
    got = prepare_counts(cfg.data)
    ds = load_dataset(cfg.data)
    splits, report = split_users(ds, cfg.data)
    sup, bandit = build_sup_examples(splits, ds, cfg.data), build_bandit_requests(splits, ds, cfg.data)
    assert got == {
        "dataset": ds.name,
        "items": ds.catalog.num_rows,
        "interactions": ds.interactions.num_rows,
        "users_kept": report.users_kept,
        "users_skipped": dict(report.skipped),
        "d_sup": len(sup),
        "bandit_requests": len(bandit),
        "held_out_checked_prompts": got["held_out_checked_prompts"],
    }
    assert 0 < got["users_kept"] <= 40 and got["d_sup"] > 0 and got["bandit_requests"] > 0
    assert got["held_out_checked_prompts"] == len(sup) + len(bandit)  # every training prompt checked
