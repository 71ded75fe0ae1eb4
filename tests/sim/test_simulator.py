"""The simulator: stable arm assignment matching the shares, the click model as documented, non-overlapping monthly
windows that never touch the held-out target, and a landed month that passes the contract and ingests clean."""

from __future__ import annotations

import numpy as np
import pytest

SMALL = ("data.max_users=60", "data.update_steps=6")


def test_assignment_is_stable_and_matches_the_shares():
    from scipy.stats import chisquare

    from abpo.sim.assignment import assign_users, check_shares

    shares = check_shares({"abpo": 0.43, "grpo": 0.25, "ml_retrain": 0.18, "popularity": 0.14},
                          ["abpo", "grpo", "ml_retrain", "popularity"])
    users = list(range(1, 20001))
    a = assign_users(users, "salt-1", shares)
    assert a == assign_users(list(reversed(users)), "salt-1", shares)  # stable, order-free
    counts = [sum(1 for v in a.values() if v == arm) for arm in shares]
    expected = [len(users) * s for s in shares.values()]
    assert chisquare(counts, expected).pvalue > 0.001
    b = assign_users(users, "salt-2", shares)
    assert 0.5 < np.mean([a[u] != b[u] for u in users]) < 0.8  # a new salt reshuffles (1 - sum s^2 = 0.69)


def test_shares_are_checked():
    from abpo.sim.assignment import check_shares

    with pytest.raises(ValueError, match="no share for arm"):
        check_shares({"abpo": 1.0}, ["abpo", "grpo"])
    with pytest.raises(ValueError, match="sum to"):
        check_shares({"abpo": 0.5, "grpo": 0.4}, ["abpo", "grpo"])


def test_click_model_responds_as_documented():
    from abpo.sim.clicks import click_probability, genre_overlap
    from abpo.sim.config import SimConfig

    c = SimConfig(click_next=0.7, click_soon=0.35, click_base=0.01, click_taste=0.06, soon_horizon=2, taste_window=2)
    genres = {1: ["Drama"], 2: ["Comedy"], 3: ["Drama", "Comedy"], 4: ["Horror"], 5: [], 6: ["Drama"]}
    assert click_probability(6, 6, [4], [1, 2], genres, c) == 0.7  # the true next item
    assert click_probability(4, 6, [4], [1, 2], genres, c) == 0.35  # among the next few
    assert genre_overlap(3, [1, 2], genres) == 1.0 and genre_overlap(4, [1, 2], genres) == 0.0
    assert click_probability(3, 6, [4], [1, 2], genres, c) == pytest.approx(0.01 + 0.06)  # full taste overlap
    assert click_probability(5, 6, [4], [1, 2], genres, c) == pytest.approx(0.01)  # no genres: base only
    # only the last taste_window items define the taste: Drama (item 1) has dropped out of [1, 2, 4]
    assert click_probability(6, 3, [], [1, 2, 4], genres, c) == pytest.approx(0.01)


def test_months_are_consecutive_never_overlap_and_keep_the_target_held_out(make_cfg, movielens):
    from abpo.data.splits import split_users
    from abpo.sim.simulator import month_requests

    cfg = make_cfg(*SMALL)
    splits, _ = split_users(movielens, cfg.data)
    by_user = {s.user_id: s for s in splits}
    months = ["2026-01", "2026-02", "2026-03"]
    seen: set[str] = set()
    for i, m in enumerate(months):
        reqs = month_requests(cfg, movielens, splits, m)
        assert len(reqs) == 2 * len(splits)
        ids = {r.request_id for r in reqs}
        assert not ids & seen
        seen |= ids
        for r in reqs:
            s = by_user[r.user_id]
            T = len(s.history)
            assert len(r.history) == T + 2 * i + r.step  # month i = update positions T+2i, T+2i+1
            assert r.next_item in r.candidates and s.target not in r.candidates
            assert s.target not in r.soon and r.next_item == s.sequence[len(r.history)]
    with pytest.raises(ValueError, match="data.update_steps"):
        month_requests(cfg, movielens, splits, "2026-04")  # 6 update steps / 2 per month = 3 months


def test_interactions_to_date_grow_by_the_earlier_windows_only(make_cfg, movielens):
    from abpo.data.splits import split_users
    from abpo.sim.simulator import interactions_to_date

    cfg = make_cfg(*SMALL)
    splits, _ = split_users(movielens, cfg.data)
    s = splits[0]
    assert interactions_to_date(cfg, splits, "2026-01")[s.user_id] == s.history
    assert interactions_to_date(cfg, splits, "2026-03")[s.user_id] == [*s.history, *s.update[:4]]


