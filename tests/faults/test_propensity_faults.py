"""Propensities impossible for their candidate set, and items outside the catalog, by the route a user takes
(`abpo ingest`, in-process) against the real DuckDB and Great Expectations (issue 32, items 3 and 6)."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from abpo.data.schemas import INTERACTIONS_SCHEMA, write_impressions, write_interactions
from abpo.data.synthetic import synthetic_impressions
from tests.landed_impressions import MONTH, catalog, clean_table, with_row


def quarantine(state) -> list[tuple]:
    with duckdb.connect(str(state / "warehouse.duckdb"), read_only=True) as con:
        return con.execute("SELECT source_row, rule, detail FROM quarantine ORDER BY source_row").fetchall()


def attack_rows(base: pa.Table, items: list[int]) -> pa.Table:
    """The 20 crafted rows of issue 32: clicked rows whose propensity no softmax over their candidates can give,
    each carrying a huge SNIPS weight (a tiny logged propensity): 7 with all-identical candidates, 7 with the logged
    item repeated among otherwise distinct candidates, 6 with a propensity of 0.3 for one of 100,000 candidates (more
    than the catalog holds, so they repeat items or name items outside it)."""
    rows = base.slice(0, 20).to_pylist()
    out = []
    for k, r in enumerate(rows):
        a = items[k]
        r = dict(r, impression_id=f"attack-{k}", request_id=f"attack-req-{k}", item_id=a, clicked=1)
        if k < 7:
            r.update(candidates=[a] * 20, propensity=1e-6)
        elif k < 14:
            r.update(candidates=[a, a, *items[100:118]], propensity=1e-6)
        else:
            r.update(candidates=[a, *range(10_000_000, 10_099_999)], propensity=0.3)
        out.append(r)
    return pa.Table.from_pylist(out, schema=base.schema)


def test_the_20_row_propensity_attack_is_quarantined(abpo, state):
    """20 crafted rows among 2,556 (they raised a challenger's off-policy CTR from 0.072 to 0.343 in issue 32) are
    quarantined under named rules with a reason; the 2,536 honest rows are published and the GX suite passes."""
    items = catalog()
    base = clean_table(2536)
    crafted = attack_rows(base, items)
    write_impressions(pa.concat_tables([base, crafted]), state / "landing", MONTH, part="a")
    rc, out, err = abpo("ingest", "--month", MONTH)
    assert rc == 0, err
    assert "2536 clean, 20 quarantined" in out and "PASSED" in out, out
    q = quarantine(state)
    rules = [rule for _, rule, _ in q]
    assert rules == ["logged_item_not_once"] * 14 + ["item_not_in_catalog"] * 6, q
    assert all(row >= 2536 for row, _, _ in q)
    assert "appears 20 times among 20 candidates; rule: the logged item appears exactly once" in q[0][2]
    assert "appears 2 times among 20 candidates" in q[7][2]
    assert "not in the catalog, e.g. 10000000 (in candidates)" in q[14][2]


def test_duplicate_candidates_and_a_single_candidate_not_at_1(abpo, state):
    base = clean_table(60)
    r = base.slice(3, 1).to_pylist()[0]
    other = [c for c in r["candidates"] if c != r["item_id"]]
    t = with_row(base, 3, candidates=[r["item_id"], other[0], other[0], *other[1:]])
    t = with_row(t, 5, candidates=[t.column("item_id")[5].as_py()], propensity=0.3)
    t = with_row(t, 6, candidates=[t.column("item_id")[6].as_py()], propensity=1.0)  # consistent: kept
    write_impressions(t, state / "landing", MONTH, part="a")
    rc, out, err = abpo("ingest", "--month", MONTH)
    assert rc == 0, err
    q = quarantine(state)
    assert [(row, rule) for row, rule, _ in q] == [(3, "duplicate_candidates"), (5, "propensity_inconsistent")], q
    assert "21 candidates hold 20 distinct items; rule: candidates are unique within a row" in q[0][2]
    assert "propensity 0.3 for the only candidate; rule: softmax over M = 1 candidate gives exactly 1" in q[1][2]


def test_the_gx_suite_checks_propensity_consistency_and_the_catalog(state):
    """The second line of defence: rows that reach the partition another way fail the new expectations."""
    from abpo.config import load_config
    from abpo.validation import validate_month
    from abpo.warehouse import open_warehouse

    write_impressions(clean_table(), state / "landing", MONTH, part="a")
    cfg = load_config("tiny")
    with open_warehouse(cfg) as wh:
        wh.ingest_month(state / "landing", MONTH, cfg.data.known_arms, catalog=catalog())
        assert validate_month(wh, MONTH, cfg.data.known_arms, catalog=catalog()).success
        wh.con.execute("UPDATE impressions SET candidates = [item_id, item_id] WHERE source_row = 3")
        wh.con.execute("UPDATE impressions SET candidates = [item_id], propensity = 0.5 WHERE source_row = 4")
        wh.con.execute("UPDATE impressions SET history = [999999999] WHERE source_row = 5")
        s = validate_month(wh, MONTH, cfg.data.known_arms, catalog=catalog())
        assert validate_month(wh, MONTH, cfg.data.known_arms).failed != s.failed  # no catalog: that check is off
    failed = {r["column"]: r["unexpected_count"] for r in s.failed}
    assert not s.success
    assert failed == {
        "logged_item_count": 1,
        "candidates_unique": 1,
        "propensity_consistent": 1,
        "items_in_catalog": 1,
    }, failed


def test_items_outside_the_catalog_are_quarantined_in_impressions_and_interactions(state):
    """By the pipeline's ingest step (abpo.monthly.ingest.ingest, the DAG's `ingest` task): a logged
    item, a candidate or a history item outside the catalog quarantines its impression; a landed interaction of such
    an item goes to interactions_quarantine, so the refits (interactions to date) never see it."""
    from abpo.config import load_config
    from abpo.monthly.ingest import ingest
    from abpo.warehouse import open_warehouse

    cfg = load_config("tiny")
    items = catalog()
    t = clean_table(100)
    t = with_row(t, 1, item_id=777_777_777, candidates=[777_777_777, *t.column("candidates")[1].as_py()[1:]])
    t = with_row(t, 2, history=[888_888_888])
    write_impressions(t, state / "landing", MONTH, part="a")
    inter = pa.table(
        {
            "user_id": pa.array([1, 1, 2], pa.int64()),
            "item_id": pa.array([items[0], 999_999_999, items[1]], pa.int64()),
            "event_time": pa.array([None] * 3, INTERACTIONS_SCHEMA.field("event_time").type),
            "rating": pa.array([None] * 3, pa.float32()),
            "position": pa.array([0, 1, 0], pa.int32()),
        }
    )
    write_interactions(inter, state / "landing", MONTH, part="a")
    res = ingest(cfg, MONTH)
    assert res.rows_clean == 98 and res.quarantined["item_not_in_catalog"] == 2 and res.interactions == 2
    q = quarantine(state)
    assert [(row, rule) for row, rule, _ in q] == [(1, "item_not_in_catalog"), (2, "item_not_in_catalog")]
    assert "e.g. 777777777 (in candidates, item_id)" in q[0][2] and "e.g. 888888888 (in history)" in q[1][2]
    with open_warehouse(cfg, read_only=True) as wh:
        seen = wh.interactions_to_date(MONTH)
        iq = wh.con.execute("SELECT rule, item_id FROM interactions_quarantine").fetchall()
    assert seen == {1: [items[0]], 2: [items[1]]} and iq == [("item_not_in_catalog", 999_999_999)]
    assert np.isin(sorted({i for v in seen.values() for i in v}), items).all()


def test_synthetic_rows_drawn_from_a_catalog_stay_inside_it():
    items = catalog()
    t, _ = synthetic_impressions(300, MONTH, item_ids=items)
    ids = set(items)
    assert all(set(r["candidates"]) | set(r["history"]) | {r["item_id"]} <= ids for r in t.to_pylist())
    with pytest.raises(ValueError, match="distinct ids < n_items"):
        synthetic_impressions(10, MONTH, item_ids=[1, 2, 3])
