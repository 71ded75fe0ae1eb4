"""The dataset as the loop prepares it (docs/ABPO_SPEC.md "Offline construction"): loaded, every user split, D_sup and
the bandit requests built, the held-out target checked absent from every training prompt. ``abpo demo`` logs
:func:`prepare_counts`; ``abpo data prepare`` prints each stage and saves :func:`write_prepare_report`."""

from __future__ import annotations

import json
from pathlib import Path
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


def build_sets(splits, ds, data_cfg) -> tuple[list, list, list, int]:
    """(D_sup, the bandit requests, the evaluation examples, the number of training prompts checked) of the split
    users ``splits`` of dataset ``ds``: AssertionError when a held-out target reached a training prompt
    (abpo.data.candidates.assert_target_held_out)."""
    from abpo.data.candidates import (
        assert_target_held_out,
        build_bandit_requests,
        build_eval_examples,
        build_sup_examples,
    )

    sup = build_sup_examples(splits, ds, data_cfg)
    bandit = build_bandit_requests(splits, ds, data_cfg)
    ev = build_eval_examples(splits, ds, data_cfg)
    return sup, bandit, ev, assert_target_held_out(splits, sup, bandit)


def write_prepare_report(out: Path, ds, split_report, sup, bandit, ev, seed: int) -> None:
    """The counts of ``abpo data prepare`` as JSON in ``out``: the dataset (its items, interactions, the loader's
    notes), the split (SplitReport.as_dict, the skipped users), D_sup, the bandit requests, the evaluation examples
    and the data seed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "dataset": ds.name,
                "items": ds.catalog.num_rows,
                "interactions": ds.interactions.num_rows,
                "loader_notes": ds.notes,
                "split": split_report.as_dict(),
                "skipped_users": split_report.skipped_users,
                "sup_examples": len(sup),
                "bandit_requests": len(bandit),
                "eval_examples": len(ev),
                "seed": seed,
            },
            indent=2,
        )
    )
