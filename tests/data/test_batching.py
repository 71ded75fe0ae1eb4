"""The stratified mini-batches of abpo/data/batching.py (docs/ABPO_SPEC.md step 3) over in-memory strata: the plan's
integers, the batches as Arrow tables and as row dicts. The same batches streamed from the warehouse are tested in
tests/warehouse/test_warehouse.py."""

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from abpo.data.batching import stratified_batch_plan, stratified_batch_tables, stratified_batches


def _rows(n, clicked):
    return [{"impression_id": f"{clicked}-{i}", "clicked": clicked} for i in range(n)]


def test_stratified_batches_hold_both_strata_and_cover_every_row():
    pos, neg = _rows(7, 1), _rows(53, 0)
    batches = list(stratified_batches(pos, neg, batch_size=6, seed=0))
    assert all(len(b) == 6 and {r["clicked"] for r in b} == {0, 1} for b in batches)
    seen = Counter(r["impression_id"] for b in batches for r in b)
    assert set(seen) == {r["impression_id"] for r in pos + neg}  # nothing dropped
    # k = round(6 * 7/60) = 1 positive per batch; 53 no-responses / 5 per batch -> 11 full batches;
    # positives (7) run out first and are recycled (4 appear twice), 2 no-responses fill the last batch
    assert len(batches) == 11
    assert sum(seen[r["impression_id"]] for r in pos) == 11 and max(seen[r["impression_id"]] for r in pos) == 2
    assert sum(seen[r["impression_id"]] for r in neg) == 55


def test_stratified_batches_recycle_no_response_when_positives_dominate():
    batches = list(stratified_batches(_rows(30, 1), _rows(2, 0), batch_size=4, seed=1))
    assert all({r["clicked"] for r in b} == {0, 1} for b in batches)
    assert len(batches) == 10  # k = min(round(4*30/32), 3) = 3 positives + 1 no-response


def test_stratified_batches_reject_an_empty_stratum_or_tiny_batch():
    with pytest.raises(ValueError, match="positive stratum is empty"):
        list(stratified_batches([], _rows(3, 0), 4, 0))
    with pytest.raises(ValueError, match="batch_size=1"):
        list(stratified_batches(_rows(3, 1), _rows(3, 0), 1, 0))


def test_proportional_stratification_uses_each_row_once_and_spreads_positives():
    pos = [{"impression_id": f"p{i}", "clicked": 1} for i in range(10)]
    neg = [{"impression_id": f"n{i}", "clicked": 0} for i in range(60)]
    batches = list(stratified_batches(pos, neg, 8, seed=3, mode="proportional"))
    assert len(batches) == 70 // 8 == 8 and all(len(b) == 8 for b in batches)
    ids = [r["impression_id"] for b in batches for r in b]
    assert len(ids) == len(set(ids)) == 64  # no row twice; the 6 rows that fill no batch are left to the caller
    counts = [sum(r["clicked"] for r in b) for b in batches]
    assert sum(counts) == 10 and sorted(counts) == [1, 1, 1, 1, 1, 1, 2, 2]  # spread evenly, never 0
    with pytest.raises(ValueError, match="each stratum needs at least one row per batch"):
        list(stratified_batches(pos[:5], neg, 8, seed=3, mode="proportional"))  # 5 positives, 8 batches
    with pytest.raises(ValueError, match="mode 'other'"):
        list(stratified_batches(pos, neg, 8, seed=3, mode="other"))
    # the default recycles the scarcer stratum instead: 10 batches of 1 positive + 7 no-responses, 70 rows
    over = list(stratified_batches(pos, neg, 8, seed=3))
    assert all(sum(r["clicked"] for r in b) == 1 for b in over) and len(over) == 10


# ---------------------------------------------------------------------------------------- Arrow-native batches
@pytest.mark.parametrize(
    "P,N,B,mode",
    [(7, 53, 6, "oversample"), (30, 2, 4, "oversample"), (40, 70, 4, "proportional"), (130, 500, 6, "proportional")],
)
def test_batch_plan_fills_every_slot_once_with_both_strata(P, N, B, mode):
    plan = stratified_batch_plan(P, N, B, seed=3, mode=mode)
    batch = np.concatenate([plan.pos_batch, plan.neg_batch])
    slot = np.concatenate([plan.pos_slot, plan.neg_slot]).astype(np.int64)
    slots = set(zip(batch.tolist(), slot.tolist(), strict=True))
    assert len(slots) == batch.size == plan.n_batches * B  # no slot twice
    assert slot.min() == 0 and slot.max() == B - 1
    assert set(plan.pos_batch.tolist()) == set(plan.neg_batch.tolist()) == set(range(plan.n_batches))  # both strata
    assert (np.diff(plan.pos_batch) >= 0).all() and (np.diff(plan.neg_batch) >= 0).all()
    for b in range(plan.n_batches):  # positives take the first slots of their batch
        assert plan.pos_slot[plan.pos_batch == b].max() < plan.neg_slot[plan.neg_batch == b].min()
    if mode == "oversample":
        assert set(plan.pos_rank.tolist()) == set(range(P)) and set(plan.neg_rank.tolist()) == set(range(N))
    else:
        assert (
            len(set(plan.pos_rank.tolist())) == plan.pos_rank.size
            and len(set(plan.neg_rank.tolist())) == plan.neg_rank.size
        )
        assert plan.rows_not_in_batches == P + N - plan.n_batches * B


def test_batch_tables_are_the_batches_as_arrow():
    pos, neg = pa.Table.from_pylist(_rows(9, 1)), pa.Table.from_pylist(_rows(70, 0))
    tables = list(stratified_batch_tables(pos, neg, 5, seed=2, chunk_batches=3))
    assert all(t.num_rows == 15 for t in tables[:-1])  # whole batches per chunk
    joined = pa.concat_tables(tables)
    assert joined.column_names == ["impression_id", "clicked", "batch", "slot"]
    rows = joined.to_pylist()
    by_batch = [
        [{k: r[k] for k in ("impression_id", "clicked")} for r in rows if r["batch"] == b]
        for b in range(rows[-1]["batch"] + 1)
    ]
    assert by_batch == list(stratified_batches(pos, neg, 5, seed=2))
