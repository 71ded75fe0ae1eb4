"""The simulator: stable arm assignment matching the shares, the click model as documented, non-overlapping monthly
windows that never touch the held-out target, and a landed month that passes the contract and ingests clean."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ranker_arms import popularity_served_arms
from tests.sizes import SIXTY_USERS


def test_assignment_is_stable_and_matches_the_shares():
    from scipy.stats import chisquare

    from abpo.abtest.assignment import assign_users, check_shares

    shares = check_shares(
        {"abpo": 0.43, "grpo": 0.25, "ml_retrain": 0.18, "popularity": 0.14},
        ["abpo", "grpo", "ml_retrain", "popularity"],
    )
    users = list(range(1, 20001))
    a = assign_users(users, "salt-1", shares)
    assert a == assign_users(list(reversed(users)), "salt-1", shares)  # stable, order-free
    counts = [sum(1 for v in a.values() if v == arm) for arm in shares]
    expected = [len(users) * s for s in shares.values()]
    assert chisquare(counts, expected).pvalue > 0.001
    b = assign_users(users, "salt-2", shares)
    assert 0.5 < np.mean([a[u] != b[u] for u in users]) < 0.8  # a new salt reshuffles (1 - sum s^2 = 0.69)


def test_shares_are_checked():
    from abpo.abtest.assignment import check_shares

    with pytest.raises(ValueError, match="no share for arm"):
        check_shares({"abpo": 1.0}, ["abpo", "grpo"])
    with pytest.raises(ValueError, match="sum to"):
        check_shares({"abpo": 0.5, "grpo": 0.4}, ["abpo", "grpo"])


def test_click_model_responds_as_documented():
    from abpo.config.sim import SimConfig
    from abpo.sim.clicks import boost, click_probability

    c = SimConfig(click_next=0.7, click_soon=0.35, soon_horizon=2)
    assert boost(6, 6, [4], c) == 0.7 and boost(4, 6, [4], c) == 0.35 and boost(5, 6, [4], c) == 0.0
    assert click_probability(0.0, 6, 6, [4], c) == pytest.approx(0.7)  # the true next item
    assert click_probability(0.2, 6, 6, [4], c) == pytest.approx(1 - 0.8 * 0.3)  # noisy-or with the preference
    assert click_probability(0.2, 4, 6, [4], c) == pytest.approx(1 - 0.8 * 0.65)  # among the next few
    assert click_probability(0.2, 5, 6, [4], c) == pytest.approx(0.2)  # any other item: its preference only


def test_the_offline_construction_keeps_months_consecutive_and_the_target_held_out(make_cfg, movielens):
    from abpo.data.splits import split_users
    from abpo.sim.simulator import month_requests

    cfg = make_cfg(*SIXTY_USERS, "sim.candidates=offline")
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
    # 6 update steps / 2 per month = 3 windows: month 4 wraps around to window 0 (positions T, T+1 again), its
    # request ids marked with the lap so they stay unique in the warehouse
    first = {(r.user_id, r.step): r for r in month_requests(cfg, movielens, splits, "2026-01")}
    wrapped = month_requests(cfg, movielens, splits, "2026-04")
    assert len(wrapped) == len(first)
    for r in wrapped:
        f = first[(r.user_id, r.step)]
        assert (r.history, r.next_item, r.candidates, r.offset) == (f.history, f.next_item, f.candidates, f.offset)
        assert r.request_id == f.request_id + "@1" and r.request_id not in seen
    assert {r.request_id for r in month_requests(cfg, movielens, splits, "2026-07")} == {
        f.request_id + "@2" for f in first.values()
    }
    with pytest.raises(ValueError, match="a month at or after sim.start_month"):
        month_requests(cfg, movielens, splits, "2025-12")
    with pytest.raises(ValueError, match="data.update_steps // sim.window >= 1"):
        month_requests(
            make_cfg(*SIXTY_USERS, "sim.candidates=offline", "sim.window=7", "sim.requests_per_user=7"),
            movielens,
            splits,
            "2026-01",
        )
    with pytest.raises(ValueError, match="sim.requests_per_user = 3 with sim.candidates = offline"):
        month_requests(
            make_cfg(*SIXTY_USERS, "sim.candidates=offline", "sim.requests_per_user=3"), movielens, splits, "2026-01"
        )


def test_retrieval_candidates_force_nothing_in_and_follow_the_mix(make_cfg, movielens):
    """The default candidates come from the retrieval stage: the true next item only when found (so some sets
    lack it), never an item of the history or the held-out target, M distinct items; requests_per_user requests
    per user spread over the month's window; the same on a rerun."""
    from abpo.data.splits import split_users
    from abpo.sim.simulator import interactions_to_date, month_requests

    cfg = make_cfg(*SIXTY_USERS, "sim.requests_per_user=3", "sim.candidate_count=15")
    splits, _ = split_users(movielens, cfg.data)
    by_user = {s.user_id: s for s in splits}
    for i, m in enumerate(["2026-01", "2026-02", "2026-03"]):
        reqs = month_requests(cfg, movielens, splits, m)
        assert reqs == month_requests(cfg, movielens, splits, m)  # seeded
        assert len(reqs) == 3 * len(splits) and len({r.request_id for r in reqs}) == len(reqs)
        found = 0
        for r in reqs:
            s = by_user[r.user_id]
            T = len(s.history)
            assert len(r.candidates) == len(set(r.candidates)) == 15
            assert not set(r.candidates) & set(r.history) and s.target not in r.candidates
            assert len(r.history) == T + 2 * i + r.offset and r.offset == r.step * 2 // 3  # slots 0,1,2 -> 0,0,1
            assert r.next_item == s.sequence[len(r.history)]
            found += r.next_item in r.candidates
        assert 0 < found < len(reqs)  # found sometimes, never forced
    # the retrieval model sees the interactions to date only: month 2 does not change when month 3 does
    cfg1 = make_cfg(*SIXTY_USERS)
    late = [type(s)(s.user_id, s.history, [*s.update[:4], *reversed(s.update[4:])], s.target) for s in splits]
    assert interactions_to_date(cfg1, late, "2026-02") == interactions_to_date(cfg1, splits, "2026-02")
    first = [(r.history, r.candidates) for r in month_requests(cfg1, movielens, splits, "2026-02")]
    assert first == [(r.history, r.candidates) for r in month_requests(cfg1, movielens, late, "2026-02")]


