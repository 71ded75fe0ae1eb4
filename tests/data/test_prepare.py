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


def test_the_sets_and_the_report_of_abpo_data_prepare(make_cfg, tmp_path):
    import json

    from abpo.data.candidates import build_eval_examples
    from abpo.data.loaders import load_dataset
    from abpo.data.prepare import build_sets, write_prepare_report
    from abpo.data.splits import split_users

    cfg = make_cfg("data.max_users=40")
    ds = load_dataset(cfg.data)
    splits, report = split_users(ds, cfg.data)
    sup, bandit, ev, checked = build_sets(splits, ds, cfg.data)
    assert checked == len(sup) + len(bandit) and len(bandit) == 40 * 4
    assert len(ev) == len(build_eval_examples(splits, ds, cfg.data)) > 0
    out = tmp_path / "new" / "prepare_report.json"
    write_prepare_report(out, ds, report, sup, bandit, ev, cfg.data.seed)
    assert json.loads(out.read_text()) == {
        "dataset": ds.name,
        "items": ds.catalog.num_rows,
        "interactions": ds.interactions.num_rows,
        "loader_notes": ds.notes,
        "split": report.as_dict(),
        "skipped_users": report.skipped_users,
        "sup_examples": len(sup),
        "bandit_requests": len(bandit),
        "eval_examples": len(ev),
        "seed": cfg.data.seed,
    }


def test_a_held_out_target_in_a_training_prompt_is_refused(make_cfg):
    import dataclasses

    import pytest

    from abpo.data.loaders import load_dataset
    from abpo.data.prepare import build_sets
    from abpo.data.splits import split_users

    cfg = make_cfg("data.max_users=20")
    ds = load_dataset(cfg.data)
    splits, _ = split_users(ds, cfg.data)
    leaked = [dataclasses.replace(splits[0], target=splits[0].history[-1]), *splits[1:]]  # the target seen in x_{1:T}
    with pytest.raises(AssertionError, match=r"held-out target .* leaked into a training prompt"):
        build_sets(leaked, ds, cfg.data)
