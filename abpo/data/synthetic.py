"""Synthetic impressions in IMPRESSIONS_SCHEMA, for the ingest benchmark and the warehouse tests.

Vectorised (numpy + Arrow list arrays): a million rows take a couple of seconds. Optionally a share
of rows breaks the contract, exactly one rule per bad row, and the generator returns how many rows
it broke per rule, so a test can check the warehouse's quarantine counts against the truth.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from abpo.data.schemas import IMPRESSIONS_SCHEMA, RULES, SCHEMA_VERSION, check_month
from abpo.months import Month

DEFAULT_ARMS = ("abpo", "grpo", "ml_retrain", "popularity")
# The contract rules this generator breaks (one per bad row), in the order its draws use. The later rules
# (logged_item_not_once, duplicate_candidates, propensity_inconsistent, item_not_in_catalog, logging_tau_mismatch,
# malformed_id, conflicting_impression_id, unknown_model_version) are not injected: the draws of every seed stay as
# they were, and the tests build those rows by hand.
INJECTED_RULES = tuple(
    r
    for r in RULES
    if r
    not in (
        "logged_item_not_once",
        "duplicate_candidates",
        "propensity_inconsistent",
        "item_not_in_catalog",
        "logging_tau_mismatch",
        "malformed_id",
        "conflicting_impression_id",
        "unknown_model_version",
    )
)
# the per-row columns of _clean_columns (one value per row; history is flat, the ids are Arrow arrays)
_ROW_COLUMNS = (
    "model_version",
    "user",
    "arm",
    "event_us",
    "served_us",
    "cand",
    "item",
    "propensity",
    "clicked",
    "schema_version",
    "position",
    "logging_policy",
)
_NULLABLE_TARGETS = ("user_id", "model_version", "propensity", "clicked", "event_time", "request_id")


def month_bounds_us(month: str) -> tuple[int, int]:
    """[start, end) of a YYYY-MM month in microseconds since the epoch (UTC)."""
    start, end = Month(check_month(month)).bounds()
    return int(start.timestamp() * 1e6), int(end.timestamp() * 1e6)


def _list_array(values: np.ndarray, width: int) -> pa.ListArray:
    n = len(values) // width
    offsets = pa.array(np.arange(0, (n + 1) * width, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(values, pa.int64()))


def synthetic_impressions(
    n: int,
    month: str,
    *,
    seed: int = 0,
    arms: tuple[str, ...] = DEFAULT_ARMS,
    ctr: dict[str, float] | None = None,
    n_users: int = 20_000,
    n_items: int = 5_000,
    n_candidates: int = 20,
    history_len: int = 10,
    violation_rate: float = 0.0,
    id_prefix: str = "",
    item_ids=None,
) -> tuple[pa.Table, Counter]:
    """``n`` impressions dated inside ``month`` and the number of rows broken per rule.

    Users are assigned to arms by a stable rule (user_id mod len(arms)); a click happens with the
    arm's ``ctr`` (default 0.10 + 0.01 * (len(arms) - index), so arms differ). Candidates are
    ``n_candidates`` distinct items; the exposed one is drawn uniformly and its propensity is a
    Beta(2, 8) draw (synthetic: not a real policy's softmax). Violations replace one field of a
    clean row; a duplicate_impression_id row is a copy of the nearest earlier clean row, every field (a writer's
    retry: a row that differs under a used id is a conflict, which quarantines both). Item ids are 1..n_items, or
    with ``item_ids`` (a catalog: `abpo data synth` passes the config's dataset) the first n_items of its sorted ids,
    so the rows pass the ingest's catalog check (item_not_in_catalog); an item_not_in_candidates row's item lies
    outside both.
    """
    ids = _catalog_ids(n, violation_rate, n_candidates, n_items, item_ids)
    rng = np.random.default_rng([seed, 0x1A7E])
    start_us, end_us = month_bounds_us(month)
    ctr = ctr or {a: 0.10 + 0.01 * (len(arms) - i) for i, a in enumerate(arms)}
    cols = _clean_columns(
        rng,
        n,
        arms,
        ctr,
        ids,
        start_us=start_us,
        end_us=end_us,
        n_users=n_users,
        n_candidates=n_candidates,
        history_len=history_len,
        prefix=f"{id_prefix}{month}-s{seed}-",
    )
    masks: dict[str, np.ndarray] = {}
    injected = _inject_violations(rng, cols, masks, violation_rate, ids, start_us)
    return _impressions_table(cols, masks, history_len, n_candidates), injected


def _catalog_ids(n: int, violation_rate: float, n_candidates: int, n_items: int, item_ids) -> np.ndarray:
    """The item ids drawn from: 1..n_items, or the first n_items of ``item_ids`` sorted; the arguments checked."""
    if n < 0 or not 0.0 <= violation_rate <= 1.0:
        raise ValueError(f"n={n}, violation_rate={violation_rate}: need n >= 0 and a rate in [0, 1]")
    if n_candidates > n_items:
        raise ValueError(f"n_candidates={n_candidates} > n_items={n_items}")
    ids = np.arange(1, n_items + 1, dtype=np.int64)
    if item_ids is not None:
        ids = np.unique(np.asarray(list(item_ids), dtype=np.int64))
        if ids.size < n_items:
            raise ValueError(f"item_ids: {ids.size} distinct ids < n_items={n_items}")
        ids = ids[:n_items]
    return ids


def _clean_columns(
    rng: np.random.Generator,
    n: int,
    arms: tuple[str, ...],
    ctr: dict[str, float],
    ids: np.ndarray,
    *,
    start_us: int,
    end_us: int,
    n_users: int,
    n_candidates: int,
    history_len: int,
    prefix: str,
) -> dict:
    """The ``n`` clean rows' columns by name (numpy arrays, Arrow arrays for the ids), drawn from ``rng`` in a fixed
    order (the draws of every seed stay as they were)."""
    n_items = len(ids)
    user = rng.integers(1, n_users + 1, size=n, dtype=np.int64)
    arm_idx = user % len(arms)
    arm = np.asarray(arms, dtype=object)[arm_idx]
    event_us = rng.integers(start_us, end_us, size=n, dtype=np.int64)
    served_us = event_us - rng.integers(5_000, 200_000, size=n, dtype=np.int64)
    history = ids[rng.integers(1, n_items + 1, size=n * history_len, dtype=np.int64) - 1]
    perm = ids[rng.permutation(n_items).astype(np.int64)]
    first = rng.integers(0, n_items, size=n, dtype=np.int64)
    cand = perm[(first[:, None] + np.arange(n_candidates)[None, :]) % n_items]  # distinct within a row
    slot = rng.integers(0, n_candidates, size=n)
    item = cand[np.arange(n), slot]
    propensity = np.clip(rng.beta(2.0, 8.0, size=n), 1e-6, 1.0)
    click_p = np.asarray([ctr[a] for a in arms])[arm_idx]
    clicked = (rng.random(n) < click_p).astype(np.int8)
    seq = pa.array(np.arange(n, dtype=np.int64)).cast(pa.string())
    return {
        "impression_id": pc.binary_join_element_wise(pa.scalar(prefix + "imp-"), seq, ""),
        "request_id": pc.binary_join_element_wise(pa.scalar(prefix + "req-"), seq, ""),
        "model_version": np.char.add(arm.astype(str), "-v1").astype(object),
        "user": user,
        "arm": arm,
        "event_us": event_us,
        "served_us": served_us,
        "history": history,
        "cand": cand,
        "item": item,
        "propensity": propensity,
        "clicked": clicked,
        "schema_version": np.full(n, SCHEMA_VERSION, dtype=np.int16),
        "position": np.zeros(n, dtype=np.int16),
        "logging_policy": np.full(n, "softmax(tau=1.0)", dtype=object),
    }


def _inject_violations(
    rng: np.random.Generator,
    cols: dict,
    masks: dict[str, np.ndarray],
    violation_rate: float,
    ids: np.ndarray,
    start_us: int,
) -> Counter:
    """Break round(violation_rate * n) rows of ``cols`` in place, one rule of INJECTED_RULES per row (nulls as
    ``masks``: column -> null mask); returns the rows broken per rule."""
    n = len(cols["user"])
    injected: Counter = Counter()
    n_bad = int(round(violation_rate * n))
    if not n_bad:
        return injected
    bad = np.sort(rng.choice(np.arange(1, n), size=min(n_bad, n - 1), replace=False))
    rule = rng.integers(0, len(INJECTED_RULES), size=len(bad))
    is_bad = np.zeros(n, dtype=bool)
    is_bad[bad] = True
    imp_ids = cols["impression_id"].to_numpy(zero_copy_only=False).astype(object)
    for r, name in enumerate(INJECTED_RULES):
        rows = bad[rule == r]
        injected[name] = len(rows)
        if not len(rows):
            continue
        if name == "null_field":
            col = rng.integers(0, len(_NULLABLE_TARGETS), size=len(rows))
            for c, cname in enumerate(_NULLABLE_TARGETS):
                m = masks.setdefault(cname, np.zeros(n, dtype=bool))
                m[rows[col == c]] = True
        elif name == "empty_field":
            cols["model_version"][rows] = rng.choice(np.array(["", "  "], dtype=object), size=len(rows))
        elif name == "negative_field":
            cols["position"][rows] = -1 - rng.integers(0, 5, size=len(rows))
        elif name == "unknown_logging_policy":
            cols["logging_policy"][rows] = rng.choice(
                np.array(["softmax(tau=abc)", "argmax", "softmax(tau=0)"], dtype=object), size=len(rows)
            )
        elif name == "served_at_out_of_range":
            cols["served_us"][rows] = cols["event_us"][rows] + rng.integers(2, 40, size=len(rows)) * 86_400_000_000
        elif name == "unknown_schema_version":
            cols["schema_version"][rows] = SCHEMA_VERSION + 1
        elif name == "unknown_arm":
            cols["arm"][rows] = "shadow"
        elif name == "propensity_out_of_range":
            cols["propensity"][rows] = rng.choice(np.array([0.0, -0.25, 1.5, np.nan]), size=len(rows))
        elif name == "clicked_not_binary":
            cols["clicked"][rows] = rng.choice(np.array([2, -1], dtype=np.int8), size=len(rows))
        elif name == "item_not_in_candidates":
            cols["item"][rows] = ids[-1] + 1 + rows  # outside the catalog, hence outside every candidate set
        elif name == "event_time_outside_month":
            cols["event_us"][rows] = start_us - rng.integers(1, 86_400_000_000, size=len(rows))
        elif name == "duplicate_impression_id":
            req_ids = cols["request_id"].to_numpy(zero_copy_only=False).astype(object)
            h = len(cols["history"]) // n
            for i in rows:  # the nearest earlier clean row again, whole (no draw: the other rows stay as they were)
                j = i - 1
                while is_bad[j]:
                    j -= 1
                imp_ids[i], req_ids[i] = imp_ids[j], req_ids[j]
                for key in _ROW_COLUMNS:
                    cols[key][i] = cols[key][j]
                cols["history"][i * h : (i + 1) * h] = cols["history"][j * h : (j + 1) * h]
            cols["request_id"] = pa.array(req_ids, pa.string())
    cols["impression_id"] = pa.array(imp_ids, pa.string())
    return injected


def _impressions_table(cols: dict, masks: dict[str, np.ndarray], history_len: int, n_candidates: int) -> pa.Table:
    """The columns as a table in IMPRESSIONS_SCHEMA's order, the masked ones with their nulls."""

    def arr(name, values, typ):
        return pa.array(values, typ, mask=masks.get(name))

    ts = IMPRESSIONS_SCHEMA.field("event_time").type
    request_id = cols["request_id"]
    return pa.Table.from_arrays(
        [
            cols["impression_id"],
            arr("event_time", cols["event_us"], pa.int64()).cast(ts),
            arr("user_id", cols["user"], pa.int64()),
            pa.array(cols["arm"], pa.string()),
            arr("model_version", cols["model_version"], pa.string()),
            _list_array(cols["history"], history_len),
            _list_array(cols["cand"].reshape(-1), n_candidates),
            pa.array(cols["item"], pa.int64()),
            arr("propensity", cols["propensity"], pa.float64()),
            arr("clicked", cols["clicked"], pa.int8()),
            request_id
            if "request_id" not in masks
            else pa.array(request_id.to_numpy(zero_copy_only=False), pa.string(), mask=masks["request_id"]),
            pa.array(cols["position"], pa.int16()),
            pa.array(cols["logging_policy"], pa.string()),
            pa.array(cols["served_us"], pa.int64()).cast(ts),
            pa.array(cols["schema_version"], pa.int16()),
        ],
        schema=pa.schema([pa.field(f.name, f.type) for f in IMPRESSIONS_SCHEMA]),
    )