def test_retrieval_mix_and_draws():
    from abpo.sim.retrieval import CooccurrenceRetrieval, mix_counts, retrieve_candidates

    assert mix_counts(20, 0.5, 0.3) == (10, 6, 4) and mix_counts(20, 0.0, 0.0) == (0, 0, 20)
    with pytest.raises(ValueError, match="sum <= 1"):
        mix_counts(20, 0.7, 0.5)
    items = list(range(1, 101))
    r = CooccurrenceRetrieval(window=1, recent=2).fit({1: [1, 2, 3], 2: [2, 3, 4], 3: [3, 5]}, items)
    assert r.scores([9, 3])[[1, 3, 4]].tolist() == [2.0, 1.0, 1.0]  # items 2, 4, 5 co-occur with 3 (2 twice)
    popularity = np.zeros(100)
    popularity[[49, 59]] = 1000.0  # items 50 and 60 are the popular ones
    got = retrieve_candidates(
        [3], retrieval=r, popularity=popularity, counts=(2, 2, 4), rng=np.random.default_rng(0), exclude=[4]
    )
    assert len(got) == len(set(got)) == 8 and 3 not in got and 4 not in got
    assert {2, 5} <= set(got) and {50, 60} <= set(got)  # the top co-occurring and the two popular items
    # a share that runs dry is filled by the next kind: only 3 items co-occur with 3 but 5 are asked
    got = retrieve_candidates([3], retrieval=r, popularity=popularity, counts=(5, 0, 0), rng=np.random.default_rng(1))
    assert len(got) == 5 and {2, 4, 5} <= set(got)
    with pytest.raises(ValueError, match="at least sim.candidate_count"):
        retrieve_candidates(
            items[:95], retrieval=r, popularity=popularity, counts=(2, 2, 4), rng=np.random.default_rng(0)
        )


def test_interactions_to_date_grow_by_the_earlier_windows_only(make_cfg, movielens):
    from abpo.data.splits import split_users
    from abpo.sim.simulator import interactions_to_date

    cfg = make_cfg(*SIXTY_USERS)
    splits, _ = split_users(movielens, cfg.data)
    s = splits[0]
    assert interactions_to_date(cfg, splits, "2026-01")[s.user_id] == s.history
    assert interactions_to_date(cfg, splits, "2026-03")[s.user_id] == [*s.history, *s.update[:4]]
    # 3 windows: months 4 and 5 (indices 3, 4) wrap around to windows 0 and 1, landing those items again
    assert interactions_to_date(cfg, splits, "2026-06")[s.user_id] == [*s.history, *s.update[:6], *s.update[:4]]