def _ranker_arms(cfg, movielens, splits):
    from abpo.arms.rankers import RankerArm
    from abpo.sim.simulator import interactions_to_date

    seqs = interactions_to_date(cfg, splits, cfg.sim.start_month)
    items = movielens.item_ids().tolist()
    # every arm served by a ranker: fast, and the contract does not care what served
    return {a: RankerArm(a, RankerArm.make_ranker("popularity", cfg).fit(seqs, items), 0.5, "1")
            for a in ("abpo", "grpo", "ml_retrain", "popularity")}


def test_simulated_month_passes_the_contract_and_ingests_clean(make_cfg, movielens):
    from abpo.data.splits import split_users
    from abpo.sim.simulator import simulate_month
    from abpo.validation import validate_month
    from abpo.warehouse import Warehouse

    cfg = make_cfg(*SMALL)
    splits, _ = split_users(movielens, cfg.data)
    arms = _ranker_arms(cfg, movielens, splits)
    res = simulate_month(cfg, "2026-02", arms, dataset=movielens, splits=splits)
    again = simulate_month(cfg, "2026-02", arms, dataset=movielens, splits=splits, write=False)
    assert res.table.equals(again.table)  # deterministic for (seed, month)
    assert res.path.name == "part-sim.parquet"
    assert sum(v["impressions"] for v in res.per_arm.values()) == res.table.num_rows == 2 * len(splits)
    with Warehouse(cfg.paths.resolve("warehouse")) as wh:
        rep = wh.ingest_month(cfg.paths.resolve("landing"), "2026-02", cfg.data.known_arms)
        summary = validate_month(wh, "2026-02", cfg.data.known_arms)
    assert rep.rows_clean == res.table.num_rows and rep.rows_quarantined == 0
    assert summary.success


def test_the_warehouse_holds_the_interactions_to_date_the_simulator_served(make_cfg, movielens):
    """The simulator lands what users consumed with each month; the cycle's ingest step puts it in the warehouse,
    and the ranker arms' refit data (abpo.monthly.refit: the histories, the warehouse's interactions to date, the
    clicks) equals what the simulator knows users consumed (interactions_to_date), month after month: the refits
    read production data, never the simulator. A rerun replaces the month's interactions, never doubles them."""
    from abpo.data.splits import split_users
    from abpo.monthly.ingest import ingest_and_validate
    from abpo.monthly.refit import ranker_training_sequences
    from abpo.months import Month
    from abpo.sim.simulator import interactions_to_date, simulate_month
    from abpo.warehouse import open_warehouse

    cfg = make_cfg(*SMALL)
    splits, _ = split_users(movielens, cfg.data)
    arms = _ranker_arms(cfg, movielens, splits)
    bootstrap, _ = ranker_training_sequences(cfg, None)
    assert bootstrap == interactions_to_date(cfg, splits, cfg.sim.start_month)
    for month in ("2026-01", "2026-02", "2026-02"):  # the second 2026-02 is a rerun
        simulate_month(cfg, month, arms, dataset=movielens, splits=splits)
        out = ingest_and_validate(cfg, month)
        assert out.interactions == sum(min(2, max(len(s.update) - 2 * Month(month).minus("2026-01"), 0))
                                       for s in splits)
        with open_warehouse(cfg, read_only=True) as wh:
            clicks = wh.run("clicks_to_date", month=month)
        seqs, months = ranker_training_sequences(cfg, month)
        expected = interactions_to_date(cfg, splits, Month(month).next())
        for u, i in zip(clicks.column("user_id").to_pylist(), clicks.column("item_id").to_pylist()):
            expected[u].append(i)
        assert seqs == expected and months == ["2026-01", "2026-02"][: Month(month).minus("2026-01") + 1]


def test_click_rates_follow_the_model_on_simulated_traffic(make_cfg, movielens):
    """Exposures of the true next item are clicked at about click_next, all others far less often."""
    from abpo.data.splits import split_users
    from abpo.sim.simulator import month_requests, simulate_month

    cfg = make_cfg(*SMALL, "data.max_users=0", "sim.click_next=0.9", "sim.click_soon=0.0", "sim.click_base=0.0",
               "sim.click_taste=0.0")
    splits, _ = split_users(movielens, cfg.data)
    arms = _ranker_arms(cfg, movielens, splits)
    res = simulate_month(cfg, "2026-01", arms, dataset=movielens, splits=splits, write=False)
    t = res.table.to_pydict()
    reqs = {r.request_id: r for r in month_requests(cfg, movielens, splits, "2026-01")}
    hit = [reqs[rid].next_item == item for rid, item in zip(t["request_id"], t["item_id"])]
    clicks = np.asarray(t["clicked"])
    hit = np.asarray(hit)
    assert len(set(t["request_id"])) == len(reqs) and hit.sum() > 30
    assert clicks[~hit].sum() == 0
    rate = clicks[hit].mean()
    assert abs(rate - 0.9) < 3 * np.sqrt(0.9 * 0.1 / hit.sum()) + 1e-9
