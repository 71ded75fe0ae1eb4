"""The dataset as the loop prepares it (docs/ABPO_SPEC.md "Offline construction"): loaded, every user split, D_sup and
the bandit requests built, the held-out target checked absent from every training prompt. ``abpo demo`` logs
:func:`prepare_counts`."""

from __future__ import annotations

from typing import Any


def prepare_counts(data_cfg) -> dict[str, Any]:
    """Load the dataset of ``data_cfg`` (the config's ``data``) and split it (docs/ABPO_SPEC.md "Offline
    construction"); counts for the log."""
    from abpo.data.candidates import assert_target_held_out, build_bandit_requests, build_sup_examples
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users

    ds = load_dataset(data_cfg)
    splits, report = split_users(ds, data_cfg)
    sup = build_sup_examples(splits, ds, data_cfg)
    bandit = build_bandit_requests(splits, ds, data_cfg)
    checked = assert_target_held_out(splits, sup, bandit)
    return {
        "dataset": ds.name,
        "items": ds.catalog.num_rows,
        "interactions": ds.interactions.num_rows,
        "users_kept": report.users_kept,
        "users_skipped": dict(report.skipped),
        "d_sup": len(sup),
        "bandit_requests": len(bandit),
        "held_out_checked_prompts": checked,
    }