def test_simulated_month_passes_the_contract_and_ingests_clean(make_cfg, movielens):
    from abpo.data.splits import split_users
    from abpo.sim.simulator import simulate_month
    from abpo.validation import validate_month
    from abpo.warehouse import Warehouse

    cfg = make_cfg(*SIXTY_USERS)
    splits, _ = split_users(movielens, cfg.data)
    arms = popularity_served_arms(cfg, movielens, splits)
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
    from abpo.monthly.ingest import ingest
    from abpo.monthly.refit import ranker_training_sequences
    from abpo.months import Month
    from abpo.sim.simulator import interactions_to_date, simulate_month
    from abpo.warehouse import open_warehouse

    cfg = make_cfg(*SIXTY_USERS)
    splits, _ = split_users(movielens, cfg.data)
    arms = popularity_served_arms(cfg, movielens, splits)
    bootstrap, _ = ranker_training_sequences(cfg, None)
    assert bootstrap == interactions_to_date(cfg, splits, cfg.sim.start_month)
    for month in ("2026-01", "2026-02", "2026-02"):  # the second 2026-02 is a rerun
        simulate_month(cfg, month, arms, dataset=movielens, splits=splits)
        out = ingest(cfg, month)
        assert out.interactions == sum(
            min(2, max(len(s.update) - 2 * Month(month).minus("2026-01"), 0)) for s in splits
        )
        with open_warehouse(cfg, read_only=True) as wh:
            clicks = wh.run("clicks_to_date", month=month)
        seqs, months = ranker_training_sequences(cfg, month)
        expected = interactions_to_date(cfg, splits, Month(month).next())
        for u, i in zip(clicks.column("user_id").to_pylist(), clicks.column("item_id").to_pylist()):
            expected[u].append(i)
        assert seqs == expected and months == ["2026-01", "2026-02"][: Month(month).minus("2026-01") + 1]


def test_months_beyond_the_windows_wrap_around_with_fresh_draws(make_cfg, movielens):
    """data.update_steps // sim.window = 2 windows: months 3 and 4 (2026-03, 2026-04) reuse windows 0 and 1, the
    data split unchanged. The same user positions recur (the requests' histories and next items), the month's draws
    are fresh (other retrieval candidates and clicks), the landed month passes the contract and ingests clean, and
    the warehouse's interactions to date still equal what the simulator says users consumed."""
    from abpo.data.splits import split_users
    from abpo.monthly.ingest import ingest
    from abpo.monthly.refit import ranker_training_sequences
    from abpo.months import Month
    from abpo.sim.simulator import interactions_to_date, months_available, simulate_month
    from abpo.warehouse import open_warehouse

    cfg = make_cfg("data.max_users=60", "data.update_steps=4")
    assert months_available(cfg) == 2
    splits, _ = split_users(movielens, cfg.data)
    assert split_users(movielens, make_cfg("data.max_users=60", "data.update_steps=4").data)[0] == splits
    arms = popularity_served_arms(cfg, movielens, splits)
    tables = {}
    for month in ("2026-01", "2026-02", "2026-03", "2026-04"):
        res = simulate_month(cfg, month, arms, dataset=movielens, splits=splits)
        tables[month] = res.table.to_pylist()
        out = ingest(cfg, month)
        assert out.interactions == sum(min(2, len(s.update)) for s in splits)
        with open_warehouse(cfg, read_only=True) as wh:
            clicks = wh.run("clicks_to_date", month=month)
        seqs, _ = ranker_training_sequences(cfg, month)
        expected = interactions_to_date(cfg, splits, Month(month).next())
        for u, i in zip(clicks.column("user_id").to_pylist(), clicks.column("item_id").to_pylist()):
            expected[u].append(i)
        assert seqs == expected
    for a, b in (("2026-01", "2026-03"), ("2026-02", "2026-04")):
        assert [r["history"] for r in tables[a]] == [r["history"] for r in tables[b]]  # the same positions
        assert not {r["request_id"] for r in tables[a]} & {r["request_id"] for r in tables[b]}
        assert [r["candidates"] for r in tables[a]] != [r["candidates"] for r in tables[b]]  # fresh draws
        assert [r["clicked"] for r in tables[a]] != [r["clicked"] for r in tables[b]]


