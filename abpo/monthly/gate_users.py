"""The gate's users (Airflow task ``<arm>.gate``, abpo.monthly.gate): the held-out users every gate scores both versions
on, the configured dataset's (``arms.gate_users = dataset``) or the deployment's own from the warehouse
(``warehouse``), with the key under which a version's offline metrics on them are kept."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import TYPE_CHECKING

from abpo.data.candidates import build_eval_examples, training_popularity
from abpo.data.holdout import check_gate_users, check_holdout_fraction, in_holdout
from abpo.data.splits import UserSplit
from abpo.monthly.common import dataset_and_splits
from abpo.months import Month
from abpo.policy.sft import seeded_subsample

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)


class GateUsersMissing(LookupError):
    """``arms.gate_users = warehouse``, but the warehouse cannot give the gate its users through the gated month (no
    interactions at all, no user of the held-out slice with 2 or more, or one who consumed too much of the catalog
    for a candidate set); the message names the warehouse, the month and the rule."""


GateSet = tuple[list, dict[int, int], str]  # (examples, popularity, key): what gate_examples returns


def gate_examples(cfg: Config, month: str | None = None) -> GateSet:
    """The held-out users every gate scores, as (examples, popularity, key): evaluation examples (target, history,
    candidates), the popularity their hard negatives were drawn by (also what Diversity@K reads), and the user set's
    key (the digest of dataset ``gate-users`` under which a version's offline metrics are kept).

    ``arms.gate_users = dataset`` (default): the configured dataset's held-out users, x_{T+N} targets (``month`` is
    not read). ``warehouse``: the deployment's own users, :func:`warehouse_gate_examples` through ``month``."""

    if check_gate_users(cfg.arms.gate_users) == "warehouse":
        return warehouse_gate_examples(cfg, month)
    return dataset_gate_examples(cfg)


def dataset_gate_examples(cfg: Config) -> GateSet:
    """The configured dataset's held-out users (seeded choice of ``arms.gate_max_users``, else
    ``sft.eval_max_users``): x_{T+N} targets with evaluation candidates, training popularity."""

    ds, splits = dataset_and_splits(cfg)
    n = cfg.arms.gate_max_users or cfg.sft.eval_max_users
    examples = seeded_subsample(build_eval_examples(splits, ds, cfg.data), n, cfg.seed)
    key = hashlib.sha256(
        json.dumps(
            [
                ds.name,
                cfg.data.seed,
                cfg.data.eval_candidates,
                cfg.seed,
                cfg.data.tie_seed,
                cfg.data.eval_hard_negative_fraction,
                [e.request_id for e in examples],
                [e.candidates for e in examples],
            ]
        ).encode()
    ).hexdigest()[:12]
    return examples, training_popularity(splits, ds), key


def _not_in_catalog(rows, item_ids, path, month: str) -> None:
    """SchemaError naming the first interaction (file, month, user, position) whose item is not a catalog item, and
    how many there are; nothing when every item is one. ``rows``: Warehouse.interaction_rows."""
    import numpy as np
    import pyarrow as pa

    from abpo.data.schemas import SchemaError

    items = rows.column("item_id").to_numpy()
    bad = ~np.isin(items, item_ids)
    if not bad.any():
        return
    where = np.flatnonzero(bad)
    r = rows.slice(int(where[0]), 1).to_pylist()[0]
    distinct = np.unique(items[bad])
    others = pa.array(distinct[:5]).to_pylist()
    raise SchemaError(
        f"{r['source_file']}: interaction of user {r['user_id']} at position {r['position']} (month {r['month']}) has "
        f"item_id {r['item_id']}, which is not in the catalog of the configured dataset ({len(item_ids)} items); "
        f"rule: with arms.gate_users=warehouse every interaction through the gated month is of a catalog item (the "
        f"gate draws candidates and popularity from the catalog); {int(bad.sum())} such interaction(s) of "
        f"{len(distinct)} item(s) ({others}{'...' if len(distinct) > 5 else ''}) in {path} through month {month}; "
        "none was dropped"
    )