def test_click_rates_follow_the_model_on_simulated_traffic(make_cfg, movielens):
    """Exposures of the true next item are clicked at about click_next, all others never (no preference clicks)."""
    from abpo.data.splits import split_users
    from abpo.sim.simulator import month_requests, simulate_month

    cfg = make_cfg(
        *SIXTY_USERS,
        "data.max_users=0",
        "sim.candidates=offline",
        "sim.click_next=0.9",
        "sim.click_soon=0.0",
        "sim.base_ctr=0.0",
    )
    splits, _ = split_users(movielens, cfg.data)
    arms = popularity_served_arms(cfg, movielens, splits)
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


class UniformArm:
    """A logging policy that exposes a uniformly random candidate: the calibration's reference arm."""

    name = "uniform"
    model_version = "1"
    logging_policy = "uniform"

    def propensities(self, requests):
        return [np.full(len(c), 1.0 / len(c)) for _, _, c in requests]


@pytest.mark.parametrize(
    ("base_ctr", "oracle"), [(0.05, "mixture"), (0.15, "mixture"), (0.05, "sequential"), (0.05, "replay")]
)
def test_a_uniform_arm_observes_the_configured_base_ctr(make_cfg, movielens, base_ctr, oracle):
    """Calibration: without the next-item boosts, a uniformly random exposure's CTR is within 3 standard errors of
    sim.base_ctr, under the default mixture oracle, a pure one and the replay truth."""
    from abpo.data.splits import split_users
    from abpo.sim.simulator import simulate_month

    cfg = make_cfg(
        "data.max_users=0",
        "data.update_steps=6",
        "sim.requests_per_user=4",
        "sim.click_next=0",
        "sim.click_soon=0",
        f"sim.base_ctr={base_ctr}",
        "report.arm_shares={uniform: 1.0}",
        f"sim.oracle={oracle}",
    )
    splits, _ = split_users(movielens, cfg.data)
    res = simulate_month(cfg, "2026-02", {"uniform": UniformArm()}, dataset=movielens, splits=splits, write=False)
    clicks = np.asarray(res.table.column("clicked").to_pylist())
    se = np.sqrt(base_ctr * (1 - base_ctr) / len(clicks))
    assert len(clicks) == 4 * len(splits)
    assert abs(clicks.mean() - base_ctr) < 3 * se, (clicks.mean(), base_ctr, se)
    assert res.calibration["base_ctr"] == base_ctr and np.isfinite(res.calibration["intercept"])


def test_the_ground_truth_sees_the_future_and_no_arm_sees_it(make_cfg, movielens):
    """The oracle is fitted on every interaction, held-out targets included (so a user's future shapes their
    clicks), and nothing an arm receives depends on it: the requests (history, candidates) are the same whatever
    the oracle, and only abpo.sim imports abpo.sim.preference or abpo.sim.oracles (the import-linter contract,
    checked here too)."""
    import ast
    import dataclasses
    from pathlib import Path

    from abpo.data.splits import split_users
    from abpo.sim.simulator import ground_truth, month_requests

    cfg = make_cfg(*SIXTY_USERS, "sim.oracle_weights={knn: 1, sequential: 1, als: 1}")
    splits, _ = split_users(movielens, cfg.data)
    oracle = ground_truth(cfg, movielens)
    assert cfg.sim.oracle == "mixture" and set(oracle.weights) == {"knn", "sequential", "als"}
    s = splits[0]
    items = movielens.item_ids().tolist()
    before = s.sequence[: len(s.history) + len(s.update)]  # the history at the held-out target's request
    for name in ("mixture", "knn", "sequential", "als"):
        one = ground_truth(dataclasses.replace(cfg, sim=dataclasses.replace(cfg.sim, oracle=name)), movielens)
        z = one.z(s.user_id, items, history=before)
        assert z[items.index(s.target)] > np.quantile(z, 0.9), name  # the future item is liked
    # without the users' last items the ground truth differs, the arms' requests do not
    past = dataclasses.replace(
        movielens, sequences={u: seq[:-3] for u, seq in movielens.sequences.items()}, name=movielens.name + ":past"
    )
    other = ground_truth(cfg, past)
    assert not np.allclose(
        other.z(s.user_id, [s.target], history=before), oracle.z(s.user_id, [s.target], history=before)
    )
    reqs = month_requests(cfg, movielens, splits, "2026-02")
    assert all(
        set(vars(r)) == {"request_id", "user_id", "history", "candidates", "next_item", "soon", "step", "offset"}
        for r in reqs[:5]
    )
    root = Path(__file__).resolve().parents[2]
    importers = []
    for path in [
        *root.joinpath("abpo").rglob("*.py"),
        *root.joinpath("dags").rglob("*.py"),
        *root.joinpath("plugins").rglob("*.py"),
    ]:
        if path.parent.name == "sim" and path.parent.parent.name == "abpo":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            if any(n.startswith(("abpo.sim.preference", "abpo.sim.oracles")) for n in names):
                importers.append(str(path.relative_to(root)))
    assert importers == []


class SpyArm(UniformArm):
    """The uniform arm that records what it was asked: an arm's whole view of a request."""

    def __init__(self):
        self.seen = []

    def propensities(self, requests):
        self.seen.extend(requests)
        return super().propensities(requests)


def test_arms_receive_user_history_candidates_only_and_clicks_are_seeded(make_cfg, movielens):
    """Whatever the oracle, an arm receives the same (user, history, candidates) triples and nothing else, and
    exposes the same items; the oracle changes only the clicks, which are the same on a rerun (seeded)."""
    from abpo.data.splits import split_users
    from abpo.sim.simulator import month_requests, simulate_month

    shares = "report.arm_shares={uniform: 1.0}"
    runs = {}
    for oracle in ("mixture", "als", "knn", "sequential", "mixture"):
        cfg = make_cfg(*SIXTY_USERS, shares, f"sim.oracle={oracle}")
        splits, _ = split_users(movielens, cfg.data)
        spy = SpyArm()
        res = simulate_month(cfg, "2026-02", {"uniform": spy}, dataset=movielens, splits=splits, write=False)
        t = res.table.to_pydict()
        if oracle in runs:  # the rerun: the same clicks
            assert t["clicked"] == runs[oracle][1]["clicked"]
        runs[oracle] = (spy.seen, t)
    reqs = month_requests(cfg, movielens, splits, "2026-02")
    expected = [(r.user_id, r.history, r.candidates) for r in reqs]
    for oracle, (seen, t) in runs.items():
        assert all(isinstance(x, tuple) and len(x) == 3 for x in seen), oracle
        assert sorted(seen) == sorted(expected), oracle
        assert t["item_id"] == runs["als"][1]["item_id"] and t["propensity"] == runs["als"][1]["propensity"]
    clicks = {o: runs[o][1]["clicked"] for o in runs}
    assert len({tuple(c) for c in clicks.values()}) == 4  # each oracle clicks its own way


def test_click_probabilities_for_offline_logs_follow_the_click_model(make_cfg, movielens):
    """abpo.sim.simulator.click_probabilities (the experiment's simulator clicks): the preference link is calibrated
    on the requests' candidates to mean sim.base_ctr, the next item gets at least click_next, a soon item at least
    click_soon, and soon_items never reaches the held-out target."""
    from abpo.data.splits import split_users
    from abpo.sim.simulator import click_probabilities, month_requests, soon_items

    cfg = make_cfg(
        *SIXTY_USERS, "sim.candidates=offline", "sim.base_ctr=0.1", "sim.click_next=0.7", "sim.click_soon=0.3"
    )
    splits, _ = split_users(movielens, cfg.data)
    reqs = month_requests(cfg, movielens, splits, "2026-01")
    by_user = {s.user_id: s for s in splits}
    for r in reqs:
        assert soon_items(cfg, by_user[r.user_id], len(r.history)) == r.soon
    others = [
        (r.user_id, r.history, r.candidates, c, r.next_item, []) for r in reqs for c in r.candidates if c != r.next_item
    ]
    p_other, b0 = click_probabilities(
        cfg, movielens, [(r.user_id, r.history, r.candidates, c, r.next_item, []) for r in reqs for c in r.candidates]
    )
    # mean P_pref is calibrated to 0.1; the next item (1 of M) adds 0.7 (1 - P_pref(next)) / M, less than 0.7 / M
    # since the oracle, scoring against the request's history, tends to like the true next item
    m = len(reqs[0].candidates)
    assert np.isfinite(b0) and 0.1 + 0.005 < p_other.mean() < 0.1 + 0.7 / m + 0.005
    p_next, _ = click_probabilities(
        cfg, movielens, [(r.user_id, r.history, r.candidates, r.next_item, r.next_item, r.soon) for r in reqs]
    )
    assert (p_next >= 0.7).all() and (p_next < 1).all()
    p_plain, _ = click_probabilities(cfg, movielens, others)
    assert 0 < p_plain.min() and p_plain.max() < 1 and p_plain.std() > 0  # preference only: it varies by item
    assert click_probabilities(cfg, movielens, [])[0].size == 0