def warehouse_gate_examples(cfg: Config, month: str | None) -> GateSet:
    """``arms.gate_users = warehouse``: the deployment's own held-out users, from the warehouse's interactions
    through ``month`` (landing/interactions/month=YYYY-MM, table ``interactions``).

    The users: those of the held-out slice (abpo.data.holdout: sha256("<seed>:gate:<user>") / 2^64 <
    ``arms.gate_holdout_fraction``; the update leaves their impressions out of D_bandit) with at least 2
    interactions through ``month``; a seeded choice of ``arms.gate_max_users`` (else ``sft.eval_max_users``) of
    them. For each, target = their last interaction through ``month``, history = the ones before it, candidates =
    the target and data.eval_candidates - 1 items they never interacted with, round(data.eval_hard_negative_fraction
    * (data.eval_candidates - 1)) of them drawn by popularity: the offline construction's sampler
    (abpo.data.candidates.build_eval_examples, seeded by data.seed and the user id), on popularity = every user's
    interactions through ``month`` without these targets (the rule of training_popularity). Items are the
    configured dataset's catalog: an interaction of another item is a SchemaError naming its file, never dropped.
    GateUsersMissing when the warehouse has no interactions through ``month`` or no held-out user with 2 or more.
    The key hashes the users, histories, targets, candidates and popularity, so it changes when they do."""
    from collections import Counter

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from abpo.warehouse import open_warehouse

    if month is None:
        raise ValueError(
            "gate: arms.gate_users=warehouse scores the users of the warehouse's interactions through the "
            "gated month; rule: pass the month (gate(cfg, arm, version, month))"
        )
    month = str(Month(month, "gate month"))
    fraction = check_holdout_fraction(cfg.arms.gate_holdout_fraction)
    ds, _ = dataset_and_splits(cfg)
    path = cfg.paths.resolve("warehouse")
    rule = (
        "rule: arms.gate_users=warehouse gates on the users of the warehouse's interactions through the gated "
        "month (landing/interactions/month=YYYY-MM/*.parquet, ingested with the month) in the held-out slice "
        f"arms.gate_holdout_fraction={fraction:g}, each with at least 2 interactions (a target: the last one, and "
        "a history before it)"
    )
    if not path.exists():
        raise GateUsersMissing(
            f"{path}: no warehouse, so no interactions through month {month}; {rule}; or gate on "
            "the configured dataset's users (arms.gate_users=dataset)"
        )
    with open_warehouse(cfg, read_only=True) as wh:
        rows = wh.interaction_rows(month)
    if rows.num_rows == 0:
        raise GateUsersMissing(
            f"{path}: table interactions holds no interactions through month {month}; {rule}; or "
            "gate on the configured dataset's users (arms.gate_users=dataset)"
        )
    _not_in_catalog(rows, ds.item_ids(), path, month)
    users = np.unique(rows.column("user_id").to_numpy())
    held = [int(u) for u in users.tolist() if in_holdout(int(u), cfg.seed, fraction)]
    mine = rows.filter(pc.is_in(rows.column("user_id"), value_set=pa.array(held, pa.int64())))
    seqs: dict[int, list[int]] = {}
    for u, i in zip(mine.column("user_id").to_pylist(), mine.column("item_id").to_pylist()):  # user, month, position
        seqs.setdefault(int(u), []).append(int(i))
    gated = sorted(u for u, seq in seqs.items() if len(seq) >= 2)
    if not gated:
        raise GateUsersMissing(
            f"{path}: through month {month}, {len(users)} users have interactions, {len(held)} of them in the gate's "
            f"held-out slice (seed {cfg.seed}), none with 2 or more; {rule}. Raise arms.gate_holdout_fraction, or "
            "gate a later month"
        )
    splits = [UserSplit(u, seqs[u][:-1], [], seqs[u][-1]) for u in gated]
    n_items, m = len(ds.item_ids()), cfg.data.eval_candidates
    crowded = [s for s in splits if n_items - len(set(s.sequence)) < m - 1]
    if crowded:
        s = crowded[0]
        raise GateUsersMissing(
            f"{path}: gate user {s.user_id} consumed {len(set(s.sequence))} of the catalog's {n_items} items through "
            f"month {month} ({len(crowded)} gate user(s) like this); rule: data.eval_candidates={m} needs {m - 1} "
            "items the user never consumed beside the target; lower data.eval_candidates"
        )
    counts = Counter(rows.column("item_id").to_numpy().tolist())
    counts.subtract(s.target for s in splits)
    popularity = {int(i): int(c) for i, c in sorted(counts.items()) if c > 0}
    # one example per user, each depending only on the seed, the user's sequence and the popularity: choosing the
    # users first gives the same examples as choosing among all of them, without drawing the others' candidates
    n = cfg.arms.gate_max_users or cfg.sft.eval_max_users
    examples = build_eval_examples(seeded_subsample(splits, n, cfg.seed), ds, cfg.data, popularity=popularity)
    key = hashlib.sha256(
        json.dumps(
            [
                "warehouse",
                ds.name,
                cfg.data.seed,
                cfg.data.eval_candidates,
                cfg.seed,
                cfg.data.eval_hard_negative_fraction,
                fraction,
                [e.request_id for e in examples],
                [e.history for e in examples],
                [e.positive for e in examples],
                [e.candidates for e in examples],
                sorted(popularity.items()),
            ]
        ).encode()
    ).hexdigest()[:12]
    log.info(
        f"  gate users: {len(examples)} of {len(gated)} held-out users with 2+ interactions in {path} through "
        f"{month} ({len(held)} of {len(users)} users in the slice arms.gate_holdout_fraction={fraction:g})"
    )
    return examples, popularity, key