def test_a_replicate_draws_its_own_traffic_and_assignment_and_replicate_0_is_the_series(make_cfg, movielens):
    """sim.replicate r >= 1 (abpo loop-experiment): users are assigned with the salt '<sim.salt>/replicate-<r>' and
    the candidates, exposures and clicks come from generators keyed by it, the same on a rerun; replicate 0 is the
    series with the keys it always had (the plain sim.salt, no salt in the draws)."""
    from abpo.abtest.assignment import assign_users
    from abpo.data.splits import split_users
    from abpo.sim.simulator import month_requests, series_entropy, series_salt, simulate_month

    two = "report.arm_shares={a: 0.5, b: 0.5}"
    base, r1, r2 = (make_cfg(*SIXTY_USERS, two, f"sim.replicate={r}") for r in (0, 1, 2))
    assert series_salt(base) == base.sim.salt and series_entropy(base) == []
    assert series_salt(r1) == f"{base.sim.salt}/replicate-1" and series_entropy(r1) != series_entropy(r2)
    splits, _ = split_users(movielens, base.data)
    users = [s.user_id for s in splits]
    runs = {}
    for name, cfg in (("base", base), ("r1", r1), ("r2", r2), ("r1 again", r1)):
        res = simulate_month(
            cfg, "2026-02", {"a": UniformArm(), "b": UniformArm()}, dataset=movielens, splits=splits, write=False
        )
        t = res.table.to_pydict()
        assert {int(u): a for u, a in zip(t["user_id"], t["arm"])} == assign_users(
            users, series_salt(cfg), {"a": 0.5, "b": 0.5}
        )
        runs[name] = (t, [(r.request_id, r.candidates) for r in month_requests(cfg, movielens, splits, "2026-02")])
    assert runs["r1"] == runs["r1 again"]  # seeded
    for x, y in (("base", "r1"), ("r1", "r2"), ("base", "r2")):
        (tx, cx), (ty, cy) = runs[x], runs[y]
        assert [r for r, _ in cx] == [r for r, _ in cy]  # the same requests (users, positions) ...
        assert cx != cy  # ... with other retrieval candidates
        assert tx["arm"] != ty["arm"] and tx["clicked"] != ty["clicked"]  # another assignment, other clicks
    # replicate 0's keys are the ones the series always had: its exposure uniforms come from
    # default_rng([seed, month key, stream]) exactly as before replicates existed
    from abpo.sim import simulator

    assert (
        simulator._uniforms(0, "2026-02", 1, 3).tolist()
        == np.random.default_rng([0, simulator._month_key("2026-02"), 1]).random(3).tolist()
    )
    with pytest.raises(ValueError, match=r"sim.replicate -1: rule: >= 0"):
        make_cfg(*SIXTY_USERS, "sim.replicate=-1")


def test_an_arm_without_requests_this_month_has_no_ctr_and_the_result_is_json(make_cfg, movielens):
    """A small share of few users can leave an arm without a request in a month (the demo's 4 % arms on a 40-user
    test config): its CTR is None, not NaN, so the serve task's XCom (JSON, which refuses NaN) carries the month."""
    import json

    from abpo.data.splits import split_users
    from abpo.sim.simulator import simulate_month

    cfg = make_cfg(*SIXTY_USERS, "report.arm_shares={uniform: 0.999, idle: 0.001}")
    splits, _ = split_users(movielens, cfg.data)
    arms = {"uniform": UniformArm(), "idle": UniformArm()}
    res = simulate_month(cfg, "2026-01", arms, dataset=movielens, splits=splits, write=False)
    assert res.per_arm["idle"]["impressions"] == 0 and res.per_arm["idle"]["ctr"] is None
    assert res.per_arm["uniform"]["ctr"] is not None
    json.dumps(res.per_arm, allow_nan=False)
